"""The name of the signal that ended a remote command. sshd reports such an end with
an `exit-signal` request instead of `exit-status` (RFC 4254, 6.10); paramiko drops it
(paramiko#598; a fix, PR #2517, is not merged), which left only "no exit status" where
the OOM killer's SIGKILL or a SIGSEGV was the whole story."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import paramiko

SIGNAL_ATTRIBUTE = "gpucluster_exit_signal"


def keep_exit_signals(transport: paramiko.Transport) -> None:
    """Make this transport's channels keep the signal name of an exit-signal. It goes
    through paramiko's per-message handler table, shadowed on this transport only; a
    paramiko without that table is left as it is (only the name is then lost)."""
    from paramiko.channel import Channel
    from paramiko.common import MSG_CHANNEL_REQUEST

    table = getattr(type(transport), "_channel_handler_table", None)
    default = getattr(Channel, "_handle_request", None)
    if default is None or not isinstance(table, dict) or \
            table.get(MSG_CHANNEL_REQUEST) is not default:
        return  # not the paramiko this was written against
    assert default is not None  # mypy loses the narrowing at the `is not` above
    transport._channel_handler_table = {  # type: ignore[attr-defined]
        **table, MSG_CHANNEL_REQUEST: _keeping_exit_signals(default)}


def _keeping_exit_signals(default: Callable[[Any, Any], None]
                          ) -> Callable[[Any, Any], None]:
    """paramiko's channel-request handler, but for exit-signal, which it would drop."""
    def handle(channel: Any, message: Any) -> None:
        start = message.packet.tell()
        if message.get_text() != "exit-signal":
            message.packet.seek(start)
            default(channel, message)
            return
        message.get_boolean()  # want reply: always false for exit-signal
        setattr(channel, SIGNAL_ATTRIBUTE, message.get_text())
        channel.status_event.set()  # the command has ended, as exit-status would say
    return handle


def exit_signal(channel: paramiko.Channel) -> str | None:
    """`KILL`, `SEGV`...: the signal sshd said ended the channel's command, if one did."""
    name = getattr(channel, SIGNAL_ATTRIBUTE, None)
    return name if isinstance(name, str) and name else None
