"""Run the all-reduce smoke test across every node through torchrun, the way jobs run,
and judge it: correctness, bus bandwidth against a threshold, and the slow node."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucluster import hostrange
from gpucluster.doctor.gpu_selection import VISIBLE_DEVICES, GpuSelection, from_env
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.launch.known_causes import error_lines, known_cause
from gpucluster.launch.request import job_inventory
from gpucluster.nproc import check_fit, count_gpus, counted_gpus, known_gpus, nproc_for
from gpucluster.remote.connection import Connection, shell_path
from gpucluster.remote.result import CommandResult, FailureKind, FanoutResult
from gpucluster.remote.session import Session
from gpucluster.smoke import first_round
from gpucluster.torchrun import (
    JOB_VARIABLE,
    SMOKE_PREFIX,
    TorchrunSpec,
    command_line,
    interface_exports,
    torchrun_argv,
)

JOB = Path(__file__).with_name("allreduce_job.py")
SCRIPT = "smoke_allreduce.py"  # its name in the work dir on each node
MARKER = "GPUCLUSTER_SMOKE "
SLOW_BANDWIDTH = 0.5  # a node below half the median of its peers is named slow
SLOW_COMPUTE = 2.0  # ...or taking over twice the median time
ERROR_CHARS = 300  # of a rank's error line: gloo's run to 250 and more
JOIN_TIMEOUT_S = 60  # a node that never joins ends the run in a minute, not torch's ten


@dataclass(frozen=True)
class SmokeReport:
    """What the benchmark measured, and the verdict."""

    backend: str | None
    world_size: int
    sweep: list[dict[str, Any]]
    per_node: dict[str, dict[str, Any]]
    slow: dict[str, str]  # node -> why it is named slow
    problems: list[str]  # why the test failed; empty when it passed
    node_errors: dict[str, str] = field(default_factory=dict)
    gpus: str | None = None  # its CUDA_VISIBLE_DEVICES (--gpus); None: every GPU

    @property
    def passed(self) -> bool:
        return not self.problems


_SIZE = re.compile(r"([0-9]+)\s*([KMG]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZE = 64 << 30  # past any GPU's memory: a typo, not a size


def parse_sizes(text: str) -> str:
    """`--sizes` as the job takes it, byte counts: `auto`, or sizes like 1M,64MiB,1G (K,
    M, G are powers of 1024), checked here rather than failing torchrun on every node."""
    if text.strip().lower() == "auto":
        return "auto"
    counts = []
    for part in text.split(","):
        matched = _SIZE.fullmatch(part.strip())
        count = int(matched[1]) * _UNITS[matched[2].upper()] if matched else 0
        if not 4 <= count <= MAX_SIZE:
            raise GpuclusterError(f"--sizes {text!r}: {part.strip()!r} is not a message size "
                                  f"from 4 bytes to 64G (fix: e.g. --sizes 1M,64M,1G; K, M "
                                  f"and G are KiB, MiB and GiB; or auto)")
        counts.append(str(count))
    return ",".join(counts)


def command_for(inventory: Inventory, host: Host, rendezvous_id: str, nproc: int,
                sizes: str, iterations: int, device: str = "auto") -> str:
    """cd to the work dir, point NCCL/gloo at the cluster interface, start torchrun.
    `device` cuda: every rank must get a GPU (NCCL), never fall back to gloo on the CPU."""
    spec = TorchrunSpec(rendezvous_id, nproc, SCRIPT,
                        ("--sizes", sizes, "--iterations", str(iterations), "--device", device),
                        join_timeout_s=JOIN_TIMEOUT_S, local_addr=host.address)
    argv = command_line(torchrun_argv(inventory, spec))
    return (f"cd {shell_path(inventory.cluster.work_dir)} && "
            + interface_exports(host, inventory.cluster.env)
            + f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}; exec {argv}")


def run_smoke(session: Session, inventory: Inventory, nproc: int | None = None,
              sizes: str = "auto", iterations: int = 5, timeout: float = 300.0,
              min_busbw_gbps: float | None = None,
              chosen: GpuSelection | None = None) -> SmokeReport:
    """On every GPU of each node, or on those `chosen` (smoke --gpus; else the
    inventory's CUDA_VISIBLE_DEVICES), as a job on them runs: its rendezvous port too."""
    rendezvous_id = f"{SMOKE_PREFIX}{uuid.uuid4().hex[:8]}"
    job = JOB.read_bytes()
    env = dict(inventory.cluster.env)
    if chosen is not None:
        env[VISIBLE_DEVICES] = ",".join(chosen.entries)
    chosen = from_env(env)
    inventory = job_inventory(inventory, chosen)
    work_dir = shell_path(inventory.cluster.work_dir)

    def write(connection: Connection) -> CommandResult:
        # Written beside and renamed: on a work dir every node shares (an NFS home), a
        # node still writing must not hand another's torchrun half a script. Its GPUs
        # are counted on the way: a process each where the inventory gives no `gpus`;
        # and what would refuse the run (first_round).
        return connection.run(
            f"{first_round.command(inventory, inventory.host(connection.host))}\n"
            f"mkdir -p {work_dir} && t=$(mktemp {work_dir}/.{SCRIPT}.XXXXXX) && "
            f'cat > "$t" && chmod 644 "$t" && mv -f "$t" {work_dir}/{SCRIPT} && '
            f"{count_gpus(chosen.entries if chosen else None)}", timeout=30, stdin=job)

    def start(connection: Connection) -> CommandResult:
        host = inventory.host(connection.host)
        return connection.run(command_for(inventory, host, rendezvous_id,
                                          nproc_for(host, nproc, gpus.get(host.name),
                                                    chosen is not None),
                                          sizes, iterations, device),
                              timeout=timeout,
                              env={**env, JOB_VARIABLE: f"{rendezvous_id}@{host.name}"})

    # Every node first: a node that cannot take part would leave the others' torchrun
    # waiting for it until the rendezvous times out (a minute), then fail unclearly.
    written = session.map(inventory.hosts, write)
    errors = _errors(written, "writing the script exited")
    if errors:
        return SmokeReport(None, 0, [], {}, {}, [
            f"not run: {hostrange.fold(errors)} could not take part",
            *_folded(errors)], errors)
    refused = first_round.refusals(inventory, written, chosen)
    if refused:
        return SmokeReport(None, 0, [], {}, {}, [f"not run: {problem}" for problem in refused])
    gpus = check_fit(inventory, nproc, {node: count for node, done in written.values.items()
                                        if (count := counted_gpus(done.stdout)) is not None},
                     chosen is not None)
    # Where every node's jobs use its GPUs, a rank that finds none fails the test: gloo on
    # the CPU (what torch falls back to) said `passed` of nodes with a CPU build of torch.
    device = "cuda" if all(known_gpus(h, gpus.get(h.name), chosen is not None)
                           for h in inventory.hosts) else "auto"
    result = session.map(inventory.hosts, start)
    errors = _errors(result, "torchrun exited")
    head = result.values.get(inventory.head.name)
    found = _measurements(head.stdout if head else "")
    if found is None:
        hung = [name for name, failure in result.failures.items()
                if failure.kind is FailureKind.TIMED_OUT]
        return SmokeReport(None, 0, [], {}, {}, [
            "no measurement came back", *_folded(errors), *_likely_causes(result),
            *([f"{hostrange.fold(hung)}: no result within --timeout {timeout:g}s: the "
               f"all-reduce hung. A firewall open on the rendezvous port alone does this "
               f"(NCCL and gloo connect on ports of the ephemeral range), and so do jumbo "
               f"frames the network between the nodes does not carry: gpucluster doctor "
               f"--only rendezvous-port,peer-ports,path-mtu names either"] if hung else [])],
            errors)
    return dataclasses.replace(judge(found, errors, min_busbw_gbps),
                               gpus=",".join(chosen.entries) if chosen else None)


def _folded(errors: dict[str, str]) -> list[str]:
    """`node[1-4]: timed out: ...` once, not a line per node saying the same."""
    return [f"{hostrange.fold(nodes)}: {error}"
            for error, nodes in hostrange.hosts_by((e, n) for n, e in errors.items()).items()]


def _errors(result: FanoutResult[CommandResult], what: str) -> dict[str, str]:
    """Node -> why it gave no result, or `what`, its exit code and its last lines."""
    errors = {name: f"{f.kind.value}: {f.message}" for name, f in result.failures.items()}
    for name, value in result.values.items():
        if not value.ok:
            lines = (value.stdout + value.stderr).strip().splitlines()
            # The rank's own error where it printed one: torchrun's last lines only say
            # that a worker failed.
            said = error_lines(lines)
            errors[name] = f"{what} {value.exit_code}: " + (
                said[-1][:ERROR_CHARS] if said else " | ".join(lines[-3:]))
    return errors


def _likely_causes(result: FanoutResult[CommandResult]) -> list[str]:
    """What the failed nodes' output says the cause was, said once for the nodes alike."""
    causes = {name: cause for name, value in result.values.items() if not value.ok
              and (cause := known_cause((value.stdout + value.stderr).splitlines()))}
    return [f"{hostrange.fold(nodes)}: likely cause: {what} (fix: "
            f"{fix.replace('<node>', hostrange.fold(nodes))})"  # doctor -w takes a range
            for (what, fix), nodes in hostrange.hosts_by(
                ((c.what, c.fix), n) for n, c in causes.items()).items()]


def _measurements(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            data: dict[str, Any] = json.loads(line[len(MARKER):])
            return data
    return None


def judge(found: dict[str, Any], errors: dict[str, str],
          min_busbw_gbps: float | None) -> SmokeReport:
    """Correctness, the threshold, and the slowest stave of the barrel."""
    problems = _folded(errors)
    sweep = found["sweep"]
    wrong = [entry["bytes"] for entry in sweep if not entry["correct"]]
    if wrong:
        problems.append(f"wrong all-reduce results at sizes {wrong} bytes")
    peak = max((entry["busbw_gbps"] for entry in sweep), default=0.0)
    if min_busbw_gbps is not None and peak < min_busbw_gbps:
        problems.append(f"peak busbw {peak:.2f} Gbit/s is under the threshold "
                        f"{min_busbw_gbps:g} Gbit/s")
    per_node: dict[str, dict[str, Any]] = found["per_node"]
    slow = slow_nodes(per_node)
    return SmokeReport(found["backend"], found["world_size"], sweep, per_node, slow,
                       problems, errors)


def slow_nodes(per_node: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Nodes whose link, intra-node bandwidth or compute stands out from their peers,
    with every reason, the link's first (one reason must not hide another)."""
    slow: dict[str, str] = {}

    def name(node: str, why: str) -> None:
        slow[node] = f"{slow[node]}; {why}" if node in slow else why

    for metric, label, low_is_bad in (("link_gbps", "link to the head", True),
                                      ("intra_busbw_gbps", "intra-node all-reduce", True),
                                      ("compute_s", "compute kernel", False)):
        values = {n: v[metric] for n, v in per_node.items() if v.get(metric) is not None}
        if len(values) < 2:
            continue
        for node, value in values.items():
            others = [v for n, v in values.items() if n != node]
            typical = statistics.median(others)
            if low_is_bad and typical > 0 and value < SLOW_BANDWIDTH * typical:
                name(node, f"{label}: {value:.3f} Gbit/s, others about {typical:.3f}")
            elif not low_is_bad and value > SLOW_COMPUTE * typical:
                name(node, f"{label}: {value:.3f} s, others about {typical:.3f} s")
    return slow
