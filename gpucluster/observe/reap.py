"""`gpucluster reap`: the processes holding GPUs on every node, each told apart as a
running job's (never touched), a leftover of an ended job of ours, or foreign; and the
ending of those asked for, confirmed by listing the GPUs' processes again."""

from __future__ import annotations

import dataclasses
import getpass
import json
import shlex

from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.inventory import Host, Inventory
from gpucluster.observe.model import GpuProcess, node_gpus_command, process_of
from gpucluster.remote.connection import Connection, shell_path
from gpucluster.remote.result import SUDO_N_REFUSAL, HostFailure
from gpucluster.remote.session import Session

LIST_TIMEOUT_S = 60.0
D_STATE_REMEDY = ("it is in uninterruptible sleep (D), waiting on the driver or a device: "
                  "it ends when that returns; if it does not, reset the GPU once nothing "
                  "else uses it (nvidia-smi --gpu-reset -i GPU) or reboot the node")


@dataclasses.dataclass(frozen=True)
class NodeProcesses:
    host: str
    processes: tuple[GpuProcess, ...] = ()
    error: str = ""  # nvidia-smi's or the connection's, when nothing could be listed
    no_gpus: bool = False  # no nvidia-smi there: a CPU node, with nothing to list
    elsewhere: int = 0  # processes on GPUs reap --gpus left out: not listed, never ended


@dataclasses.dataclass(frozen=True)
class Ended:
    """What `--yes` did on one node."""

    host: str
    targets: tuple[GpuProcess, ...]
    left: tuple[tuple[GpuProcess, str], ...] = ()  # still there, and what to do
    freed_mib: int = 0
    error: str = ""

    @classmethod
    def not_run(cls, host: str, targets: tuple[GpuProcess, ...], error: str) -> Ended:
        """The ending could not run there: every target is left, the error says why."""
        return cls(host, targets, tuple((p, "not ended: see the node's error") for p in targets),
                   error=error)


def _list_on(connection: Connection, inventory: Inventory) -> NodeProcesses:
    jobs_dir = f"{shell_path(inventory.cluster.work_dir)}/jobs"
    done = connection.run(node_gpus_command(inventory.cluster.python, "processes", jobs_dir,
                                  shlex.quote(connection.host)), timeout=LIST_TIMEOUT_S)
    try:
        payload = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return NodeProcesses(connection.host, error=(done.stderr.strip()[-300:] or
                                                     f"exit {done.exit_code}"))
    return NodeProcesses(connection.host, tuple(process_of(p) for p in payload["processes"]),
                         str(payload.get("error") or ""), bool(payload.get("no_gpus")))


def list_processes(session: Session, inventory: Inventory, hosts: list[Host],
                   chosen: GpuSelection | None = None) -> dict[str, NodeProcesses]:
    """Every GPU process of each host, or those on the `chosen` GPUs (reap --gpus)."""
    result = session.map(hosts, lambda c: _list_on(c, inventory))
    listed = dict(result.values)
    for host, failure in result.failures.items():
        listed[host] = NodeProcesses(host, error=failure.message)
    if chosen is not None:
        listed = {host: _on(node, chosen) for host, node in listed.items()}
    return {h.name: listed[h.name] for h in hosts}


def _on(node: NodeProcesses, chosen: GpuSelection) -> NodeProcesses:
    kept = tuple(p for p in node.processes if chosen.holds(p.gpu_index, p.gpu_uuid))
    return dataclasses.replace(node, processes=kept,
                               elsewhere=len(node.processes) - len(kept))


def targets(listed: NodeProcesses, foreign: bool) -> list[GpuProcess]:
    """Leftovers, and foreign processes when asked; never a running job's."""
    wanted = ("leftover", "foreign") if foreign else ("leftover",)
    return [p for p in listed.processes if p.owner in wanted]


def end(session: Session, inventory: Inventory, listed: dict[str, NodeProcesses],
        foreign: bool, grace_s: float) -> dict[str, Ended]:
    """TERM, `grace_s`, KILL each target, then list again: what is gone freed its memory."""
    hosts = [h for h in inventory.hosts if h.name in listed and targets(listed[h.name],
                                                                          foreign)]
    result = session.map(hosts, lambda c: _end_on(c, inventory, targets(listed[c.host],
                                                                         foreign),
                                                  grace_s, foreign))
    ended = dict(result.values)
    ended.update({h: _failed(h, listed[h], foreign, f) for h, f in result.failures.items()})
    return ended


def _failed(host: str, listed: NodeProcesses, foreign: bool, failure: HostFailure) -> Ended:
    return Ended.not_run(host, tuple(targets(listed, foreign)), failure.message)


def needing_sudo(inventory: Inventory, listed: dict[str, NodeProcesses],
                 foreign: bool) -> list[Host]:
    """The nodes where a target is another user's (a root job's leftover, a foreign
    process) and the login is not root's: ending it needs sudo there."""
    return [h for h in inventory.hosts if h.name in listed and h.user != "root"
            and _others(h, targets(listed[h.name], foreign))]


def _others(host: Host, doomed: list[GpuProcess]) -> bool:
    return any(p.user != _login(host) for p in doomed)


def _end_on(connection: Connection, inventory: Inventory, doomed: list[GpuProcess],
            grace_s: float, foreign: bool) -> Ended:
    host = inventory.host(connection.host)
    # Another user's process (a root job's leftover, a foreign one) needs sudo to end.
    sudo = _others(host, doomed)
    done = connection.run(node_gpus_command(inventory.cluster.python, "end", f"{grace_s:g}",
                                  *(str(p.pid) for p in doomed)),
                          timeout=grace_s + LIST_TIMEOUT_S, sudo=sudo)
    try:
        left_pids = {int(p["pid"]): str(p.get("state", "?"))
                     for p in json.loads(done.stdout.strip().splitlines()[-1])["left"]}
    except (ValueError, IndexError, KeyError, TypeError):
        said = done.stderr.strip()[-300:] or f"exit {done.exit_code}"
        if sudo and SUDO_N_REFUSAL in said:
            again = "reap --yes --foreign" if foreign else "reap --yes"
            said = (f"ending another user's process needs sudo, and {_login(host)}'s sudo "
                    f"asks a password (fix: {again} --ask-sudo-pass)")
        return Ended.not_run(connection.host, tuple(doomed), said)
    after = _list_on(connection, inventory)
    holding = {p.pid for p in after.processes}
    left = tuple((p, D_STATE_REMEDY if left_pids.get(p.pid) == "D" else
                  "it did not end on KILL: " + ("not permitted (no sudo?)" if not sudo
                                                else "look at it with ps"))
                 for p in doomed if p.pid in left_pids or p.pid in holding)
    freed = sum(p.used_mib or 0 for p in doomed if p.pid not in holding
                and p.pid not in left_pids)
    return Ended(connection.host, tuple(doomed), left, freed, after.error)


def _login(host: Host) -> str:
    return host.user or getpass.getuser()
