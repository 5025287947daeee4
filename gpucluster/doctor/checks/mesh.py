"""Checks judged from the probe's port mesh (templates/doctor/port_mesh.py): every node
listened on one port of its ephemeral range, connected to every other node's, and sent
one full-size segment across. Each node is judged as a target, by what the others saw
of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.doctor.checks.network import PORT_STATES, cluster_address
from gpucluster.doctor.model import CheckResult, Context, Status, check
from gpucluster.doctor.probe import PortMesh
from gpucluster.inventory import Host
from gpucluster.wording import counted

DEFAULT_RANGE = "32768:60999"


@dataclass(frozen=True)
class _Target:
    host: Host
    mesh: PortMesh | None
    untested: str | None  # why it cannot be judged; None when it can
    seen: Mapping[str, str]  # other node -> what it saw of this node's port

    @property
    def ports(self) -> str:
        return (self.mesh.range if self.mesh and self.mesh.range else DEFAULT_RANGE)


def _targets(context: Context) -> Iterator[_Target]:
    answering = context.answering()
    meshes = {h.name: context.facts[h.name].mesh for h in answering}
    for target in answering:
        mine = meshes[target.name]
        seen = {source.name: state for source in answering if source is not target
                if (mesh := meshes[source.name]) is not None
                and (state := mesh.peers.get(target.address)) is not None}
        yield _Target(target, mine, _untested(context, mine, seen), seen)


def _untested(context: Context, mine: PortMesh | None, seen: Mapping[str, str]) -> str | None:
    if mine is None:
        return ("not tested: a single node, or every host is this machine"
                if not context.inventory.has_machine_pairs
                else "the port mesh did not run on this node")
    if mine.listen != "ok":
        why = "the port was in use there: run doctor again (it draws another)" \
            if mine.listen == "busy" else mine.listen
        said = f"no listener on port {mine.port}" if mine.port else \
            "the port mesh did not start here"
        return f"not tested: {said} ({why})"
    if not seen:
        return "not tested: no other node's port mesh ran"
    return None


def _connected(state: str) -> bool:
    """The other node's connection was accepted: the port is open to it."""
    return state == "open" or state.startswith("stalled")


@check("peer-ports", "network",
       "the ports NCCL and gloo connect on (the ephemeral range) are open from every node "
       "to every other", sections=("peers",))
def peer_ports(context: Context) -> list[CheckResult]:
    """Open on 29500 alone, a firewall lets torchrun's rendezvous form and then hangs
    the first collective: NCCL's and gloo's own connections go to ports the kernel picks
    from each node's ephemeral range."""
    results = []
    for target in _targets(context):
        name = target.host.name
        if target.untested:
            results.append(CheckResult("peer-ports", name, Status.SKIP, target.untested))
            continue
        failed = {source: state for source, state in target.seen.items()
                  if not _connected(state)}
        if failed:
            results.append(_blocked(context, target, failed))
        else:
            assert target.mesh is not None
            results.append(CheckResult(
                "peer-ports", name, Status.OK,
                f"port {target.mesh.port} (of {target.ports.replace(':', '-')}) reached "
                f"from {counted(len(target.seen), 'other node')}"))
    return results


def _blocked(context: Context, target: _Target, failed: Mapping[str, str]) -> CheckResult:
    """Where every other node failed, the rule names every cluster address: the same
    finding for every node of a cluster behind a default-drop firewall, said once."""
    assert target.mesh is not None
    everyone = len(failed) == len(target.seen)
    sources = [h.address for h in context.inventory.hosts] if everyone else [
        h.address for h in context.inventory.hosts if h.name in failed]
    how = Counter(failed.values()).most_common(1)[0][0]
    return CheckResult(
        "peer-ports", target.host.name, Status.FAIL,
        f"port {target.mesh.port}, of the range NCCL and gloo connect on "
        f"({target.ports.replace(':', '-')}), is not reachable from "
        f"{'any other node' if everyone else hostrange.fold(list(failed))}: "
        f"{PORT_STATES.get(how, how)}",
        f"gpucluster provision --only firewall (opens the rendezvous port and this range "
        f"to the cluster's addresses only, on every node); by hand, on the node: sudo "
        f"iptables -I INPUT -p tcp --dport {target.ports} -s {','.join(sources)} -j ACCEPT; "
        f"a cloud security group may drop it too", {"seen_from": dict(failed)})


@check("path-mtu", "network",
       "full-size packets (each node's MTU) cross between every pair of nodes",
       sections=("peers", "addresses"))
def path_mtu(context: Context) -> list[CheckResult]:
    """Jumbo frames on the nodes but not on a switch port between them: the handshake
    and small messages pass, full-size packets are dropped without a word to the sender,
    and NCCL's and gloo's bulk traffic hangs. In the port mesh each node sent every
    other one full-size segment over its connection, and waited for the answer."""
    results = []
    for target in _targets(context):
        name = target.host.name
        stalled = {source: int(state.split()[1]) for source, state in target.seen.items()
                   if state.startswith("stalled ") and state.split()[1].isdigit()}
        crossed = [source for source, state in target.seen.items() if state == "open"]
        mtu = _mtu(context, target.host)
        if target.untested or not (stalled or crossed):
            results.append(CheckResult(
                "path-mtu", name, Status.SKIP,
                target.untested or "not tested: no other node reached its port (peer-ports)"))
        elif not stalled:
            results.append(CheckResult(
                "path-mtu", name, Status.OK,
                f"full-size packets{f' (MTU {mtu})' if mtu else ''} arrive from "
                f"{counted(len(crossed), 'other node')}"))
        else:
            results.append(_stalled(context, target, stalled, mtu))
    return results


def _stalled(context: Context, target: _Target, stalled: Mapping[str, int],
             mtu: int | None) -> CheckResult:
    everyone = len(stalled) == len(target.seen)
    mtus = sorted({m for h in context.inventory.hosts if h.name in stalled
                   and (m := _mtu(context, h)) is not None})
    size = f"MTU {'/'.join(map(str, mtus))}" if mtus else \
        f"{max(stalled.values())}-byte segments"
    # ping's payload for the largest packet, unfragmented: the MTU less IP's and ICMP's
    # 28 bytes of headers
    payload = str(mtus[-1] - 28) if mtus else "MTU-28"
    address = cluster_address(context, target.host)
    device = context.facts[target.host.name].interfaces.get(address or "", "IFACE")
    return CheckResult(
        "path-mtu", target.host.name, Status.FAIL,
        f"full-size packets ({size}) from "
        f"{'every other node' if everyone else hostrange.fold(list(stalled))} do not "
        f"arrive, though small ones do: something between them (a switch port, a "
        f"tunnel) carries a smaller MTU and drops them, and NCCL's and gloo's bulk "
        f"traffic would hang",
        f"give the nodes' cluster interfaces the MTU every hop between them carries: lower "
        f"it on the nodes (sudo ip link set dev {device} mtu 1500) or raise it on the "
        f"switches; a pair is tested with ping -M do -s {payload} -c 3 ADDRESS (no "
        f"reply: too large for the path)",
        {"stalled_from": dict(stalled), **({"mtu": mtu} if mtu else {})})


def _mtu(context: Context, host: Host) -> int | None:
    address = cluster_address(context, host)
    return context.facts[host.name].mtus.get(address) if address else None
