"""Starting a job: doctor's readiness checks, the work dir sync, then torchrun on every
node at once; nothing starts unless every node can."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucluster import hostrange, interrupts, reports
from gpucluster.doctor import gpu_selection
from gpucluster.doctor.runner import DEFAULT_PROBE_TIMEOUT_S
from gpucluster.env_names import masked
from gpucluster.errors import GpuclusterError, Interrupted
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import node_scripts, outside_slurm, workdir
from gpucluster.launch.control import stop
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import LaunchRefused, LaunchRequest
from gpucluster.launch.preflight import checks_for, mesh_warning, preflight, refusing
from gpucluster.launch.request import check_request, gpus_found, job_inventory
from gpucluster.nproc import check_fit, check_nproc, nproc_for
from gpucluster.remote.connection import shell_path
from gpucluster.remote.result import CommandResult, FanoutResult, HostFailure
from gpucluster.remote.session import Session
from gpucluster.remote.waiting import WaitingShells
from gpucluster.state import exclusive
from gpucluster.torchrun import (
    SOCKET_IFNAME_VARIABLES,
    TORCHRUN_LOG_DIR,
    TORCHRUN_LOG_DIR_SHELL,
    TorchrunSpec,
    command_line,
    interface_exports,
    node_images_dir,
    torchrun_argv,
)
from gpucluster.wording import counted, size

RESTARTABLE_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # set for --max-restarts
LARGE_SYNC_BYTES = 100 << 20  # sent to one node: worth naming what is that big
LARGE_FILE_BYTES = 10 << 20


def job_env(inventory: Inventory, extra: Mapping[str, str]) -> dict[str, str]:
    return {**inventory.cluster.env, **extra}


def sync_summary(results: Mapping[str, workdir.SyncResult], planned: bool = False) -> str:
    """"synced: 1 sent (2.1 KiB), 0 deleted, 2 unchanged on node[1-3]", folded; planned,
    "1 to send (2.1 KiB), 0 to delete, ...": launch's changes go with the start, and a
    node can still refuse them (a full disk), so it says what will go, not what went."""
    sent, deleted = ("to send", "to delete") if planned else ("sent", "deleted")
    groups = hostrange.hosts_by((result, node) for node, result in results.items())
    return ("" if planned else "synced: ") + "; ".join(
        f"{r.sent} {sent} ({size(r.bytes_sent)}), {r.deleted} {deleted}, "
        f"{r.unchanged} unchanged on {hostrange.fold(nodes)}" for r, nodes in groups.items())


def large_files_note(plans: Mapping[str, workdir.SyncPlan]) -> str | None:
    """Name the largest files when a sync sends much: a dataset or checkpoint left in
    the work dir goes to every node, on every change, unless it is ignored."""
    most = max((plan.bytes_to_send for plan in plans.values()), default=0)
    if most < LARGE_SYNC_BYTES:
        return None
    sending = {f.path: f.size for plan in plans.values() for f in plan.send}
    largest = sorted(((p, n) for p, n in sending.items() if n >= LARGE_FILE_BYTES),
                     key=lambda item: -item[1])[:3]
    what = ", ".join(f"{p} ({size(n)})" for p, n in largest) if largest else \
        f"{counted(len(sending), 'file')}, none of them large"
    return (f"{size(most)} to send to a node; "
            f"the largest files: {what}; data the nodes have another way belongs in "
            f".gpuclusterignore")


def code_dir_for(inventory: Inventory, local_dir: Path) -> str:
    """The node's copy of the work dir: <work_dir>/<directory name>, shell-quoted."""
    return f"{shell_path(inventory.cluster.work_dir)}/{shlex.quote(local_dir.resolve().name)}"


# -- start


def launch(session: Session, inventory: Inventory, store: JobStore,
           request: LaunchRequest,
           on_phase: Callable[[str], None] | None = None) -> JobRecord:
    """Check, sync and start the job on every node; nothing starts unless all can. One
    launch at a time from beside an inventory: a second one is refused, not raced."""
    with exclusive(store.root.parent, "launch"):
        return _launch(session, inventory, store, request, on_phase)


def _launch(session: Session, inventory: Inventory, store: JobStore, request: LaunchRequest,
            on_phase: Callable[[str], None] | None) -> JobRecord:
    phase = on_phase or (lambda _: None)
    files, script = check_request(request)
    check_nproc(inventory, request.nproc_per_node)
    if request.image and request.image.endswith(".sqsh"):
        raise GpuclusterError(f"{request.image}: provision distributes enroot images, but "
                              f"launch does not run them yet (fix: use an OCI image or an "
                              f"Apptainer .sif)")
    env = job_env(inventory, request.env)
    if request.max_restarts and RESTARTABLE_STORE not in env:
        # Without it, a torchrun restart's workers dial the previous round's store and
        # peers and the job never re-forms (pytorch/pytorch#135712; seen on the sandbox).
        env[RESTARTABLE_STORE] = "1"
    chosen = gpu_selection.from_env(env)  # launch --gpus
    inventory = job_inventory(inventory, chosen)  # its rendezvous port
    # One login per node: the checks run in the shells that then start the job, so the
    # start costs one message on an open channel, not a second login (whose scripts can
    # take longer than the start itself).
    with WaitingShells(session, inventory.hosts, env=env,
                       timeout=DEFAULT_PROBE_TIMEOUT_S + workdir.SYNC_TIMEOUT_S + 60) as shells:
        return _check_and_start(session, inventory, store, request, phase, env, shells,
                                files, script, chosen)


def _check_and_start(session: Session, inventory: Inventory, store: JobStore,
                     request: LaunchRequest, phase: Callable[[str], None],
                     env: dict[str, str], shells: WaitingShells,
                     files: dict[str, workdir.LocalFile], script: str,
                     chosen: gpu_selection.GpuSelection | None) -> JobRecord:
    phase("checking nodes (running jobs, GPUs and their processes, rendezvous port, "
          "ports and MTU between nodes, tools"
          + ("" if request.image else ", torchrun and torch's build")
          + (", SSH between nodes" if request.nodes_stop_at_once else "") + ")")
    code_dir = code_dir_for(inventory, request.workdir)
    results, listed = preflight(session, inventory, shells, code_dir, checks_for(request),
                                chosen)
    findings = refusing(results)
    if findings:
        named = {f.host for f in findings}
        others = [h.name for h in inventory.hosts if h.name not in named]
        raise LaunchRefused(f"{hostrange.fold(sorted(named))} not ready for a new job" + (
            f" (fix what the findings say, or start on the others only: -w "
            f"{hostrange.fold(others)})" if others else ""), findings)
    # the processes per node where the inventory has no gpus
    found = check_fit(inventory, request.nproc_per_node, gpus_found(listed, chosen),
                      chosen is not None)
    if (no_mesh := mesh_warning(results)) is not None:
        phase(no_mesh)
    beside_slurm = outside_slurm.warning(listed, [h.name for h in inventory.hosts],
                                         request.script, request.args)
    if beside_slurm is not None:
        phase(beside_slurm)
    # The changes go with the start, in one round trip per node: what each node lacks is
    # known from the listing that came back with the checks.
    ignored = workdir.IgnoreRules(request.workdir).ignored
    planned = session.map(inventory.hosts, lambda c: workdir.plan_for(
        c, files, code_dir, listed.get(c.host), ignored))
    if planned.failures:
        raise GpuclusterError("sync failed on " + "; ".join(
            f"{n}: {f.message}" for n, f in planned.failures.items()))
    plans = {node: _Sync(code_dir, plan, needed)
             for node, (plan, needed) in planned.values.items()}
    phase(f"syncing {request.workdir} ({counted(len(files), 'file')}) to "
          f"{counted(len(inventory.hosts), 'node')} with the start: "
          + sync_summary({n: workdir.result_of(s.plan) for n, s in plans.items()}, planned=True))
    note = large_files_note({n: s.plan for n, s in plans.items()})
    if note is not None:
        phase(note)
    job_id = store.new_id()
    record = JobRecord(
        id=job_id, script=script, args=list(request.args),
        hosts=[h.name for h in inventory.hosts], code_dir=code_dir,
        jobs_dir=f"{shell_path(inventory.cluster.work_dir)}/jobs", started_at=time.time(),
        nproc_per_node={h.name: nproc_for(h, request.nproc_per_node, found.get(h.name),
                                          chosen is not None)
                        for h in inventory.hosts},
        image=request.image, attempt=request.attempt, run=request.run or "",
        checkpoint_dir=f"{shell_path(inventory.cluster.work_dir)}/checkpoints/"
                       f"{request.run or job_id}", debug=request.debug, module=request.module,
        inventory=str(inventory.path.resolve()),
        endpoints={h.name: h.endpoint for h in inventory.hosts})
    record = dataclasses.replace(record, env=masked(env, request.secret_env))
    store.save(record)
    phase(f"starting job {record.id} (torchrun on {counted(len(inventory.hosts), 'node')})")
    # Ctrl-C reaches the start as WaitingShells.run's Interrupted; around it, presses are
    # absorbed, so none lands between that and the clean-up stop below.
    with interrupts.deferred(lambda: None):
        return _start_everywhere(session, inventory, store, record, request, env, shells,
                                 files, plans)


def _start_everywhere(session: Session, inventory: Inventory, store: JobStore,
                      record: JobRecord, request: LaunchRequest, env: dict[str, str],
                      shells: WaitingShells, files: Mapping[str, workdir.LocalFile],
                      plans: Mapping[str, _Sync]) -> JobRecord:
    sending = False  # past the shared tars, made before any node is sent anything
    try:
        with workdir.tar_streams(request.workdir, {n: s.plan.send for n, s in plans.items()
                                                   if s.needed}, sorted(files)) as tars:
            sending = True
            ran = shells.run({host.name: (_start_script(inventory, host, record, request, env,
                                                        plans[host.name]),
                                          tars.get(host.name))
                              for host in inventory.hosts})
        started = FanoutResult(ran.hosts, {n: _started(r) for n, r in ran.values.items()},
                               ran.failures)
    except Interrupted:
        stop(session, inventory, record, grace_s=2.0)  # fresh connections: those closed
        raise Interrupted(f"interrupted while starting job {record.id}; stopped it on "
                          f"every node") from None
    except GpuclusterError as error:  # a work dir file unreadable while it was made...
        if not sending:  # ...into the shared tars: no node was sent a thing, or started
            shutil.rmtree(store.directory(record.id), ignore_errors=True)
            raise GpuclusterError(f"nothing was started: {error}") from None
        # ...or while it was sent: a node it was not sent to started.
        stop(session, inventory, record, grace_s=2.0)
        raise GpuclusterError(f"job {record.id} did not start everywhere, so it was stopped "
                              f"on every node: {error}") from None
    problems = _start_problems(started.values, started.failures)
    if problems:
        stop(session, inventory, record, grace_s=2.0)
        raise GpuclusterError(f"job {record.id} did not start everywhere, so it was stopped "
                              f"on every node: " + "; ".join(problems))
    runtimes = {n: v.runtime for n, v in started.values.items() if v.runtime}
    if runtimes:
        record = dataclasses.replace(record, container_runtime=runtimes)
        store.save(record)
    return record


@dataclass(frozen=True)
class _Sync:
    """A node's part of the sync, sent with its start."""

    code_dir: str
    plan: workdir.SyncPlan
    needed: bool  # anything to apply at all (else the start goes alone)


@dataclass(frozen=True)
class _Started:
    pid: int | None
    busy: tuple[str, ...]
    error: str
    runtime: str | None


def _start_script(inventory: Inventory, host: Host, record: JobRecord,
                  request: LaunchRequest, env: Mapping[str, str], sync: _Sync) -> str:
    spec = TorchrunSpec(record.id, record.nproc_per_node[host.name], record.script,
                        tuple(record.args), max_restarts=request.max_restarts,
                        log_dir=TORCHRUN_LOG_DIR, module=record.module,
                        local_addr=host.address)
    argv = torchrun_argv(inventory, spec)
    container = None
    images_dir = node_images_dir(inventory.cluster.work_dir)
    if request.image:
        argv[0] = "torchrun"  # the image's own, not the host's
        names = sorted({*env, *node_scripts.JOB_ENV_NAMES, *SOCKET_IFNAME_VARIABLES,
                        *(node_scripts.DEBUG_ENV_NAMES if record.debug else ())})
        container = node_scripts.Container(request.image, record.container_name(),
                                           host.jobs_use_gpus,
                                           names)
    # Every word quoted, except the log dir, which the node's shell expands.
    command = command_line(argv, {TORCHRUN_LOG_DIR: TORCHRUN_LOG_DIR_SHELL})
    if container is not None:
        command = node_scripts.container_command(container, command, images_dir)
    head_port = inventory.cluster.rendezvous_port if host.name == inventory.head.name else None
    apply = (workdir.apply_command(sync.code_dir, sync.plan.delete, host.name,
                                   gzipped=workdir.sent_gzipped(sync.plan.send))
             if sync.needed else "")
    peers = [h.name for h in inventory.hosts if h.name != host.name]
    peer_stop = (node_scripts.peer_stop(record, host.name, peers, request.stop_peers_grace_s,
                                        request.stop_peers_after_s)
                 if request.stop_peers_grace_s is not None and peers else None)
    return node_scripts.start_script(record, host.name, command,
                                     interface_exports(host, env), container is not None,
                                     head_port, on_cpu=not host.jobs_use_gpus,
                                     sync_apply=apply, python=inventory.cluster.python,
                                     image_check=node_scripts.image_check(container, images_dir)
                                     if container is not None else "", peer_stop=peer_stop,
                                     gpus=chosen.indices if (
                                         chosen := gpu_selection.from_env(env)) else "")


def _started(result: CommandResult) -> _Started:
    markers = reports.by_kind(result.stdout)
    pid = markers.get("started", [""])[0]
    errors = markers.get("error", []) + [
        f"port {port} is in use (fix: find it with ss -ltnp 'sport = :{port}' and end it, "
        f"or set cluster.rendezvous_port)" for port in markers.get("port-busy", [])]
    why = _last_line(result.stderr)
    error = "; ".join(errors)
    if error and why:
        error = f"{error} ({why})"  # e.g. tar's "No space left on device"
    return _Started(int(pid) if pid.isdigit() else None, tuple(markers.get("busy", [])),
                    error or why, next(iter(markers.get("runtime", [])), None))


def _last_line(text: str) -> str:
    """The last line of a node's stderr that says why; tar ends with a line that says
    only that something before it failed."""
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.endswith(_TAR_SUMMARY)]
    return lines[-1][-200:] if lines else ""


_TAR_SUMMARY = "Exiting with failure status due to previous errors"


def _start_problems(values: Mapping[str, _Started],
                    failures: Mapping[str, HostFailure]) -> list[str]:
    problems = [(f.message, n) for n, f in failures.items()]
    for node, started in values.items():
        if started.busy:
            problems.append((f"job {', '.join(started.busy)} is still running there "
                             f"(fix: gpucluster stop {started.busy[0]})", node))
        elif started.pid is None:
            problems.append((started.error or "torchrun did not start", node))
    # The same problem on many nodes (an image missing everywhere) is said once.
    return [f"{hostrange.fold(nodes)}: {message}"
            for message, nodes in hostrange.hosts_by(problems).items()]
