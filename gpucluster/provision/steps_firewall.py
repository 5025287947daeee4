"""Step `firewall`: open the rendezvous port and the ephemeral range NCCL and gloo use
(and Slurm's ports, when Slurm is part of the cluster), to the cluster's own addresses
only, in whatever firewall the node runs.

Detected in this order: ufw (active), firewalld (running), iptables (an INPUT chain that
drops or rejects), nftables (an input-hook chain of its own that drops or rejects: our
rules go at its top). No active firewall:
nothing to open, no change. Rules carry the tag `gpucluster` so they are found again:
a re-run adds no duplicates and `--undo firewall` removes exactly ours. SSH is never
touched: only ACCEPT rules are added.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from gpucluster import reports
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, is_ip
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import Change, Each, ProvisionContext, Step
from gpucluster.slurm import config
from gpucluster.templating import render

TAG = "gpucluster"  # the default cluster name's: rules carry their cluster's name


def firewalld_record(tag: str) -> str:
    """Where a node keeps the firewalld rich rules cluster `tag` added."""
    return f"/etc/gpucluster/{tag}.firewalld-rich-rules"


@dataclass(frozen=True)
class Firewall:
    kind: str  # ufw | firewalld | iptables | nftables | none
    ephemeral: str  # low:high from ip_local_port_range
    ours: tuple[str, ...]  # our rules as the firewall lists them
    tag: str = TAG  # the cluster's name, which tags (or records) its rules


def detect_script(tag: str = TAG) -> str:
    return render("provision/firewall_detect.sh.j2", tag=tag,
                  firewalld_record=firewalld_record(tag))


def detect(connection: LoggedConnection, tag: str = TAG) -> Firewall:
    output = connection.run(detect_script(tag), timeout=30, sudo=True)
    if not output.ok:
        raise GpuclusterError(f"firewall detection failed: {output.stderr.strip()[-200:]}")
    lines = output.stdout.splitlines()
    kind = lines[0].strip() if lines else "none"
    bounds = lines[1].split() if len(lines) > 1 else []
    ephemeral = ":".join(bounds) if len(bounds) == 2 and all(b.isdigit() for b in bounds) \
        else "32768:60999"
    return Firewall(kind, ephemeral, tuple(line for line in lines[2:] if line.strip()), tag)


def peers_of(context: ProvisionContext, host: Host) -> list[str]:
    """The other nodes' addresses, IPv6 ones in the compressed form firewalls print."""
    return [ipaddress.ip_address(p.address).compressed for p in context.inventory.hosts
            if p.name != host.name and is_ip(p.address)]


def is_v6(address: str) -> bool:
    return ":" in address


def iptables_rule(address: str, port: int, ephemeral: str, tag: str = TAG,
                  extra: Sequence[str] = ()) -> str:
    """A rule as `iptables -S` (or `ip6tables -S`) prints it, so present and desired
    rules compare as text. `extra`: more ports or low:high ranges (Slurm's)."""
    ports = ",".join([str(port), *extra, ephemeral])
    return (f"-A INPUT -s {address}/{128 if is_v6(address) else 32} -p tcp -m multiport "
            f"--dports {ports} -m comment --comment {tag} -j ACCEPT")


def side_by_side_ports(port: int, count: int) -> list[str]:
    """The rendezvous ports past the first (cluster.rendezvous_ports), as `extra` ports
    take them: `29501:29507`, or one port alone."""
    if count < 2:
        return []
    return [str(port + 1) if count == 2 else f"{port + 1}:{port + count - 1}"]


def port_intervals(text: str) -> list[tuple[int, int]]:
    """"6817, 6818, 29500, 32768-60999" (or with ':') as merged intervals, the way
    nftables keeps a set: it merges neighbours and sorts, so sets compare by value."""
    spans = []
    for item in re.split(r"[\s,]+", text.strip()):
        low, _, high = item.replace(":", "-").partition("-")
        if low.isdigit():
            spans.append((int(low), int(high) if high.isdigit() else int(low)))
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


def _iptables_for(rule: str) -> str:
    """iptables for an IPv4 source, ip6tables for an IPv6 one."""
    source = re.search(r"-s (\S+)/", rule)
    return "ip6tables" if source and is_v6(source.group(1)) else "iptables"


def plan_commands(firewall: Firewall, wanted: list[str], port: int,
                  extra: Sequence[str] = ()) -> list[str]:
    """The commands that bring the node's rules to exactly `wanted` peers, each opened
    the rendezvous port, the ephemeral range and `extra` ports (Slurm's)."""
    if firewall.kind == "iptables":
        desired = {iptables_rule(a, port, firewall.ephemeral, firewall.tag, extra)
                   for a in wanted}
        present = set(firewall.ours)
        add = [f"{_iptables_for(r)} -I INPUT {r.removeprefix('-A INPUT ')}"
               for r in sorted(desired - present)]
        drop = [f"{_iptables_for(r)} -D INPUT {r.removeprefix('-A INPUT ')}"
                for r in sorted(present - desired)]
        return drop + add
    if firewall.kind == "ufw":
        # Ours are found by their comment, with the ports they open: after a change of
        # rendezvous_port the old rules go and the new ones come.
        ports = ",".join([str(port), *extra, firewall.ephemeral])
        allowed = {(parts[0], parts[1].removesuffix("/tcp"))
                   for parts in (line.split() for line in firewall.ours) if len(parts) == 2}
        needed = {(a, ports) for a in wanted}
        add = [f"ufw allow from {a} to any port {ports} proto tcp comment {firewall.tag}"
               for a in wanted if (a, ports) not in allowed]
        drop = [f"ufw delete allow from {a} to any port {opened} proto tcp"
                for a, opened in sorted(allowed - needed)]
        return drop + add
    if firewall.kind == "firewalld":
        return firewalld_commands(firewall, wanted, port, extra)
    if firewall.kind == "nftables":
        return nftables_commands(firewall, wanted, port, extra)
    return []


def firewalld_commands(firewall: Firewall, wanted: list[str], port: int,
                       extra: Sequence[str] = ()) -> list[str]:
    """Rich rules carry no tag, so ours are those in our record on the node: an admin's
    rule on the same ports is never touched (nor recorded when it was there first).
    Permanent and runtime sets are brought to the same state without --reload, which
    would drop every runtime-only rule of the admin's."""
    def rule(address: str, ports: str) -> str:
        family = "ipv6" if is_v6(address) else "ipv4"
        return (f'rule family="{family}" source address="{address}" port port="{ports}" '
                f'protocol="tcp" accept')
    listed = {kind: {line.partition(" ")[2] for line in firewall.ours
                     if line.startswith(kind + " ")} for kind in ("permanent", "runtime",
                                                                  "ours")}
    permanent, runtime, on_disk = listed["permanent"], listed["runtime"], listed["ours"]
    ephemeral = firewall.ephemeral.replace(":", "-")
    opened = [str(port), ephemeral, *(e.replace(":", "-") for e in extra)]
    desired = {rule(a, ports) for a in wanted for ports in opened}
    # Provisioned before the record existed: our exact rules are adopted.
    recorded = desired & permanent if "norecord" in firewall.ours else on_disk
    commands = []
    for stale in sorted((recorded & (permanent | runtime)) - desired):
        if stale in permanent:
            commands.append(f"firewall-cmd --permanent --remove-rich-rule={shlex.quote(stale)}")
        if stale in runtime:
            commands.append(f"firewall-cmd --remove-rich-rule={shlex.quote(stale)}")
    for needed in sorted(desired):
        if needed not in permanent:
            commands.append(f"firewall-cmd --permanent --add-rich-rule={shlex.quote(needed)}")
        if needed not in runtime:
            commands.append(f"firewall-cmd --add-rich-rule={shlex.quote(needed)}")
    record = (recorded & desired) | (desired - permanent)
    if record != on_disk:
        path = firewalld_record(firewall.tag)
        lines = "".join(f" {shlex.quote(r)}" for r in sorted(record))
        commands.append(f"mkdir -p {path.rsplit('/', 1)[0]} && printf '%s\\n'{lines} > {path}"
                        if record else f"rm -f {path}")
    return commands


def nftables_commands(firewall: Firewall, wanted: list[str], port: int,
                      extra: Sequence[str] = ()) -> list[str]:
    """Rules in the node's own input chain (the one that drops), inserted at its top and
    tagged by a comment; found again by that comment, removed by handle."""
    chain_line, *rules = firewall.ours
    chain = chain_line.removeprefix("chain").split()
    if len(chain) != 3:
        raise GpuclusterError("nftables: no input chain that drops was found to add to")
    family, table, name = (shlex.quote(part) for part in chain)
    ephemeral = firewall.ephemeral.replace(":", "-")
    elements = ", ".join([str(port), *(e.replace(":", "-") for e in extra), ephemeral])
    current: dict[str, str] = {}  # peer address -> handle of its rule for today's ports
    stale: list[str] = []  # handles of our rules for other peers or other ports
    for rule in rules:  # all tagged as ours by the detection
        address = re.search(r"ip6? saddr (\S+) ", rule)
        handle = re.search(r"# handle (\d+)", rule)
        if not handle or f'comment "{firewall.tag}"' not in rule:  # never an admin's rule
            continue
        opened = re.search(r"tcp dport (\{ [^}]* \}|\d+) accept", rule)
        if address and address.group(1) in wanted and address.group(1) not in current \
                and opened and port_intervals(opened.group(1).strip("{} ")) \
                == port_intervals(elements):
            current[address.group(1)] = handle.group(1)
        else:
            stale.append(handle.group(1))
    drop = [f"nft delete rule {family} {table} {name} handle {h}" for h in stale]
    if family not in ("inet", "ip6") and any(map(is_v6, wanted)):
        raise GpuclusterError(f"nftables: the input chain that drops is in an IPv4-only "
                              f"table ({chain[0]} {chain[1]}), and peers have IPv6 addresses "
                              f"(fix: use an inet table, or the peers' IPv4 addresses)")
    if family == "ip6" and not all(map(is_v6, wanted)):
        raise GpuclusterError(f"nftables: the input chain that drops is in an IPv6-only "
                              f"table ({chain[0]} {chain[1]}), and peers have IPv4 addresses "
                              f"(fix: use an inet table)")
    add = [f"nft insert rule {family} {table} {name} {'ip6' if is_v6(a) else 'ip'} saddr {a} "
           f"tcp dport '{{ {elements} }}' accept comment {firewall.tag}"
           for a in wanted if a not in current]
    return drop + add


class FirewallStep(Step):
    name = "firewall"
    summary = "open the rendezvous port and NCCL/gloo ports to cluster addresses only"
    changes_only_own_reads = True  # the firewall's rules: no other step reads them

    undone = ("command", "commands")

    def needs_root(self, context: ProvisionContext) -> bool:
        return True

    def reads(self, context: ProvisionContext) -> list[tuple[str, bool]]:
        return [(detect_script(context.inventory.cluster.name), True)]

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        """Nothing to gather: each node's firewall is read in check."""

    def _plan(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              undo: bool) -> tuple[str, list[str]]:
        """The node's firewall kind, and the commands that make its rules right."""
        firewall = detect(connection, context.inventory.cluster.name)
        wanted = [] if undo else peers_of(context, host)
        cluster = context.inventory.cluster
        extra = [*side_by_side_ports(cluster.rendezvous_port, cluster.rendezvous_ports),
                 *(config.firewall_ports(context.slurm) if context.slurm else [])]
        return firewall.kind, plan_commands(firewall, wanted, cluster.rendezvous_port, extra)

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        kind, commands = self._plan(context, host, connection, undo=False)
        noun = "command" if len(commands) == 1 else "commands"
        return [Change(f"{len(commands)} {kind} rule {noun}", "\n".join(commands))] \
            if commands else []

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None:
        # The commands check just planned (its change's detail): no second detection.
        planned = [line for change in changes for line in change.detail.splitlines()]
        self._execute(connection, planned, read_back=context.inventory.cluster.name)

    def undo(self, context: ProvisionContext, host: Host,
             connection: LoggedConnection) -> list[str]:
        """Remove exactly our rules; returns the commands run."""
        return self._run(context, host, connection, undo=True)

    def _run(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
             undo: bool) -> list[str]:
        return self._execute(connection, self._plan(context, host, connection, undo)[1])

    @staticmethod
    def _execute(connection: LoggedConnection, commands: list[str],
                 read_back: str | None = None) -> list[str]:
        """Run the rule commands; with `read_back` (the cluster's tag), detect the rules
        again in the same round trip, for the re-check to read."""
        if not commands:
            return commands
        # All of a node's rule commands in one round trip (one per peer was 7 round trips
        # a node on 8 nodes); they stop at the first that fails, which is named. What
        # they print (ufw's "Rule added") goes to stderr: stdout is the detection's.
        script = "\n".join(f"{{ {command}; }} >&2 || {{ echo '@@gpc failed {index}' >&2; "
                            f"exit 3; }}" for index, command in enumerate(commands))
        limit = 60 + 5 * len(commands)
        result = connection.run(script, timeout=limit, sudo=True) if read_back is None \
            else connection.run_then_read(script, detect_script(read_back), limit, sudo=True)
        if not result.ok:
            failed = reports.by_kind(result.stderr).get("failed", [""])[-1]
            command = commands[int(failed)] if failed.isdigit() else commands[0]
            detail = "\n".join(line for line in result.stderr.strip().splitlines()
                               if not line.startswith(reports.MARK))
            raise GpuclusterError(f"`{command}` failed: {detail[-200:]}")
        return commands
