"""Whether each node's user can sudo the way this run will: `sudo -n`, or with the
password from --ask-sudo-pass, tried once per node before anything runs under it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host
from gpucluster.remote.connection import CHECK_SUDO_PASSWORD, password_line
from gpucluster.remote.session import Session

CHECK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SudoRefusal:
    """The nodes whose user cannot sudo, in the words of a one-line error."""

    user: str  # the first such node's
    nodes: str  # folded: node[1-3]
    said: str  # sudo's last words there


def sudo_refusal(session: Session, hosts: Sequence[Host]) -> SudoRefusal | None:
    """None when every node's user (not root) can sudo. With a password, one wrong try
    is all a node sees: sudo -A, which every later command uses, asks up to three times,
    and three failures can lock the account (pam_faillock). A node that does not answer
    is not a refusal: the work that follows reports it."""
    users = [h for h in hosts if h.user != "root"]
    if not users:
        return None
    password = session.options.sudo_password
    command = "sudo -n true" if password is None else CHECK_SUDO_PASSWORD
    stdin = None if password is None else password_line(password)
    answers = session.map(users, lambda c: c.run(command, timeout=CHECK_TIMEOUT_S,
                                                  stdin=stdin))
    refused = {name: answer.last_word for name, answer in answers.values.items()
               if not answer.ok}
    if not refused:
        return None
    first = sorted(refused)[0]
    return SudoRefusal(next(h.user for h in users if h.name == first),
                       hostrange.fold(sorted(refused)), refused[first])


def require_sudo_password(session: Session, hosts: Sequence[Host], command: str,
                          nothing_done: str) -> None:
    """The --ask-sudo-pass password tried once per node before anything runs under it:
    a wrong one would be tried three times by every later sudo -A, and lock the account
    (pam_faillock). `nothing_done` opens the error: "nothing ran", "reap ended nothing".
    Without a password, nothing to try."""
    if session.options.sudo_password is None:
        return
    refused = sudo_refusal(session, hosts)
    if refused is not None:
        raise GpuclusterError(
            f"{nothing_done}: sudo refused {refused.user}'s password on {refused.nodes} "
            f"({refused.said}; tried once per node) (fix: {command} --ask-sudo-pass again "
            f"with {refused.user}'s sudo password there)")
