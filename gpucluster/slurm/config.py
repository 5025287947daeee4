"""The files Slurm runs from, built from the nodes' own facts: slurm.conf (configless,
on the controller host only), gres.conf, cgroup.conf, the epilog every node runs, and
systemd's drop-in that lets slurmd start without a local slurm.conf."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpucluster.inventory import Inventory, SlurmSettings
from gpucluster.slurm.facts import NodeFacts
from gpucluster.slurm_states import EPILOG, SLURM_CONF
from gpucluster.templating import render

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
GRES_CONF = "/etc/slurm/gres.conf"
CGROUP_CONF = "/etc/slurm/cgroup.conf"
SLURMD_DROPIN = "/etc/systemd/system/slurmd.service.d/gpucluster.conf"
MUNGE_KEY = "/etc/munge/munge.key"
EPILOG_GRACE_S = 5


@dataclass(frozen=True)
class ManagedFile:
    path: str
    text: str
    mode: str


def firewall_ports(settings: SlurmSettings) -> list[str]:
    """What the firewall opens to peers for Slurm: slurmctld, slurmd and srun's range
    (as iptables writes a range, low:high)."""
    return [str(SLURMCTLD_PORT), str(SLURMD_PORT), settings.srun_ports.replace("-", ":")]


def controller_name(settings: SlurmSettings | None, inventory: Inventory) -> str:
    """The slurmctld host: `slurm.controller`, else the head."""
    return (settings.controller if settings else None) or inventory.head.name


def conf_server(controller: NodeFacts) -> str:
    return f"{controller.address}:{SLURMCTLD_PORT}"


def slurm_conf(cluster: str, settings: SlurmSettings, controller: NodeFacts,
               nodes: Sequence[NodeFacts]) -> str:
    return render("slurm/slurm.conf.j2", cluster=cluster, controller=controller,
                  nodes=nodes, partition=settings.partition, srun_ports=settings.srun_ports,
                  cgroups=settings.cgroups, epilog=EPILOG, node_timeout=settings.node_timeout,
                  ports={"slurmctld": SLURMCTLD_PORT, "slurmd": SLURMD_PORT})


def files_for(cluster: str, settings: SlurmSettings, node: NodeFacts,
              controller: NodeFacts, nodes: Sequence[NodeFacts]) -> list[ManagedFile]:
    """Every file the step keeps on `node` (the munge key aside: it is never shown)."""
    wanted = [ManagedFile(EPILOG, render("slurm/epilog.sh.j2", grace_s=EPILOG_GRACE_S),
                          "755")]
    if node.host == controller.host:
        wanted += [
            ManagedFile(SLURM_CONF, slurm_conf(cluster, settings, controller, nodes), "644"),
            ManagedFile(GRES_CONF, render("slurm/gres.conf.j2", nodes=nodes), "644"),
            ManagedFile(CGROUP_CONF, render("slurm/cgroup.conf.j2"), "644"),
        ]
    if node.systemd:
        wanted.append(ManagedFile(SLURMD_DROPIN, render(
            "slurm/slurmd-dropin.conf.j2", slurmd="/usr/sbin/slurmd",
            conf_server=conf_server(controller)), "644"))
    return wanted


def managed_paths() -> list[str]:
    """Every path files_for may write, in a fixed order (read back in one round)."""
    return [EPILOG, SLURM_CONF, GRES_CONF, CGROUP_CONF, SLURMD_DROPIN]
