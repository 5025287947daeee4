"""Walking the parsed document once, collecting every problem (with its line and fix)
instead of stopping at the first, and building the Inventory when there is none."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpucluster import hostrange
from gpucluster.errors import HostRangeError, InventoryError, Problem
from gpucluster.inventory.model import (
    ClusterSettings,
    Host,
    Inventory,
    SlurmSettings,
    SmokeSettings,
    is_ip,
)
from gpucluster.inventory.resolve import resolve_host
from gpucluster.inventory.schema import (
    CLUSTER_KEYS,
    DEFAULTS_KEYS,
    GROUP_NAME_RULE,
    HOST_KEYS,
    NULLABLE_KEYS,
    PATH_KEYS,
    SLURM_KEYS,
    SMOKE_KEYS,
    TOP_KEYS,
    Converter,
    ItemProblems,
    is_group_name,
    short_repr,
)
from gpucluster.ssh_config import SshConfig
from gpucluster.yaml_lines import LineDict, LineList, as_written

_SIMPLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # fullmatch: no "\n" tail
_DOTTED_NUMBERS = re.compile(r"[0-9]+(\.[0-9]*)+")  # not "01": an ssh_config alias may be


class Validator:
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
                         "start with `hosts:` (see: gpucluster inventory example)")
            raise InventoryError(self.problems)
        self._repeated(document)
        self._unknown_keys(document, TOP_KEYS, "top level")
        cluster = ClusterSettings(**self._section(document, "cluster", CLUSTER_KEYS))
        smoke = SmokeSettings(**self._section(document, "smoke", SMOKE_KEYS))
        defaults = self._section(document, "defaults", DEFAULTS_KEYS)
        hosts = self._hosts(document, defaults, cluster)
        groups = self._groups(document, hosts)
        slurm = self._slurm(document, hosts)
        self._rendezvous_port(document, cluster, hosts, slurm)
        if self.problems:
            raise InventoryError(self.problems)
        hosts = [_with_groups(h, groups) for h in hosts]
        return Inventory(self.path, cluster, tuple(hosts), groups, smoke, slurm)

    def _slurm(self, document: LineDict, hosts: list[Host]) -> SlurmSettings | None:
        if "slurm" not in document:
            return None
        settings = SlurmSettings(**self._section(document, "slurm", SLURM_KEYS))
        names = [h.name for h in hosts]
        if settings.controller is not None and hosts and settings.controller not in names:
            section = document.get("slurm")
            line = section.line_of("controller") if isinstance(section, LineDict) else None
            self.problem(line, f"slurm.controller {settings.controller!r} is not a host of "
                               f"the inventory", "name one of: " + hostrange.fold(names))
        return settings

    def _rendezvous_port(self, document: LineDict, cluster: ClusterSettings,
                         hosts: list[Host], slurm: SlurmSettings | None) -> None:
        """Where the head's torchrun listens (any host may head): not sshd's port, nor srun's."""
        section = document.get("cluster")
        line = section.line_of("rendezvous_port") if isinstance(section, LineDict) else None
        port, last = cluster.rendezvous_port, cluster.rendezvous_port + cluster.rendezvous_ports - 1
        named = f"{port}" if last == port else f"{port}-{last} (rendezvous_ports)"
        if last > 65535:
            self.problem(line, f"cluster.rendezvous_port {named} runs past port 65535",
                         "use a lower port, e.g. 29500")
        if sshd := [h.name for h in hosts if port <= h.port <= last]:
            held = f"{'holds' if last > port else 'is'} the SSH port of {hostrange.fold(sshd)}"
            self.problem(line, f"cluster.rendezvous_port {named} {held}",
                         "use a free port, e.g. 29500")
        low, high = (int(p) for p in slurm.srun_ports.split("-")) if slurm else (0, -1)
        if low <= last and port <= high:
            if line is None and isinstance(slurm_section := document.get("slurm"), LineDict):
                line = slurm_section.line_of("srun_ports")
            self.problem(line, f"cluster.rendezvous_port {named} is inside slurm.srun_ports "
                               f"{low}-{high}", "use a port outside that range, e.g. 29500")

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
                else:  # `address:` left empty would quietly mean the default
                    self.problem(mapping.line_of(key), f"{where}.{key} has no value",
                                 "give it a value" if key == "name" else
                                 "give it a value, or remove the line for the default")
                continue
            kind, convert = schema[key]
            try:
                values[key] = convert(raw)
                if key in PATH_KEYS:
                    values[key] = self._path(values[key])
            except ItemProblems as error:
                for item, what, fix in error.problems:
                    line = raw.line_of(item) if isinstance(raw, LineDict) else None
                    self.problem(line or mapping.line_of(key),
                                 f"{where}.{key}.{as_written(item)} {what}", fix)
            except (ValueError, TypeError) as error:
                self.problem(mapping.line_of(key),
                             f"{where}.{key} has a bad {kind} value {short_repr(raw)}", str(error))
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
            self.problem(line, f"host entry must be a name or a mapping, not {short_repr(entry)}",
                         "write `- name: gpu01` (optionally with address, user...)")
            return []
        names = self._expand(fields["name"], line, "name")
        if not names:
            return []
        addresses: list[str | None] = [None] * len(names)
        if "address" in fields:
            bracketed = fields["address"].strip()
            if bracketed.startswith("[") and is_ip(bracketed.strip("[]")):
                self.problem(line, f"address {bracketed!r} is in brackets",
                             f"write the IPv6 address bare: address: {bracketed.strip('[]')!r} "
                             f"(brackets here mean a host range)")
                return []
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
        if not self._names_valid(names, addresses, line, entry):
            return []
        return [resolve_host(name, address, fields, defaults, ssh_config, line)
                for name, address in zip(names, addresses, strict=True)]

    def _names_valid(self, names: list[str], addresses: list[str | None], line: int,
                     entry: Any) -> bool:
        """Names and addresses go into ssh configs, /etc/hosts and firewall rules: each
        must be one word of a host name's characters (or an IP address)."""
        for name in names:
            if not _SIMPLE_NAME.fullmatch(name):
                self.problem(line, f"host name {name!r} has characters a hostname cannot",
                             "use letters, digits, '.', '-' and '_'")
                return False
        for name, address in zip(names, addresses, strict=True):
            reached = name if address is None else address  # no address: the name is it
            if _DOTTED_NUMBERS.fullmatch(reached) and not is_ip(reached):
                # 10.0.0.300: a typo, as no DNS name is all numbers
                self.problem(entry.line_of("address") if address is not None and
                             isinstance(entry, LineDict) else line,
                             f"{'host name' if address is None else 'address'} {reached!r} "
                             f"is not an IP address",
                             "give four numbers from 0 to 255, e.g. 10.0.0.11")
                return False
            if address is not None and not (is_ip(address) or _SIMPLE_NAME.fullmatch(address)):
                self.problem(entry.line_of("address") if isinstance(entry, LineDict) else line,
                             f"address {address!r} is neither an IP address nor a host name",
                             "give the host's IP address or DNS name, e.g. 10.0.0.11")
                return False
        return True

    def _expand(self, pattern: str, line: int, what: str) -> list[str]:
        try:
            return hostrange.expand(pattern)
        except HostRangeError as error:
            self.problem(line, f"bad host range in {what}: {error.reason}", error.fix)
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
        for key, members in section.items():
            line = section.line_of(key)
            group = as_written(key)  # `01:` is YAML's number 1, the group "01"
            if not is_group_name(group):
                self.problem(line, f"group name {group!r} is empty or has characters a "
                             f"group name cannot",
                             f"use {GROUP_NAME_RULE}")
                continue
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
            groups.setdefault(group, []).extend(n for n in expanded if n in names)
        return {k: tuple(dict.fromkeys(v)) for k, v in groups.items()}


def _with_groups(host: Host, groups: Mapping[str, tuple[str, ...]]) -> Host:
    member_of = tuple(g for g, members in groups.items() if host.name in members)
    return replace(host, groups=member_of)
