"""One host's final settings: its own keys, then what ~/.ssh/config says for it, then
the inventory's defaults, then the built-in defaults."""

from __future__ import annotations

from typing import Any

from gpucluster.inventory.model import Host
from gpucluster.ssh_config import SshConfig, SshConfigEntry

LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})


def resolve_host(name: str, address: str | None, fields: dict[str, Any],
                  defaults: dict[str, Any], ssh_config: SshConfig, line: int) -> Host:
    """Explicit host values win, then ~/.ssh/config, then inventory defaults."""
    alias = address or name
    from_config = ssh_config.lookup(alias)

    def pick(key: str, configured: Any, fallback: Any = None) -> Any:
        if key in fields:
            return fields[key]
        if configured is not None:
            return configured
        return defaults.get(key, fallback)

    resolved_address = from_config.hostname or alias
    connection = fields.get("connection", defaults.get("connection", "auto"))
    if connection == "auto":
        connection = "local" if _bare_loopback(alias, fields, defaults, from_config) else "ssh"
    return Host(
        name=name,
        address=resolved_address,
        user=pick("user", from_config.user, _current_user()),
        port=pick("port", from_config.port, 22),
        identity_file=pick("identity_file", from_config.identity_file),
        identity_files=_identity_files(fields, defaults, from_config),
        proxy_command=None if "jump_host" in fields else from_config.proxy_command,
        connect_timeout=from_config.connect_timeout,
        jump_host=pick("jump_host", from_config.proxy_jump),
        labels={**defaults.get("labels", {}), **fields.get("labels", {})},
        gpus=fields.get("gpus", defaults.get("gpus")),
        gpu_model=fields.get("gpu_model", defaults.get("gpu_model")),
        groups=tuple(fields.get("groups", defaults.get("groups", ()))),
        connection=connection,
        torch_device=fields.get("torch_device", defaults.get("torch_device", "cuda")),
        spare=fields.get("spare", False),
        line=line,
    )


def _identity_files(fields: dict[str, Any], defaults: dict[str, Any],
                    from_config: SshConfigEntry) -> tuple[str, ...]:
    """The inventory's key alone when it names one; else every IdentityFile of the
    ssh config, in order, as OpenSSH tries them."""
    chosen = fields.get("identity_file", defaults.get("identity_file"))
    if chosen is not None or "identity_file" in fields:
        return (chosen,) if chosen else ()
    return from_config.identity_files


def _bare_loopback(alias: str, fields: dict[str, Any], defaults: dict[str, Any],
                   from_config: SshConfigEntry) -> bool:
    """`auto` means this machine only for a loopback name written as such, with no port,
    user, key or jump host set anywhere. A tunnel (`ssh -L 2222:gpu1:22`, then
    127.0.0.1 port 2222) or an ssh_config alias whose HostName is 127.0.0.1 is another
    machine: provision must never change this one's firewall or /etc/hosts for it."""
    if alias not in LOCAL_ADDRESSES or from_config.hostname is not None:
        return False
    keys = ("port", "user", "identity_file", "jump_host")
    if any(key in fields or key in defaults for key in keys):
        return False
    return all(value is None for value in (from_config.port, from_config.user,
                                           from_config.identity_file, from_config.proxy_jump,
                                           from_config.proxy_command))


def _current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"
