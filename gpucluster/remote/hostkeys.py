"""Host key verification against known_hosts, the way OpenSSH does it.

A known, matching key passes. An unknown host is refused unless the user asked for
trust on first use (`--accept-new-host-keys`, OpenSSH's accept-new), in which case the
key is appended to known_hosts. A changed key is always refused: paramiko raises
BadHostKeyException before any policy is asked, and we never catch it to continue.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.remote.result import FailureKind, RemoteError

if TYPE_CHECKING:
    import paramiko

_append_lock = threading.Lock()  # several hosts may be accepted at once by the fan-out


def fingerprint(key: paramiko.PKey) -> str:
    """SHA256 fingerprint as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name known_hosts uses: `addr` for port 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def append_known_host(path: Path, names: list[str], key: paramiko.PKey) -> None:
    """Append one line; the user's existing lines are never rewritten."""
    line = f"{','.join(names)} {key.get_name()} {key.get_base64()}\n"
    with _append_lock:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        needs_newline = path.exists() and path.stat().st_size > 0 and \
            not path.read_bytes().endswith(b"\n")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(("\n" if needs_newline else "") + line)


SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


def load_known_hosts(target: paramiko.HostKeys, paths: list[Path]) -> frozenset[str]:
    """Add every usable entry of `paths` (missing files are fine) to `target`; return the
    base64 keys marked `@revoked`. `@cert-authority` lines are passed over (paramiko
    cannot check host certificates: such hosts count as unknown), and so is a line that
    does not parse: neither may make every host fail, as paramiko's own loader does."""
    from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

    revoked: set[str] = set()
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as error:
            raise RemoteError(FailureKind.ERROR, f"cannot read {path}: {error.strerror}") from None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@"):
                fields = line.split()
                if fields[0] == "@revoked" and len(fields) >= 4:
                    revoked.add(fields[3])
                continue
            try:
                entry = HostKeyEntry.from_line(line, number)
            except (InvalidHostKey, ValueError, TypeError):
                entry = None
            if entry is not None:
                for name in entry.hostnames:
                    target.add(name, entry.key.get_name(), entry.key)
    return frozenset(revoked)


def refuse_revoked(label: str, key: paramiko.PKey, known_hosts: Path) -> RemoteError:
    return RemoteError(FailureKind.HOST_KEY_CHANGED,
                       f"HOST KEY REVOKED for {label}: it offered {key.get_name()} "
                       f"{fingerprint(key)}, which a @revoked line in {known_hosts} or "
                       f"{SYSTEM_KNOWN_HOSTS} marks as compromised. Refused whatever the "
                       f"flags")


def make_policy(known_hosts: Path, accept_new: bool, label: str,
                revoked: frozenset[str] = frozenset()) -> paramiko.MissingHostKeyPolicy:
    """The policy paramiko asks when a host is missing from known_hosts."""
    import paramiko

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                             key: paramiko.PKey) -> None:
            if key.get_base64() in revoked:  # never recorded, whatever the flags
                raise refuse_revoked(label, key, known_hosts)
            if accept_new:
                append_known_host(known_hosts, [hostname], key)
                return
            raise RemoteError(
                FailureKind.HOST_KEY_UNKNOWN,
                f"unknown host key for {label} ({hostname}, {key.get_name()} "
                f"{fingerprint(key)}); not in {known_hosts}. Verify it, then rerun with "
                f"--accept-new-host-keys to record it",
            )

    return _Policy()


def changed_key_message(label: str, error: paramiko.BadHostKeyException,
                        known_hosts: Path, address: str, port: int) -> str:
    """The loud refusal for a host whose key differs from the recorded one."""
    name = known_hosts_name(address, port)
    return (
        f"HOST KEY CHANGED for {label} ({name}): it offered {error.key.get_name()} "
        f"{fingerprint(error.key)}, but {known_hosts} records {fingerprint(error.expected_key)}. "
        f"Someone may be intercepting the connection (man-in-the-middle), or the host was "
        f"reinstalled. Refused whatever the flags; if you know why it changed, run "
        f"`ssh-keygen -R '{name}' -f {known_hosts}` and connect again"
    )


def refuse_changed(label: str, error: paramiko.BadHostKeyException, known_hosts: Path,
                   address: str, port: int) -> RemoteError:
    return RemoteError(FailureKind.HOST_KEY_CHANGED,
                       changed_key_message(label, error, known_hosts, address, port))
