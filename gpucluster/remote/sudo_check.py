"""Whether each node's user can sudo the way this run will: `sudo -n`, or with the
password from --ask-sudo-pass, tried once per node before anything runs under it."""

from __future__ import annotations

from collections.abc import Sequence

from gpucluster.inventory import Host
from gpucluster.remote.connection import CHECK_SUDO_PASSWORD
from gpucluster.remote.session import Session

CHECK_TIMEOUT_S = 30.0


def sudo_refusals(session: Session, hosts: Sequence[Host]) -> dict[str, str]:
    """Per node whose user (not root) cannot sudo: sudo's last words. With a password,
    one wrong try is all a node sees: sudo -A, which every later command uses, asks up
    to three times, and three failures can lock the account (pam_faillock)."""
    users = [h for h in hosts if h.user != "root"]
    if not users:
        return {}
    password = session.options.sudo_password
    command = "sudo -n true" if password is None else CHECK_SUDO_PASSWORD
    stdin = None if password is None else f"{password}\n".encode()
    answers = session.map(users, lambda c: c.run(command, timeout=CHECK_TIMEOUT_S,
                                                  stdin=stdin))
    return {name: answer.last_word for name, answer in answers.values.items()
            if not answer.ok}
