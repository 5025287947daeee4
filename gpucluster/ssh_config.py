"""Resolve host aliases through the user's OpenSSH client config (~/.ssh/config)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from gpucluster.numerals import is_number

DEFAULT_SSH_CONFIG = "~/.ssh/config"
# paramiko imports invoke (Fabric's task runner, one of its dependencies) as it is itself
# imported: about 0.1 s of every command's start-up, for one use: `Match exec` lines.
_MATCH_EXEC = re.compile(r"^\s*match\s.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def leave_out_invoke() -> None:
    """From now on, an import of invoke fails (paramiko then goes without it), until an
    ssh config with a `Match exec` line is read. Called as the CLI starts."""
    if "paramiko" not in sys.modules and "invoke" not in sys.modules:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # import -> ImportError


def _let_in_invoke() -> None:
    if "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]


@dataclass(frozen=True)
class SshConfigEntry:
    """What ~/.ssh/config says about one alias; None where it says nothing."""

    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    identity_files: tuple[str, ...] = ()  # every IdentityFile, in order (OpenSSH tries all)
    proxy_command: str | None = None  # tokens (%h, %p, %r) already expanded
    connect_timeout: float | None = None


class SshConfig:
    """A parsed ssh_config file; an absent file resolves nothing."""

    def __init__(self, path: str = DEFAULT_SSH_CONFIG) -> None:
        self.path = Path(path).expanduser()
        self._config = None
        if self.path.is_file():
            text = self.path.read_text(encoding="utf-8", errors="replace")
            if _MATCH_EXEC.search(text):  # before paramiko's first import, which tries it
                _let_in_invoke()
            import paramiko  # lazy: keeps `gpucluster --help` fast

            self._config = paramiko.SSHConfig.from_text(text)

    def lookup(self, alias: str) -> SshConfigEntry:
        if self._config is None:
            return SshConfigEntry()
        found = self._config.lookup(alias)
        hostname = found.get("hostname")
        identity = found.get("identityfile")
        port = found.get("port")
        timeout = str(found.get("connecttimeout", ""))
        proxy_command = found.get("proxycommand")
        return SshConfigEntry(
            hostname=hostname if hostname and hostname != alias else None,
            user=found.get("user"),
            port=int(port) if port and is_number(str(port)) else None,
            identity_file=identity[0] if identity else None,
            proxy_jump=found.get("proxyjump"),
            identity_files=tuple(identity or ()),
            proxy_command=None if proxy_command in (None, "none") else str(proxy_command),
            connect_timeout=float(timeout) if is_number(timeout) and int(timeout) > 0 else None,
        )
