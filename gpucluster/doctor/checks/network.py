"""Network: hostnames, name resolution between nodes, the rendezvous port, interfaces,
InfiniBand. What makes torchrun rendezvous time out and NCCL pick the wrong NIC."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping

from gpucluster import hostrange
from gpucluster.doctor.model import CheckResult, Context, Status, check, parity
from gpucluster.inventory import Host, is_ip
from gpucluster.torchrun import SMOKE_ENDS, SMOKE_PREFIX

LOCAL_NAMES = {"localhost", "localhost.localdomain", "localhost6"}
PORT_STATES = {"timeout": "no answer (a firewall drops it)",
               "refused": "refused (a firewall rejects it)"}
# /etc/hosts lines a fix spells out; past that it names the command that prints them all
HOSTS_LINES_SHOWN = 8


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@check("hostname", "network", "each node's hostname is unique and not localhost")
def hostname(context: Context) -> list[CheckResult]:
    names = {h.name: context.facts[h.name].hostname or "" for h in context.answering()}
    results: list[CheckResult] = []
    # Said alike on every node of a group (a fresh image's `localhost` on every node,
    # clones all named `ubuntu`), so that doctor says it once, not once per node.
    for name, hosts in hostrange.hosts_by((n, h) for h, n in names.items()).items():
        example = (f"its inventory name: on {hosts[0]}, sudo hostnamectl set-hostname "
                   f"{hosts[0]}" if not is_ip(hosts[0]) else
                   f"e.g. on {hosts[0]}, sudo hostnamectl set-hostname gpu01")
        if not name or name in LOCAL_NAMES:
            results.extend(CheckResult(
                "hostname", host, Status.FAIL, f"hostname is {name or 'empty'!r}",
                f"give each node its own name ({example})")
                for host in hosts)
        elif len(hosts) > 1:
            results.extend(CheckResult(
                "hostname", host, Status.FAIL,
                f"hostname {name!r} is shared by {hostrange.fold(hosts)}",
                f"torchrun and NCCL identify nodes by hostname: give each node its own "
                f"({example})") for host in hosts)
        else:
            results.append(CheckResult("hostname", hosts[0], Status.OK, name))
    order = list(names)
    return sorted(results, key=lambda result: order.index(result.host))


@check("name-resolution", "network",
       "every node resolves every node's hostname to its cluster address (not 127.x)")
def name_resolution(context: Context) -> list[CheckResult]:
    peers = [(h, context.facts[h.name].hostname) for h in context.answering()]
    # Every host is this machine (connection local): its cluster address is loopback, so
    # its name should resolve there too; no other machine needs to reach it.
    one_machine = all(h.is_local for h in context.inventory.hosts)
    results = []
    for host in context.answering():
        seen = context.network.get(host.name)
        if seen is None:
            results.append(CheckResult("name-resolution", host.name, Status.SKIP,
                                       "the second probe did not run on this node"))
            continue
        problems, fixes = _resolution_problems(peers, context.facts[host.name].hostname or "",
                                               seen.resolved, one_machine)
        if problems:
            results.append(CheckResult("name-resolution", host.name, Status.FAIL,
                                       "; ".join(problems), _resolution_remedy(fixes),
                                       {"resolved": dict(seen.resolved)}))
        else:
            said = f"all {len(peers)} hostnames resolve to cluster addresses" \
                if len(peers) > 1 else "its hostname resolves to its cluster address"
            results.append(CheckResult("name-resolution", host.name, Status.OK, said))
    return results


def _resolution_problems(peers: list[tuple[Host, str | None]], own: str,
                         resolved: Mapping[str, str | None], one_machine: bool
                         ) -> tuple[list[str], list[str]]:
    """What is wrong with the names one node resolves, and the /etc/hosts lines that fix
    it. Worded alike on every node where the cause is the same (a fresh cluster: no node
    knows the others), so that doctor says it once for all of them, not once per node
    with a list of every other node each time."""
    unresolved, problems, fixes = [], [], []
    for peer, name in peers:
        if not name:
            continue
        address = resolved.get(name)
        expected = peer.address if is_ip(peer.address) else None
        whose = "its own hostname" if name == own else name
        if address is None:
            unresolved.append(name)
        elif _is_loopback(address) and not one_machine:
            problems.append(f"{whose} resolves to {address} (loopback)")
        elif expected is not None and address != expected:
            problems.append(f"{whose} resolves to {address}, not {expected}")
        else:
            continue
        if expected is not None:
            fixes.append(f"{expected} {name}")
    if own in unresolved:
        unresolved.remove(own)
        problems.insert(0, "its own hostname does not resolve")
    others = [name for _, name in peers if name and name != own]
    if others and sorted(unresolved) == sorted(others):
        problems.insert(0, "no other node's hostname resolves" if len(others) > 1
                        else "the other node's hostname does not resolve")
        # every node's line, its own included: the same lines for every node
        fixes = [f"{peer.address} {name}" for peer, name in peers
                 if name and is_ip(peer.address)]
    elif unresolved:
        problems.insert(0, f"{hostrange.fold(unresolved)} "
                           f"{'does' if len(unresolved) == 1 else 'do'} not resolve")
    return problems, fixes


def _resolution_remedy(fixes: list[str]) -> str:
    if not fixes:  # provision's hosts block maps inventory addresses: not for DNS names
        return ("fix DNS or /etc/hosts so every hostname resolves to the node's cluster "
                "address (and remove any 127.0.1.1 line naming the host)")
    by_hand = "; ".join(fixes) if len(fixes) <= HOSTS_LINES_SHOWN else (
        "the block `gpucluster provision --only hosts --dry-run` shows")
    return ("gpucluster provision --only hosts (a block at the top of every node's "
            f"/etc/hosts, above any 127.0.1.1 line); by hand, add to /etc/hosts on the "
            f"node: {by_hand} (and remove any 127.0.1.1 line naming the host)")


# A job on some GPUs (launch --gpus) takes rendezvous_port + its first GPU's index, where
# cluster.rendezvous_ports reaches that far: jobs on separate GPUs then each have a port.
SIDE_BY_SIDE_FIX = ("; to run jobs on separate GPUs side by side, give each its own port: "
                    "cluster.rendezvous_ports: 8 in the inventory (a job on GPU k and up "
                    "takes rendezvous_port + k), then gpucluster provision --only firewall")


@check("rendezvous-port", "network",
       "the rendezvous port on the head node is reachable from every other node",
       sections=("port",))
def rendezvous_port(context: Context) -> list[CheckResult]:
    head = context.inventory.head
    port = context.inventory.cluster.rendezvous_port
    note = context.rendezvous_note
    results = []
    blocked: list[str] = []  # the addresses of the nodes that cannot reach the head
    busy = note is not None and note.startswith("busy")
    for host in context.answering():
        if host.name == head.name:
            job = note.partition("gpucluster job ")[2] if note else ""
            if busy and job.startswith(SMOKE_PREFIX):  # no record: nothing to stop
                results.append(CheckResult(
                    "rendezvous-port", host.name, Status.FAIL,
                    f"port {port} is held by a smoke test ({job}) on the head node",
                    f"let it finish: {SMOKE_ENDS}"))
            elif busy and job:
                results.append(CheckResult(
                    "rendezvous-port", host.name, Status.FAIL,
                    f"port {port} is held by gpucluster job {job} on the head node",
                    f"let it finish, or end it: gpucluster stop {job}" + (
                        SIDE_BY_SIDE_FIX if context.gpus is not None
                        and context.inventory.cluster.rendezvous_ports == 1 else "")))
            elif busy:
                results.append(CheckResult(
                    "rendezvous-port", host.name, Status.FAIL,
                    f"port {port} is already in use on the head node",
                    f"find it with: sudo ss -ltnp 'sport = :{port}' and stop it (a leftover "
                    f"job?), or set cluster.rendezvous_port to a free port"))
            elif note is not None:
                results.append(CheckResult("rendezvous-port", host.name, Status.SKIP, note))
            else:
                results.append(CheckResult("rendezvous-port", host.name, Status.OK,
                                           f"head node: a test listener opened port {port}"))
            continue
        state = context.network.get(host.name)
        if note is not None and not busy:  # no listener: a probe result would mislead
            results.append(CheckResult("rendezvous-port", host.name, Status.SKIP, note))
        elif state is None or state.port is None:
            results.append(CheckResult("rendezvous-port", host.name, Status.SKIP,
                                       note or "the port probe did not run on this node"))
        elif state.port == "open":
            results.append(CheckResult("rendezvous-port", host.name, Status.OK,
                                       f"reaches {head.name}:{port}"))
        elif busy and state.port == "refused":  # a refusal from whatever holds it there
            results.append(CheckResult(
                "rendezvous-port", host.name, Status.SKIP,
                f"not judged: what holds port {port} on {head.name} refused the connection, "
                f"which says nothing of a firewall (see {head.name}'s finding)"))
        else:
            how = PORT_STATES.get(state.port, state.port)
            results.append(CheckResult("rendezvous-port", host.name, Status.FAIL,
                                       f"cannot reach {head.name} ({head.address}):{port}: "
                                       f"{how}"))
            blocked.append(host.address)
    # One rule for every blocked node (iptables takes a list of sources), so that the
    # nodes' findings are alike and said once, not once per node with its own address.
    remedy = (f"gpucluster provision --only firewall (opens tcp/{port} and NCCL's ports to "
              f"the cluster's addresses only, on every node); by hand, on {head.name}: sudo "
              f"iptables -I INPUT -p tcp --dport {port} -s {','.join(blocked)} -j ACCEPT; a "
              f"cloud security group may drop it too")
    return [dataclasses.replace(r, remedy=remedy) if r.status is Status.FAIL and
            r.host != head.name else r for r in results]


def cluster_address(context: Context, host: Host) -> str | None:
    """The IP the node's cluster traffic leaves from: its inventory address, or what its
    own hostname resolves to there."""
    if is_ip(host.address):
        return host.address
    own = context.network.get(host.name)
    return own.resolved.get(context.facts[host.name].hostname or "") if own else None


@check("interface", "network",
       "the interface holding each node's cluster address, and whether names match")
def interface(context: Context) -> list[CheckResult]:
    names: dict[str, str] = {}
    results = []
    for host in context.answering():
        facts = context.facts[host.name]
        address = cluster_address(context, host)
        found = facts.interfaces.get(address or "")
        if not facts.lists_interfaces:
            results.append(CheckResult(
                "interface", host.name, Status.SKIP,
                "not judged: this node cannot list its interfaces (`ip` not found: install "
                "iproute2)"))
        elif found is None:
            results.append(CheckResult(
                "interface", host.name, Status.WARN,
                f"cluster address {host.address} is not on any interface of this node",
                "use the node's own IP as its inventory address (behind NAT, NCCL and gloo "
                "need NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set by hand)",
                {"interfaces": dict(facts.interfaces)}))
        else:
            names[host.name] = found
    parity_results = parity("interface", names, Status.WARN, "interface",
                            "names differ: set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to a "
                            "comma-separated list of these names (gpucluster launch sets them "
                            "per node)")
    if len(set(names.values())) == 1 and names:
        only = next(iter(names.values()))
        parity_results = [CheckResult(r.name, r.host, r.status, r.message + f": use "
                                      f"NCCL_SOCKET_IFNAME={only} GLOO_SOCKET_IFNAME={only}")
                          for r in parity_results]
    return results + parity_results


@check("infiniband", "network", "InfiniBand ports active, same count and rate on every node")
def infiniband(context: Context) -> list[CheckResult]:
    ports = {h.name: context.facts[h.name].infiniband for h in context.answering()}
    if not any(ports.values()):
        return [CheckResult("infiniband", h, Status.SKIP, "no InfiniBand ports") for h in ports]
    results = []
    shapes: dict[str, str] = {}
    for host, found in ports.items():
        down = [f"{port} {state}" for port, (state, _) in found.items() if "ACTIVE" not in state]
        if not found:
            results.append(CheckResult("infiniband", host, Status.FAIL,
                                       "no InfiniBand ports (the other nodes have some)",
                                       "install the HCA driver (MLNX_OFED / rdma-core) and "
                                       "check the card with ibstat"))
        elif down:
            results.append(CheckResult("infiniband", host, Status.FAIL,
                                       f"ports not active: {', '.join(down)}",
                                       "check cables and the subnet manager (ibstat, "
                                       "sminfo); a port must be ACTIVE to carry NCCL traffic"))
        else:
            rates = sorted({rate for _, rate in found.values()})
            shapes[host] = f"{len(found)} ports at {', '.join(rates)}"
    results.extend(parity("infiniband", shapes, Status.WARN, "InfiniBand",
                          "a slower or missing link slows every collective: check ibstat"))
    return results
