"""The inventory: one YAML file -> frozen, validated dataclasses.

Layout of the file (every key is described in inventory.example.yaml):

    cluster:  settings for the whole cluster (rendezvous port, python, env, image...)
    defaults: per-host settings applied to every host unless the host overrides them
    groups:   named selections of hosts, written as host ranges
    hosts:    one entry per host or per host range (`gpu[01-16]`)

Validation collects every problem before raising, so a user fixes a file in one pass.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpucluster import hostrange
from gpucluster.env_names import is_env_name
from gpucluster.errors import GpuclusterError, HostRangeError, InventoryError, Problem
from gpucluster.ssh_config import DEFAULT_SSH_CONFIG, SshConfig
from gpucluster.yaml_lines import LineDict, LineList, load_with_lines

INVENTORY_ENV_VAR = "GPUCLUSTER_INVENTORY"
DEFAULT_INVENTORY = "inventory.yaml"
LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})
_SIMPLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_FILE_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Host:
    """One node, fully resolved: inventory, defaults and ~/.ssh/config merged."""

    name: str
    address: str
    user: str
    port: int = 22
    identity_file: str | None = None
    jump_host: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: int | None = None
    gpu_model: str | None = None
    groups: tuple[str, ...] = ()
    connection: str = "ssh"  # "ssh" or "local"
    torch_device: str = "cuda"  # "cpu": jobs here run torch on the CPU, GPUs or not
    line: int | None = None

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def jobs_use_gpus(self) -> bool:
        """Jobs get this host's GPUs: one process per GPU, GPUs passed into containers."""
        return bool(self.gpus) and self.torch_device == "cuda"


@dataclass(frozen=True)
class ClusterSettings:
    """Settings that apply to the cluster as a whole."""

    rendezvous_port: int = 29500
    python: str = "python3"
    torchrun: str = "torchrun"
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    work_dir: str = "~/gpucluster"
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = DEFAULT_SSH_CONFIG
    connect_timeout: float = 10.0
    command_timeout: float = 120.0
    fanout: int = 64


@dataclass(frozen=True)
class SmokeSettings:
    """Pass/fail thresholds for the all-reduce smoke test."""

    min_busbw_gbps: float | None = None


@dataclass(frozen=True)
class Inventory:
    """A validated inventory; hosts keep the order of the file."""

    path: Path
    cluster: ClusterSettings
    hosts: tuple[Host, ...]
    groups: Mapping[str, tuple[str, ...]]
    smoke: SmokeSettings = SmokeSettings()

    @property
    def head(self) -> Host:
        """The rendezvous host: the first host of the file."""
        return self.hosts[0]

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise GpuclusterError(f"{self.path}: no host named {name!r} in the inventory")

    def select(self, patterns: str | None = None, group: str | None = None) -> list[Host]:
        """Hosts named by a range list (`gpu[01-04],login1`) and/or in a group."""
        selected = list(self.hosts)
        if group is not None:
            if group not in self.groups:
                known = ", ".join(sorted(self.groups)) or "none defined"
                raise GpuclusterError(f"{self.path}: no group {group!r} (groups: {known})")
            members = set(self.groups[group])
            selected = [h for h in selected if h.name in members]
        if patterns is not None:
            wanted = hostrange.expand_list(patterns)
            names = {h.name for h in self.hosts}
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise GpuclusterError(
                    f"{self.path}: --hosts names unknown hosts: {hostrange.fold(unknown)}"
                )
            chosen = set(wanted)
            selected = [h for h in selected if h.name in chosen]
        return selected


def find_inventory(explicit: str | None) -> Path:
    """-i/--inventory, then $GPUCLUSTER_INVENTORY, then ./inventory.yaml."""
    if explicit:
        return Path(explicit)
    from_env = os.environ.get(INVENTORY_ENV_VAR)
    if from_env:
        return Path(from_env)
    if Path(DEFAULT_INVENTORY).is_file():
        return Path(DEFAULT_INVENTORY)
    raise GpuclusterError(
        f"no inventory: pass -i/--inventory PATH, set ${INVENTORY_ENV_VAR}, "
        f"or create ./{DEFAULT_INVENTORY} (see inventory.example.yaml)"
    )


def load(path: str | Path) -> Inventory:
    """Read and validate an inventory file; raises InventoryError listing every problem."""
    path = Path(path)
    text = _read_text(path)
    try:
        document = load_with_lines(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InventoryError(
            [Problem(str(path), line, f"not valid YAML: {reason}", "fix the YAML syntax")]
        ) from None
    except (ValueError, TypeError, RecursionError) as error:
        # PyYAML raises ValueError for impossible dates such as 2024-13-45.
        raise InventoryError(
            [Problem(str(path), None, f"not valid YAML: {error}", "quote the value")]
        ) from None
    return _Validator(path).inventory(document)


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > _MAX_FILE_BYTES:
            raise InventoryError([Problem(str(path), None, f"file is {size} bytes",
                                          "an inventory is a small YAML file")])
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError([Problem(str(path), None, "inventory file not found",
                                      "check the path given to -i/--inventory")]) from None
    except IsADirectoryError:
        raise InventoryError([Problem(str(path), None, "is a directory",
                                      "pass the inventory YAML file itself")]) from None
    except OSError as error:
        raise InventoryError([Problem(str(path), None, f"cannot read: {error.strerror}",
                                      "check the file's permissions")]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise InventoryError([Problem(str(path), line, "not UTF-8 text",
                                      "save the inventory as UTF-8")]) from None


# --- key schemas: key -> (expected type name, converter). A converter returns the
# --- value or raises ValueError with the fix to show.


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("use a port number from 1 to 65535")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("use a whole number, 0 or more")
    return value


def _fanout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValueError("use a whole number from 1 to 1024")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("use a number of seconds above 0")
    return float(value)


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("use a number above 0")
    return float(value)


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("use a plain string")
    text = str(value)
    if not text.strip():
        raise ValueError("use a non-empty string")
    return text


def _connection(value: Any) -> str:
    if value not in ("auto", "ssh", "local"):
        raise ValueError("use one of: auto, ssh, local")
    return str(value)


def _torch_device(value: Any) -> str:
    if value not in ("cuda", "cpu"):
        raise ValueError("use cuda or cpu")
    return str(value)


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("use a mapping of label: value")
    return {str(k): _text(v) for k, v in value.items()}


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("use a mapping of NAME: value")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not is_env_name(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if isinstance(item, bool):
            env[key] = "1" if item else "0"
        else:
            env[key] = _text(item) if item != "" else ""
    return env


def _group_names(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError("use a group name or a list of group names")
    return tuple(items)


Converter = Callable[[Any], Any]

CLUSTER_KEYS: dict[str, tuple[str, Converter]] = {
    "rendezvous_port": ("port", _port),
    "python": ("string", _text),
    "torchrun": ("string", _text),
    "env": ("mapping", _env),
    "image": ("string", _text),
    "work_dir": ("string", _text),
    "known_hosts": ("string", _text),
    "ssh_config": ("string", _text),
    "connect_timeout": ("seconds", _seconds),
    "command_timeout": ("seconds", _seconds),
    "fanout": ("integer", _fanout),
}

HOST_KEYS: dict[str, tuple[str, Converter]] = {
    "name": ("string", _text),
    "address": ("string", _text),
    "user": ("string", _text),
    "port": ("port", _port),
    "identity_file": ("string", _text),
    "jump_host": ("string", _text),
    "labels": ("mapping", _labels),
    "gpus": ("integer", _positive_int),
    "gpu_model": ("string", _text),
    "groups": ("list", _group_names),
    "connection": ("string", _connection),
    "torch_device": ("string", _torch_device),
}
DEFAULTS_KEYS = {k: v for k, v in HOST_KEYS.items() if k not in ("name", "address")}
# Keys a host may set to null to drop what `defaults` gave it.
NULLABLE_KEYS = frozenset({"jump_host", "identity_file", "gpus", "gpu_model"})
# Paths on the controller; paths on nodes (python, work_dir) are left as written.
PATH_KEYS = frozenset({"known_hosts", "ssh_config", "identity_file"})
SMOKE_KEYS: dict[str, tuple[str, Converter]] = {
    "min_busbw_gbps": ("number", _positive_number),
}
TOP_KEYS = ("cluster", "defaults", "groups", "hosts", "smoke")


class _Validator:
    """Walks the parsed document once, collecting problems instead of stopping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def problem(self, line: int | None, message: str, fix: str = "") -> None:
        self.problems.append(Problem(str(self.path), line, message, fix))

    def inventory(self, document: Any) -> Inventory:
        if document is None:
            self.problem(None, "inventory is empty", "add a `hosts:` list")
            raise InventoryError(self.problems)
        if not isinstance(document, LineDict):
            self.problem(getattr(document, "line", 1), "top level must be a mapping",
                         "start with `hosts:` (see inventory.example.yaml)")
            raise InventoryError(self.problems)
        self._repeated(document)
        self._unknown_keys(document, TOP_KEYS, "top level")
        cluster = ClusterSettings(**self._section(document, "cluster", CLUSTER_KEYS))
        smoke = SmokeSettings(**self._section(document, "smoke", SMOKE_KEYS))
        defaults = self._section(document, "defaults", DEFAULTS_KEYS)
        hosts = self._hosts(document, defaults, cluster)
        groups = self._groups(document, hosts)
        if self.problems:
            raise InventoryError(self.problems)
        hosts = [_with_groups(h, groups) for h in hosts]
        return Inventory(self.path, cluster, tuple(hosts), groups, smoke)

    # -- generic helpers

    def _repeated(self, mapping: LineDict) -> None:
        for key, line in mapping.repeated_keys:
            self.problem(line, f"key {key!r} appears twice", "keep only one of them")

    def _unknown_keys(self, mapping: LineDict, known: Any, where: str) -> None:
        for key in mapping:
            if key in known:
                continue
            guess = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
            fix = f"did you mean {guess[0]!r}?" if guess else (
                "known keys: " + ", ".join(sorted(known)))
            self.problem(mapping.line_of(key), f"unknown key {key!r} in {where}", fix)

    def _convert(self, mapping: LineDict, schema: dict[str, tuple[str, Converter]],
                 where: str) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, raw in mapping.items():
            if key not in schema:
                continue
            if raw is None:
                if key in NULLABLE_KEYS:  # `jump_host: null` overrides a default
                    values[key] = None
                continue
            kind, convert = schema[key]
            try:
                values[key] = convert(raw)
                if key in PATH_KEYS:
                    values[key] = self._path(values[key])
            except (ValueError, TypeError) as error:
                self.problem(mapping.line_of(key),
                             f"{where}.{key} has a bad {kind} value {_show(raw)}", str(error))
        return values

    def _section(self, document: LineDict, name: str,
                 schema: dict[str, tuple[str, Converter]]) -> dict[str, Any]:
        section = document.get(name)
        if section is None:
            return {}
        if not isinstance(section, LineDict):
            self.problem(document.line_of(name), f"`{name}` must be a mapping",
                         f"write `{name}:` followed by indented key: value lines")
            return {}
        self._repeated(section)
        self._unknown_keys(section, schema, name)
        return self._convert(section, schema, name)

    def _path(self, value: str) -> str:
        """`~` expanded; a relative path is relative to the inventory file, not the cwd."""
        expanded = Path(value).expanduser()
        if not expanded.is_absolute():
            expanded = self.path.parent.absolute() / expanded
        return str(expanded)

    # -- hosts

    def _hosts(self, document: LineDict, defaults: dict[str, Any],
               cluster: ClusterSettings) -> list[Host]:
        entries = document.get("hosts")
        line = document.line_of("hosts") if "hosts" in document else document.line
        if entries is None or entries == []:
            self.problem(line, "no hosts", "add a `hosts:` list with at least one host")
            return []
        if not isinstance(entries, LineList):
            self.problem(line, "`hosts` must be a list",
                         "write each host as `- name: gpu01` under `hosts:`")
            return []
        ssh_config = SshConfig(cluster.ssh_config)
        hosts: list[Host] = []
        for index, entry in enumerate(entries):
            hosts.extend(self._host_entry(entry, entries.line_of(index), defaults, ssh_config))
        self._duplicates(hosts)
        self._jump_loops(hosts)
        return hosts

    def _jump_loops(self, hosts: list[Host]) -> None:
        """A host whose jump path comes back to itself can never be reached."""
        by_name = {h.name: h for h in hosts}
        for host in hosts:
            seen = [host.name]
            hop = host.jump_host
            while hop is not None:
                first = hop.split(",")[0].rpartition("@")[2].partition(":")[0]
                if first == host.name:
                    self.problem(host.line, f"host {host.name!r} reaches itself through "
                                 f"jump_host ({' -> '.join([*seen, first])})",
                                 "set `jump_host: null` on the jump host itself")
                    break
                if first in seen or first not in by_name:
                    break  # another host's loop is reported on that host
                seen.append(first)
                hop = by_name[first].jump_host

    def _host_entry(self, entry: Any, line: int, defaults: dict[str, Any],
                    ssh_config: SshConfig) -> list[Host]:
        if isinstance(entry, str):
            fields: dict[str, Any] = {"name": entry}
        elif isinstance(entry, LineDict):
            self._repeated(entry)
            self._unknown_keys(entry, HOST_KEYS, "host entry")
            fields = self._convert(entry, HOST_KEYS, "host")
            if "name" not in entry:
                self.problem(line, "host entry has no `name`", "add `name: gpu01`")
                return []
            if "name" not in fields:
                return []
        else:
            self.problem(line, f"host entry must be a name or a mapping, not {_show(entry)}",
                         "write `- name: gpu01` (optionally with address, user...)")
            return []
        names = self._expand(fields["name"], line, "name")
        if not names:
            return []
        addresses: list[str | None] = [None] * len(names)
        if "address" in fields:
            expanded = self._expand(fields["address"], line, "address")
            if len(expanded) == len(names):
                addresses = list(expanded)
            elif len(expanded) == 1 and len(names) == 1:
                addresses = [expanded[0]]
            elif expanded:
                self.problem(line, f"{len(names)} names but {len(expanded)} addresses",
                             "give the address as a range of the same length, "
                             "e.g. name: gpu[01-04], address: 10.0.0.[11-14]")
                return []
        for name in names:
            if not _SIMPLE_NAME.match(name):
                self.problem(line, f"host name {name!r} has characters a hostname cannot",
                             "use letters, digits, '.', '-' and '_'")
                return []
        return [_resolve_host(name, address, fields, defaults, ssh_config, line)
                for name, address in zip(names, addresses, strict=True)]

    def _expand(self, pattern: str, line: int, what: str) -> list[str]:
        try:
            return hostrange.expand(pattern)
        except HostRangeError as error:
            self.problem(line, f"bad host range in {what}: {error}",
                         "write ranges like gpu[01-16] or node[1-4,7]")
            return []

    def _duplicates(self, hosts: list[Host]) -> None:
        seen_names: dict[str, Host] = {}
        seen_endpoints: dict[tuple[str, int, str], Host] = {}
        for host in hosts:
            if host.name in seen_names:
                first = seen_names[host.name]
                self.problem(host.line, f"duplicate host {host.name!r} "
                             f"(first defined on line {first.line})", "remove one of them")
                continue  # its address clash is the same mistake; say it once
            seen_names[host.name] = host
            endpoint = (host.address, host.port, host.jump_host or "")
            if not host.is_local and endpoint in seen_endpoints:
                first = seen_endpoints[endpoint]
                self.problem(host.line, f"host {host.name!r} has the same address "
                             f"{host.address}:{host.port} as {first.name!r} "
                             f"(line {first.line})", "give each host its own address")
            seen_endpoints.setdefault(endpoint, host)

    # -- groups

    def _groups(self, document: LineDict, hosts: list[Host]) -> dict[str, tuple[str, ...]]:
        groups: dict[str, list[str]] = {}
        names = {h.name for h in hosts}
        for host in hosts:
            for group in host.groups:
                groups.setdefault(group, []).append(host.name)
        section = document.get("groups")
        if section is None:
            return {k: tuple(v) for k, v in groups.items()}
        if not isinstance(section, LineDict):
            self.problem(document.line_of("groups"), "`groups` must be a mapping",
                         "write `groups:` then `name: [gpu[01-04], ...]` lines")
            return {}
        self._repeated(section)
        for group, members in section.items():
            line = section.line_of(group)
            patterns = [members] if isinstance(members, str) else members
            if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
                self.problem(line, f"group {group!r} must list host names or ranges",
                             "write e.g. `train: [gpu[01-04]]`")
                continue
            expanded: list[str] = []
            for pattern in patterns:
                expanded.extend(self._expand(pattern, line, f"group {group!r}"))
            unknown = [n for n in expanded if n not in names]
            if unknown and names:
                self.problem(line, f"group {group!r} names unknown hosts: "
                             f"{hostrange.fold(unknown)}", "add them to `hosts` or fix the names")
            groups.setdefault(str(group), []).extend(n for n in expanded if n in names)
        return {k: tuple(dict.fromkeys(v)) for k, v in groups.items()}


def _resolve_host(name: str, address: str | None, fields: dict[str, Any],
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
        connection = "local" if resolved_address in LOCAL_ADDRESSES else "ssh"
    return Host(
        name=name,
        address=resolved_address,
        user=pick("user", from_config.user, _current_user()),
        port=pick("port", from_config.port, 22),
        identity_file=pick("identity_file", from_config.identity_file),
        jump_host=pick("jump_host", from_config.proxy_jump),
        labels={**defaults.get("labels", {}), **fields.get("labels", {})},
        gpus=fields.get("gpus", defaults.get("gpus")),
        gpu_model=fields.get("gpu_model", defaults.get("gpu_model")),
        groups=tuple(fields.get("groups", defaults.get("groups", ()))),
        connection=connection,
        torch_device=fields.get("torch_device", defaults.get("torch_device", "cuda")),
        line=line,
    )


def _with_groups(host: Host, groups: Mapping[str, tuple[str, ...]]) -> Host:
    from dataclasses import replace

    member_of = tuple(g for g, members in groups.items() if host.name in members)
    return replace(host, groups=member_of)


def _current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_ip(text: str) -> bool:
    """True for an IPv4 or IPv6 address (not a DNS name)."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
