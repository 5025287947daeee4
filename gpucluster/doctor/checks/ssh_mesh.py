"""The nodes' own SSH between them (provision's ssh-mesh step): a detached job's node that
fails stops the job on the others over it, and --recover copies a run's checkpoints to a
spare over it. Without it a job still runs; those two do not.

Each node logs in to the next one in the inventory (the last to the first) as they do:
its own ssh client and config, the peer's name, keys only (BatchMode), the host key
verified. A ring tries every node once as the one logging in and once as the one logged
in to, at one login per node; provision's ssh-mesh step tries every pair."""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.doctor.model import CheckResult, Context, Status, check
from gpucluster.inventory import Inventory
from gpucluster.reports import Section

SECTION = "ssh_mesh"
CONNECT_TIMEOUT_S = 5  # the node's ssh gives up connecting after this long
LOGIN_TIMEOUT_S = 10  # and the whole login after this long
FIX = "gpucluster provision --only ssh-mesh (a cluster key, known_hosts and ssh config on " \
    "every node)"
WITHOUT_IT = "a node where a detached job (launch -d) fails cannot stop it on the " \
    "others, and launch --recover cannot copy checkpoints to a spare"


def ring_peer(inventory: Inventory, host: str) -> str | None:
    """The node `host` logs in to: the next in the inventory, the last's the first; None
    where there is no pair of machines (one node, or every host this machine)."""
    if not inventory.has_machine_pairs:
        return None
    names = [h.name for h in inventory.hosts]
    return names[(names.index(host) + 1) % len(names)]


@dataclass(frozen=True)
class Login:
    """What the probe's login to `peer` said: exit code 0, or why not."""

    peer: str
    exit_code: int
    said: str  # the ssh client's last line on stderr

    @property
    def why(self) -> str:
        if self.exit_code == 124:
            return f"no login within {LOGIN_TIMEOUT_S} s"
        if self.exit_code == 127:
            return "no ssh client on this node"
        return self.said or f"ssh exited {self.exit_code}"


def parse_login(section: Section | None) -> Login | None:
    """The probe's section: `peer NAME`, then what ssh printed; its exit code is ssh's."""
    if section is None:
        return None
    lines = [line.strip() for line in section.output.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("peer "):
        return None
    return Login(lines[0].removeprefix("peer "), section.exit_code,
                 lines[-1][-200:] if len(lines) > 1 else "")


@check("ssh-mesh", "network",
       "each node logs in to the next over SSH, keys only and host key verified (how a "
       "detached job's nodes stop it and --recover copies checkpoints)",
       sections=(SECTION,))
def ssh_mesh(context: Context) -> list[CheckResult]:
    logins = {host.name: parse_login(context.facts[host.name].sections.get(SECTION))
              for host in context.answering()}
    failed = {name: login for name, login in logins.items()
              if login is not None and login.exit_code != 0
              and login.peer not in context.unreachable}
    # A cluster never provisioned fails on every node: one finding for all, with one pair.
    everywhere = len(failed) == len(logins) > 1
    results = []
    for host in context.answering():
        login = logins[host.name]
        peer = ring_peer(context.inventory, host.name)
        if peer is None or login is None:
            why = "a single node" if peer is None else "the probe did not try it"
            results.append(CheckResult("ssh-mesh", host.name, Status.SKIP,
                                       f"not tested: {why}"))
        elif login.exit_code == 0:
            results.append(CheckResult("ssh-mesh", host.name, Status.OK,
                                       f"logs in to {login.peer} with keys, host key verified"))
        elif login.peer in context.unreachable:
            results.append(CheckResult(
                "ssh-mesh", host.name, Status.SKIP,
                f"not tested: {login.peer}, the node it logs in to, did not answer doctor "
                f"(see the ssh check)"))
        else:
            first, seen = next(iter(failed.items()))
            said = f"no node logs in to the next over SSH ({first} to {seen.peer}: " \
                f"{seen.why})" if everywhere else \
                f"cannot log in to {login.peer} over SSH ({login.why})"
            results.append(CheckResult(
                "ssh-mesh", host.name, Status.WARN, f"{said}: {WITHOUT_IT}", FIX,
                {"peer": login.peer, "why": login.why, "exit_code": login.exit_code,
                 "said": login.said}))
    return results
