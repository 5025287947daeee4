"""The ordinary user sandbox nodes are reached as (`sandbox up --user`): its account in
each node's own /etc, its home (one per node, or one for all as an NFS home is), the
controller's key in its authorized_keys, and sudo as asked."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
from pathlib import Path

from gpucluster.errors import SandboxError
from gpucluster.sandbox import system
from gpucluster.sandbox.spec import NodeLogin

FIRST_UID = 2000  # above the distribution's and most sites' own users
SUDOERS_FILE = "sudoers.d/gpucluster-sandbox"
# What the sudo package puts in /etc: a node whose /etc was copied before sudo was
# installed on the host gets these from the host.
SUDO_ETC_FILES = ("sudoers", "sudoers.d/README", "pam.d/sudo", "pam.d/sudo-i")


def home_path(login: NodeLogin) -> Path:
    """The user's home as the nodes see it (a bind target: it must exist on the host)."""
    return Path("/home") / login.user


def choose_uid(login: NodeLogin, previous: int | None) -> int:
    """The host's uid for this name if it has one (files in a shared home then read the
    same here and in the nodes), else the uid chosen before, else the first free one."""
    try:
        return pwd.getpwnam(login.user).pw_uid
    except KeyError:
        pass
    if previous is not None:
        return previous
    taken = {entry.pw_uid for entry in pwd.getpwall()} | _group_ids(Path("/etc/group"))
    uid = FIRST_UID
    while uid in taken:
        uid += 1
    return uid


def _group_ids(group_file: Path) -> set[int]:
    ids = set()
    for line in group_file.read_text(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            ids.add(int(fields[2]))
    return ids


def ensure_account(node_root: Path, login: NodeLogin, uid: int,
                   password_file: Path) -> None:
    """The account in the node's /etc (`node_root`/etc): unlocked for key login (the
    sandbox's sshd has UsePAM no, which refuses a locked account), and its sudo rule."""
    etc = node_root / "etc"
    if not _has_entry(etc / "passwd", login.user):
        if not _has_entry(etc / "group", login.user):
            system.sh("groupadd", "--prefix", str(node_root), "-g", str(uid), login.user)
        system.sh("useradd", "--prefix", str(node_root), "-M", "-u", str(uid), "-g", str(uid),
                  "-s", "/bin/bash", "-d", str(home_path(login)), login.user)
    # '*': no password can log in, yet the account is not locked ('!'), so a key can.
    crypted = _password_hash(password_file) if login.sudo == "password" else "*"
    system.sh("usermod", "--prefix", str(node_root), "-p", crypted, login.user)
    _write_sudo_rule(etc, login)


def _has_entry(database: Path, name: str) -> bool:
    prefix = f"{name}:"
    return any(line.startswith(prefix) for line in database.read_text(errors="replace")
               .splitlines())


def _password_hash(password_file: Path) -> str:
    """A random password (kept in the sandbox's dir, 0600, never printed), crypted."""
    if not password_file.exists():
        system.write_atomically(password_file, secrets.token_urlsafe(18) + "\n", 0o600)
    crypted = system.sh("openssl", "passwd", "-6", "-stdin",
                        stdin=password_file.read_text()).stdout.strip()
    if not crypted.startswith("$6$"):
        raise SandboxError("openssl passwd -6 did not give a SHA-512 crypt hash")
    return crypted


def _write_sudo_rule(etc: Path, login: NodeLogin) -> None:
    rule = etc / SUDOERS_FILE
    if login.sudo == "none":
        rule.unlink(missing_ok=True)
        return
    if shutil.which("sudo") is None:
        raise SandboxError("--sudo needs sudo on this machine: apt-get install -y sudo "
                           "(or --sudo none)")
    for name in SUDO_ETC_FILES:
        if not (etc / name).exists() and Path("/etc", name).exists():
            (etc / name).parent.mkdir(mode=0o755, exist_ok=True)
            shutil.copy2(Path("/etc", name), etc / name)
    tag = "NOPASSWD: " if login.sudo == "nopasswd" else ""
    rule.parent.mkdir(mode=0o755, exist_ok=True)
    system.write_atomically(rule, f"# written by gpucluster sandbox up --sudo {login.sudo}\n"
                                  f"{login.user} ALL=(ALL) {tag}ALL\n", 0o440)


def ensure_home(home: Path, uid: int, controller_key: str) -> None:
    """A home owned by the user with the controller's key authorized (sshd's
    StrictModes: nothing group- or world-writable on the way)."""
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    authorized = ssh / "authorized_keys"
    lines = authorized.read_text().splitlines() if authorized.exists() else []
    if controller_key not in lines:
        system.write_atomically(authorized, "\n".join([*lines, controller_key]) + "\n", 0o600)
    for path in (home, ssh, authorized):
        os.chown(path, uid, uid)
    home.chmod(0o755)
    ssh.chmod(0o700)
