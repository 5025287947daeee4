"""Hosts reached over SSH (paramiko): one kept-open connection per host.

Everything that can go wrong before or while a command runs becomes a RemoteError
with a FailureKind, so the fan-out can report it per host and carry on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.remote import hostkeys
from gpucluster.remote.connection import (
    Envelope,
    LineCallback,
    LineSplitter,
    Stdin,
    build_command,
)
from gpucluster.remote.exit_signal import exit_signal, keep_exit_signals
from gpucluster.remote.result import NO_EXIT_STATUS, CommandResult, FailureKind, RemoteError
from gpucluster.remote.ssh_channel import PID_REPORT, PidFilter, RemoteGroup, feed, pump
from gpucluster.remote.ssh_errors import connect_failure

if TYPE_CHECKING:
    import paramiko

# paramiko logs a failed handshake from its transport thread at ERROR, traceback and all;
# with no handler set up, Python's last resort printed that to stderr beside our own
# one-line report of the same failure (ssh_errors.connect_failure).
logging.getLogger("paramiko").addHandler(logging.NullHandler())
END_GROUP_TIMEOUT_S = 5.0
PID_WAIT_S = 3.0  # how long an interrupted command's pid report may still take

@dataclass(frozen=True)
class SshOptions:
    """How to connect; shared by every host of one CLI invocation."""

    known_hosts: Path
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    keepalive_s: int = 15
    # only from --ask-pass; never logged, printed, or shown in a repr or traceback
    password: str | None = field(default=None, repr=False)
    # only from --ask-sudo-pass, and the same: sent to sudo on stdin, never on a command line
    sudo_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Endpoint:
    """Where to connect: the host itself, or a jump host in front of it."""

    label: str
    address: str
    port: int
    user: str
    identity_file: str | None = None
    identity_files: tuple[str, ...] = ()  # all to try, identity_file first
    proxy_command: str | None = None
    connect_timeout: float | None = None  # this host's, over the run's


class SshConnection:
    """A host over SSH. Connects on first use; `via` is an open jump-host connection."""

    def __init__(self, endpoint: Endpoint, options: SshOptions,
                 via: SshConnection | None = None) -> None:
        self.host = endpoint.label
        self.endpoint = endpoint
        self.options = options
        self.via = via
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._running: set[RemoteGroup] = set()
        self._retired = False
        self._failed: tuple[float, RemoteError] | None = None  # the last attempt's, and when

    # -- connecting

    def connect(self) -> None:
        asked = time.monotonic()
        with self._lock:
            if self._retired:
                raise RemoteError(FailureKind.INTERRUPTED, "the run was interrupted")
            if self._client is not None:
                return
            # A caller that waited here while an attempt failed gets that failure, not a
            # second attempt and a second wait (doctor, the logs and the collection of a
            # bundle connect at once); one that asks later tries again.
            if self._failed is not None and self._failed[0] >= asked:
                raise RemoteError(self._failed[1].kind, self._failed[1].message)
            try:
                self._client = self._open()
            except RemoteError as error:
                self._failed = (time.monotonic(), error)
                raise

    def _open(self) -> paramiko.SSHClient:
        import paramiko

        endpoint, options = self.endpoint, self.options
        client = paramiko.SSHClient()
        # The user's known_hosts and the system's, as OpenSSH reads them.
        revoked = hostkeys.load_known_hosts(
            client.get_host_keys(), [options.known_hosts, hostkeys.SYSTEM_KNOWN_HOSTS])
        client.set_missing_host_key_policy(
            hostkeys.make_policy(options.known_hosts, options.accept_new_host_keys,
                                 endpoint.label, revoked))
        identities = self.identities() or None
        timeout = endpoint.connect_timeout or options.connect_timeout
        try:
            client.connect(
                hostname=endpoint.address,
                port=endpoint.port,
                username=endpoint.user,
                password=options.password,
                # paramiko takes a list (it tries each); its stubs say str only
                key_filename=identities,  # type: ignore[arg-type]
                look_for_keys=identities is None,
                allow_agent=True,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=self._socket(),
            )
        except RemoteError:
            client.close()
            raise
        except BaseException as error:
            client.close()
            raise connect_failure(error, self.endpoint, self.options, self.host) from None
        transport = client.get_transport()
        if transport is not None:
            offered = transport.get_remote_server_key()
            if offered.get_base64() in revoked:  # a known host whose key was revoked since
                client.close()
                raise hostkeys.refuse_revoked(endpoint.label, offered, options.known_hosts)
            transport.set_keepalive(options.keepalive_s)
            keep_exit_signals(transport)
        return client

    def identities(self) -> list[str]:
        """The keys to offer: those that exist, as OpenSSH skips a missing IdentityFile.
        When none does, the first is named (paramiko's own error read like an unreachable
        host: `No such file or directory`)."""
        endpoint = self.endpoint
        keys = [str(Path(k).expanduser()) for k in endpoint.identity_files
                or ((endpoint.identity_file,) if endpoint.identity_file else ())]
        present = [k for k in keys if Path(k).exists()]
        if keys and not present:
            raise RemoteError(FailureKind.AUTH_FAILED,
                              f"identity file {keys[0]} does not exist (fix: set "
                              f"identity_file in the inventory to your private key)")
        return present

    def _socket(self) -> paramiko.Channel | paramiko.ProxyCommand | None:
        """Through the jump host, through ssh_config's ProxyCommand, or direct (None)."""
        if self.via is not None:
            return self._tunnel()
        if self.endpoint.proxy_command:
            import paramiko

            try:
                return paramiko.ProxyCommand(self.endpoint.proxy_command)
            except paramiko.ProxyCommandFailure as error:
                raise RemoteError(FailureKind.UNREACHABLE,
                                  f"ProxyCommand failed: {error}") from None
        return None

    def _tunnel(self) -> paramiko.Channel:
        """A direct-tcpip channel through the jump host to this host's sshd."""
        assert self.via is not None
        self.via.connect()
        transport = self.via.transport()
        try:
            return transport.open_channel(
                "direct-tcpip", (self.endpoint.address, self.endpoint.port), ("127.0.0.1", 0),
                timeout=self.options.connect_timeout)
        except Exception as error:
            raise RemoteError(FailureKind.UNREACHABLE,
                              f"jump host {self.via.host} could not reach "
                              f"{self.endpoint.address}:{self.endpoint.port}: {error}") from None

    def transport(self) -> paramiko.Transport:
        self.connect()
        assert self._client is not None
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(FailureKind.UNREACHABLE, "connection closed")
        return transport

    # -- running

    def run(
        self,
        command: str,
        timeout: float,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        on_line: LineCallback | None = None,
    ) -> CommandResult:

        envelope = build_command(command, env, sudo, is_root=self.endpoint.user == "root",
                                 sudo_password=self.options.sudo_password,
                                 stdin_follows=stdin is not None)
        # Known to end_running() before the command can start on the node: a Ctrl-C
        # between the start and our first read of its output must still end it.
        group = RemoteGroup(sudo and self.endpoint.user != "root")
        with self._lock:
            self._running.add(group)
        try:
            return self._run(command, envelope, group, timeout, stdin, on_line)
        finally:
            with self._lock:
                self._running.discard(group)
            group.reported.set()  # no pid report can come any more: nobody waits for one

    def _run(self, command: str, envelope: Envelope, group: RemoteGroup, timeout: float,
             stdin: Stdin, on_line: LineCallback | None) -> CommandResult:
        import paramiko

        started = time.monotonic()
        deadline = started + timeout
        stalled = threading.Event()
        try:
            channel = self.transport().open_session(timeout=self.options.connect_timeout)
            channel.settimeout(max(0.1, deadline - time.monotonic()))
            # paramiko waits for sshd to start the command without any limit; a hung PAM
            # module or login script would hold this thread for ever.
            limit = min(self.options.connect_timeout, max(0.1, deadline - time.monotonic()))

            def give_up() -> None:
                stalled.set()
                channel.close()
            watchdog = threading.Timer(limit, give_up)
            watchdog.start()
            try:
                # The login shell says its pid first: sshd made it a session and process
                # group leader, so a timeout or Ctrl-C can end all the command started.
                # A shell whose login scripts outlasted the timeout finds the channel
                # closed and must not start a command nobody can end: the write kills it
                # (SIGPIPE), or fails where a login script ignores SIGPIPE (the exit).
                channel.exec_command(f"echo {PID_REPORT} $$ >&2 || exit 1; {envelope.command}")
            finally:
                watchdog.cancel()
        except RemoteError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as error:
            if stalled.is_set():
                raise RemoteError(FailureKind.TIMED_OUT,
                                  f"sshd did not start the command within {limit:g}s (a hung "
                                  f"PAM module or login script on the node?)") from None
            raise RemoteError(FailureKind.UNREACHABLE,
                              f"lost the connection: {error or type(error).__name__}") from None
        try:
            if stdin is not None or envelope.stdin_prefix:
                threading.Thread(target=feed, args=(channel, stdin, envelope.stdin_prefix),
                                 daemon=True).start()
            stdout = LineSplitter("stdout", on_line)
            stderr = LineSplitter("stderr", on_line)
            pid_filter = PidFilter(stderr, group)
            pump(channel, stdout, pid_filter, deadline)
            pid_filter.finish()
            exit_code = channel.recv_exit_status()
        except BaseException:
            self._end_group(group)  # a timeout, a lost channel or Ctrl-C: leave nothing
            raise
        finally:
            channel.close()
        if exit_code == NO_EXIT_STATUS and not channel.get_transport().is_active():
            raise RemoteError(FailureKind.UNREACHABLE, "connection lost while running")
        return CommandResult(self.host, command, exit_code, stdout.finish(), stderr.finish(),
                             time.monotonic() - started, signal=exit_signal(channel))

    def _end_group(self, group: RemoteGroup, wait_for_pid: bool = False) -> None:
        """TERM, then KILL, the process group of a command that did not finish; over a
        fresh channel, bounded, and silent when the connection is gone. A command
        interrupted the moment it started may not have reported its pid yet: with
        `wait_for_pid` (its output is still being read elsewhere), wait a little."""
        if wait_for_pid:
            group.reported.wait(PID_WAIT_S)
        if group.pid is None:
            return
        # `kill -TERM -PGID`, no `--`: dash's kill (the /bin/sh sudo runs) takes
        # `-TERM -- -PGID` for a pid named "-" and kills nothing.
        kill = build_command(f"kill -TERM -{group.pid} 2>/dev/null; sleep 1; "
                             f"kill -KILL -{group.pid} 2>/dev/null; true", None,
                             group.as_root, is_root=False,
                             sudo_password=self.options.sudo_password)
        with contextlib.suppress(Exception):  # best effort: the node may be gone
            client = self._client
            transport = client.get_transport() if client is not None else None
            if transport is None or not transport.is_active():
                return
            channel = transport.open_session(timeout=END_GROUP_TIMEOUT_S)
            channel.exec_command(kill.command)
            if kill.stdin_prefix:  # the sudo password
                channel.sendall(kill.stdin_prefix)
                channel.shutdown_write()
            channel.status_event.wait(END_GROUP_TIMEOUT_S)
            channel.close()

    def end_running(self) -> None:
        """End every command still running here (Ctrl-C), before the connection closes."""
        with self._lock:
            running = list(self._running)
        for group in running:
            self._end_group(group, wait_for_pid=True)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def retire(self) -> None:
        """Close for good: a worker still on its way (say, in the middle of connecting
        when Ctrl-C came) must not open a new connection and start a command nobody will
        end. The session hands out a fresh connection to whoever asks after this."""
        with self._lock:
            self._retired = True
        self.close()
