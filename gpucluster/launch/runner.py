"""A job's life on the cluster: checks, sync, start on every node, follow the logs with
fail-fast, stop (TERM, then KILL) and confirm nothing of it is left."""

from __future__ import annotations

import contextlib
import queue
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster import hostrange
from gpucluster.doctor.model import REGISTRY, CheckResult, Status
from gpucluster.doctor.runner import run_doctor
from gpucluster.errors import GpuclusterError, Interrupted
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import node_scripts, workdir
from gpucluster.launch.jobs import JobRecord, JobStore, new_job_id
from gpucluster.remote.connection import Connection, shell_path
from gpucluster.remote.result import HostFailure, RemoteError
from gpucluster.remote.session import Session
from gpucluster.torchrun import (
    SOCKET_IFNAME_VARIABLES,
    TorchrunSpec,
    interface_exports,
    node_images_dir,
    nproc_for,
    torchrun_argv,
)

# Doctor's checks that decide whether a job can start: no job of ours still running,
# no process holding a GPU, and the rendezvous port free on the head and reachable.
PREFLIGHT_CHECKS = ("jobs", "gpu-processes", "rendezvous-port")
DEFAULT_GRACE_S = 10.0
SILENT_NODE_S = 30.0  # no output and no heartbeat this long: the node is taken for lost
FOLLOW_LIMIT_S = 30 * 24 * 3600.0  # a job may run for weeks; heartbeats catch dead nodes
RANK_PREFIX = re.compile(r"^\[(\d+)\]:(.*)$")
FAILURE_TAIL_LINES = 12
TORCHRUN_LOG_DIR = "$GPC_JOB_DIR/torchrun"  # per-rank logs, inside the node's job dir
TORCHRUN_LOG_DIR_SHELL = '"$GPC_JOB_DIR"/torchrun'

OutputCallback = Callable[[str, str | None, str], None]  # node, rank, text


class LaunchRefused(GpuclusterError):
    """A check found the cluster not ready; `findings` say where and how to fix it."""

    exit_code = 1

    def __init__(self, message: str, findings: Sequence[CheckResult] = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


@dataclass(frozen=True)
class LaunchRequest:
    script: str
    args: tuple[str, ...]
    workdir: Path
    nproc_per_node: int | None = None
    max_restarts: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None


@dataclass(frozen=True)
class NodeState:
    node: str
    state: str  # running, exited, stopped, lost, missing, unreachable
    exit_code: int | None = None
    detail: str = ""
    exited_at: float | None = None  # node clock, when torchrun exited

    @property
    def failed(self) -> bool:
        return self.state in ("lost", "unreachable") or (
            self.state == "exited" and self.exit_code != 0)


@dataclass(frozen=True)
class StopResult:
    node: str
    found: int  # processes of the job found
    how: str  # none, term, kill, unreachable
    left: tuple[int, ...] = ()  # pids still there afterwards (should be none)
    detail: str = ""


@dataclass(frozen=True)
class FirstFailure:
    node: str
    state: NodeState
    rank: int | None
    exit_code: int | None  # torchrun's; the failing worker's is in `worker_exit`
    tail: tuple[str, ...]
    worker_exit: int | None = None  # negative: killed by that signal
    failed_at: str = ""  # torchrun's root-cause time (second resolution)
    rank_tail: tuple[str, ...] = ()  # the failing rank's own last lines

    def order(self) -> tuple[str, int, float]:
        """Earliest root cause first; within the same second a worker killed by a signal
        (the OOM killer, a segfault) before peers that errored because it vanished; then
        the time torchrun exited."""
        return (self.failed_at or "~", 0 if (self.worker_exit or 0) < 0 else 1,
                self.state.exited_at or float("inf"))


@dataclass
class JobOutcome:
    record: JobRecord
    states: dict[str, NodeState] = field(default_factory=dict)
    first_failure: FirstFailure | None = None
    stopped: dict[str, StopResult] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.first_failure is not None:
            code = self.first_failure.exit_code
            return code if code is not None and 0 < code < 128 else 1
        if any(s.state != "exited" or s.exit_code != 0 for s in self.states.values()):
            return 1
        return 0


# -- before starting


def preflight(session: Session, inventory: Inventory) -> list[CheckResult]:
    """Doctor's job-readiness checks; everything not OK or SKIP refuses the launch."""
    report = run_doctor(session, inventory, [REGISTRY[name] for name in PREFLIGHT_CHECKS])
    return [r for r in report.results if r.status not in (Status.OK, Status.SKIP)]


def job_env(inventory: Inventory, extra: Mapping[str, str]) -> dict[str, str]:
    return {**inventory.cluster.env, **extra}


def check_request(request: LaunchRequest) -> tuple[dict[str, workdir.LocalFile], str]:
    """The files to send, and the script's path inside the work dir (it must be one of
    those files)."""
    if not request.workdir.is_dir():
        raise GpuclusterError(f"{request.workdir}: no such directory (fix: --workdir DIR)")
    files = workdir.local_files(request.workdir)
    script = Path(request.script)
    candidate = (script if script.is_absolute() else request.workdir / script).resolve()
    try:
        relative = candidate.relative_to(request.workdir.resolve()).as_posix()
    except ValueError:
        relative = None
    if relative is None or not candidate.is_file():
        raise GpuclusterError(f"{request.script}: no such file in {request.workdir} "
                              f"(fix: give the script's path inside the work directory)")
    if relative not in files:
        raise GpuclusterError(f"{relative} is excluded from the sync (by {workdir.IGNORE_FILE} "
                              f"or a virtualenv/VCS rule) (fix: move it or change the rule)")
    return files, relative


def sync_summary(results: Mapping[str, workdir.SyncResult]) -> str:
    """"synced: 1 sent (2.1 KiB), 0 deleted, 2 unchanged on node[1-3]", folded."""
    groups: dict[workdir.SyncResult, list[str]] = {}
    for node, result in results.items():
        groups.setdefault(result, []).append(node)
    return "synced: " + "; ".join(
        f"{r.sent} sent ({r.bytes_sent / 1024:.1f} KiB), {r.deleted} deleted, "
        f"{r.unchanged} unchanged on {hostrange.fold(nodes)}" for r, nodes in groups.items())


def code_dir_for(inventory: Inventory, local_dir: Path) -> str:
    """The node's copy of the work dir: <work_dir>/<directory name>, shell-quoted."""
    return f"{shell_path(inventory.cluster.work_dir)}/{shlex.quote(local_dir.resolve().name)}"


# -- start


def launch(session: Session, inventory: Inventory, store: JobStore,
           request: LaunchRequest,
           on_phase: Callable[[str], None] | None = None) -> JobRecord:
    """Check, sync and start the job on every node; nothing starts unless all can."""
    phase = on_phase or (lambda _: None)
    files, script = check_request(request)
    if request.image and request.image.endswith(".sqsh"):
        raise GpuclusterError(f"{request.image}: provision distributes enroot images, but "
                              f"launch does not run them yet (fix: use an OCI image or an "
                              f"Apptainer .sif)")
    phase("checking nodes (running jobs, GPU processes, rendezvous port)")
    findings = preflight(session, inventory)
    if findings:
        raise LaunchRefused("the cluster is not ready for a new job", findings)
    code_dir = code_dir_for(inventory, request.workdir)
    phase(f"syncing {request.workdir} ({len(files)} files) to {len(inventory.hosts)} nodes")
    synced = session.map(inventory.hosts, lambda c: workdir.sync(c, request.workdir, files,
                                                                 code_dir))
    if synced.failures:
        raise GpuclusterError("sync failed on " + "; ".join(
            f"{n}: {f.message}" for n, f in synced.failures.items()))
    phase(sync_summary(synced.values))
    record = JobRecord(
        id=new_job_id(), script=script, args=list(request.args),
        hosts=[h.name for h in inventory.hosts], code_dir=code_dir,
        jobs_dir=f"{shell_path(inventory.cluster.work_dir)}/jobs", started_at=time.time(),
        nproc_per_node={h.name: nproc_for(h, request.nproc_per_node)
                        for h in inventory.hosts},
        image=request.image)
    store.save(record)
    phase(f"starting job {record.id} (torchrun on {len(inventory.hosts)} nodes)")
    env = job_env(inventory, request.env)
    try:
        started = session.map(inventory.hosts, lambda c: _start_on(
            c, inventory, record, request, env))
    except Interrupted:
        stop(session, inventory, record, grace_s=2.0)  # fresh connections: those closed
        raise Interrupted(f"interrupted while starting job {record.id}; stopped it on "
                          f"every node") from None
    problems = _start_problems(started.values, started.failures)
    if problems:
        stop(session, inventory, record, grace_s=2.0)
        raise GpuclusterError(f"job {record.id} did not start everywhere, so it was stopped "
                              f"on every node: " + "; ".join(problems))
    runtimes = {n: v.runtime for n, v in started.values.items() if v.runtime}
    if runtimes:
        record = JobRecord(**{**record.__dict__, "container_runtime": runtimes})
        store.save(record)
    return record


@dataclass(frozen=True)
class _Started:
    pid: int | None
    busy: tuple[str, ...]
    error: str
    runtime: str | None


def _start_on(connection: Connection, inventory: Inventory, record: JobRecord,
              request: LaunchRequest, env: Mapping[str, str]) -> _Started:
    host = inventory.host(connection.host)
    spec = TorchrunSpec(record.id, record.nproc_per_node[host.name], record.script,
                        tuple(record.args), max_restarts=request.max_restarts,
                        log_dir=TORCHRUN_LOG_DIR)
    argv = torchrun_argv(inventory, spec)
    container = None
    if request.image:
        argv[0] = "torchrun"  # the image's own, not the host's
        names = sorted({*env, *node_scripts.JOB_ENV_NAMES, *SOCKET_IFNAME_VARIABLES})
        container = node_scripts.Container(request.image, record.container_name(),
                                           host.jobs_use_gpus,
                                           names)
    # Every word quoted, except the log dir, which the node's shell expands.
    command = " ".join(TORCHRUN_LOG_DIR_SHELL if word == TORCHRUN_LOG_DIR else
                       shlex.quote(word) for word in argv)
    if container is not None:
        command = node_scripts.container_command(
            container, command, node_images_dir(inventory.cluster.work_dir))
    head_port = inventory.cluster.rendezvous_port if host.name == inventory.head.name else None
    script = node_scripts.start_script(record, host.name, command,
                                       interface_exports(host, env), container is not None,
                                       head_port)
    result = connection.run(script, timeout=60, env=dict(env))
    markers = node_scripts.parse_markers(result.stdout)
    pid = markers.get("started", [""])[0]
    errors = markers.get("error", []) + [
        f"port {port} is in use (fix: find it with ss -ltnp 'sport = :{port}' and end it, "
        f"or set cluster.rendezvous_port)" for port in markers.get("port-busy", [])]
    return _Started(int(pid) if pid.isdigit() else None, tuple(markers.get("busy", [])),
                    "; ".join(errors) or result.stderr.strip()[-200:],
                    next(iter(markers.get("runtime", [])), None))


def _start_problems(values: Mapping[str, _Started],
                    failures: Mapping[str, HostFailure]) -> list[str]:
    problems = [f"{n}: {f.message}" for n, f in failures.items()]
    for node, started in values.items():
        if started.busy:
            problems.append(f"{node}: job {', '.join(started.busy)} is still running there "
                            f"(fix: gpucluster stop {started.busy[0]})")
        elif started.pid is None:
            problems.append(f"{node}: {started.error or 'torchrun did not start'}")
    return problems


# -- stop


def stop(session: Session, inventory: Inventory, record: JobRecord,
         grace_s: float = DEFAULT_GRACE_S,
         nodes: Sequence[str] | None = None) -> dict[str, StopResult]:
    """TERM every process of the job on every node, KILL what is left after `grace_s`,
    and report what was found and whether anything survived."""
    hosts = _hosts_of(inventory, record, nodes)

    def stop_on(connection: Connection) -> StopResult:
        script = node_scripts.stop_script(record, connection.host, grace_s,
                                          record.container_runtime.get(connection.host))
        result = connection.run(script, timeout=grace_s + 30)
        how, found, left = ([*node_scripts.parse_markers(result.stdout).get(
            "stop", [""])[0].split(), "", "", ""])[:3]
        if not how:
            return StopResult(connection.host, 0, "error", (),
                              (result.stderr or result.stdout).strip()[-200:])
        pids = tuple(int(p) for p in left.split(",") if p.isdigit())
        return StopResult(connection.host, int(found) if found.isdigit() else 0, how, pids)

    done = session.map(hosts, stop_on)
    results = dict(done.values)
    for node, failure in done.failures.items():
        results[node] = StopResult(node, 0, "unreachable", (), failure.message)
    return results


def _hosts_of(inventory: Inventory, record: JobRecord,
              nodes: Sequence[str] | None = None) -> list[Host]:
    """The job's hosts as the inventory knows them now (a host since removed is an error)."""
    wanted = list(nodes) if nodes is not None else record.hosts
    missing = [n for n in wanted if n not in {h.name for h in inventory.hosts}]
    if missing:
        raise GpuclusterError(f"job {record.id} ran on {', '.join(missing)}, which the "
                              f"inventory {inventory.path} no longer lists (fix: use the "
                              f"inventory the job was started with)")
    return [inventory.host(n) for n in wanted]


# -- state and logs


def parse_state(node: str, rest: str) -> NodeState:
    """"STATE CODE [EXIT_TIME]" as the node scripts print it; CODE is - when unknown."""
    state, code, when = [*rest.split(), "", "", ""][:3]
    exit_code = int(code) if code.lstrip("-").isdigit() else None
    try:
        exited_at = float(when) if when else None
    except ValueError:
        exited_at = None
    return NodeState(node, state or "lost", exit_code, exited_at=exited_at)


def states(session: Session, inventory: Inventory,
           records: Sequence[JobRecord]) -> dict[str, dict[str, NodeState]]:
    """job id -> node -> state, one round trip per node for all jobs."""
    table: dict[str, dict[str, NodeState]] = {r.id: {} for r in records}
    names = sorted({n for r in records for n in r.hosts} & {h.name for h in inventory.hosts})
    by_node = {n: [r for r in records if n in r.hosts] for n in names}
    jobs_dirs = {r.jobs_dir for r in records}

    def ask(connection: Connection) -> list[str]:
        lines = []
        for jobs_dir in sorted(jobs_dirs):
            mine = [r for r in by_node[connection.host] if r.jobs_dir == jobs_dir]
            if mine:
                output = connection.run(node_scripts.state_script(mine, connection.host,
                                                                  jobs_dir), timeout=30)
                lines += node_scripts.parse_markers(output.stdout).get("job", [])
        return lines

    answers = session.map([inventory.host(n) for n in names], ask)
    for node, lines in answers.values.items():
        for line in lines:
            job_id, _, rest = line.partition(" ")
            if job_id in table:
                table[job_id][node] = parse_state(node, rest)
    for node, failure in answers.failures.items():
        for record in records:
            if node in record.hosts:
                table[record.id][node] = NodeState(node, "unreachable", None, failure.message)
    return table


def split_rank(line: str) -> tuple[str | None, str]:
    """torchrun's tee prefixes each worker line with its global rank: "[3]:text"."""
    match = RANK_PREFIX.match(line)
    return (match.group(1), match.group(2)) if match else (None, line)


def failure_of(node: str, state: NodeState, log: Path) -> FirstFailure:
    """Rank, exit code and time of a node's failure, from torchrun's own report (its
    "Root Cause" block) and the end of the node's log."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() \
        if log.exists() else []
    root = next((i for i, line in enumerate(lines) if "Root Cause" in line), None)
    fields: dict[str, str] = {}
    for line in lines[root:] if root is not None else []:
        name, colon, value = line.strip().partition(":")
        if colon and name.strip() in ("time", "rank", "exitcode"):
            fields.setdefault(name.strip(), value.strip())
    rank = re.match(r"\d+", fields.get("rank", ""))
    worker = re.match(r"-?\d+", fields.get("exitcode", ""))
    prefix = f"[{rank.group()}]:" if rank else None
    rank_lines = [line[len(prefix):] for line in lines if prefix and line.startswith(prefix)]
    return FirstFailure(node, state, int(rank.group()) if rank else None, state.exit_code,
                        tuple(lines[-FAILURE_TAIL_LINES:]),
                        int(worker.group()) if worker else None, fields.get("time", ""),
                        tuple(rank_lines[-FAILURE_TAIL_LINES:]))


class _Follower:
    """One node's log, streamed into the controller's copy and to the caller."""

    def __init__(self, session: Session, host: Host, record: JobRecord, log: Path,
                 follow: bool, on_output: OutputCallback | None,
                 done: queue.Queue[tuple[str, NodeState]]) -> None:
        self.session, self.host, self.record = session, host, record
        self.log, self.follow, self.on_output, self.done = log, follow, on_output, done
        self.last_heard = time.monotonic()
        self.state: NodeState | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            with self.log.open("w", encoding="utf-8") as copy:
                def on_line(stream: str, line: str) -> None:
                    self.last_heard = time.monotonic()
                    if stream == "stderr" and line == "@@gpc-alive":
                        return
                    if line.startswith("@@gpc-state "):
                        self.state = parse_state(self.host.name, line[len("@@gpc-state "):])
                        return
                    copy.write(line + "\n")
                    copy.flush()
                    if self.on_output is not None:
                        rank, text = split_rank(line)
                        self.on_output(self.host.name, rank, text)

                connection = self.session.connection(self.host)
                connection.run(node_scripts.follow_script(self.record, self.host.name,
                                                          self.follow),
                               timeout=FOLLOW_LIMIT_S if self.follow else 120,
                               on_line=on_line)
            state = self.state or NodeState(self.host.name, "lost", None,
                                            "the log ended without a state")
        except RemoteError as error:
            state = NodeState(self.host.name, "unreachable", None, error.message)
        self.done.put((self.host.name, state))


def follow(session: Session, inventory: Inventory, record: JobRecord, store: JobStore,
           on_output: OutputCallback | None = None, live: bool = True,
           fail_fast: bool = True, stop_on_interrupt: bool = True,
           grace_s: float = DEFAULT_GRACE_S, nodes: Sequence[str] | None = None,
           on_stopping: Callable[[str], None] | None = None) -> JobOutcome:
    """Stream every node's log (live, or what is there when not) until each node's part
    of the job has ended. With fail_fast, the first node that fails gets the job stopped
    everywhere; Ctrl-C stops it too when stop_on_interrupt."""
    hosts = _hosts_of(inventory, record, nodes)
    done: queue.Queue[tuple[str, NodeState]] = queue.Queue()
    followers = {h.name: _Follower(session, h, record, store.node_log(record.id, h.name),
                                   live, on_output, done) for h in hosts}
    store.directory(record.id).mkdir(parents=True, exist_ok=True)
    for follower in followers.values():
        follower.start()
    outcome = JobOutcome(record)
    stopper: threading.Thread | None = None

    def stop_all(why: str) -> threading.Thread:
        if on_stopping is not None:
            on_stopping(why)

        def run() -> None:
            outcome.stopped.update(stop(session, inventory, record, grace_s))
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    try:
        while len(outcome.states) < len(hosts):
            try:
                node, state = done.get(timeout=0.5)
            except queue.Empty:
                _drop_silent(session, followers, outcome.states)
                continue
            outcome.states[node] = state
            if fail_fast and live and state.failed and stopper is None:
                stopper = stop_all(f"{node} failed ({_describe(state)}): stopping the job "
                                   f"on every node")
        if stopper is not None:
            stopper.join(grace_s + 35)
    except KeyboardInterrupt:
        outcome.interrupted = True
        if not stop_on_interrupt:
            raise
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
            if stopper is None:
                stopper = stop_all("interrupted: stopping the job on every node")
            stopper.join(grace_s + 35)
            # The followers end once the job has: take their final states too.
            deadline = time.monotonic() + node_scripts.HEARTBEAT_S + 3
            while len(outcome.states) < len(hosts) and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    node, state = done.get(timeout=0.2)
                    outcome.states[node] = state
    failures = [failure_of(n, s, followers[n].log) for n, s in outcome.states.items()
                if s.failed]
    outcome.first_failure = min(failures, key=FirstFailure.order, default=None)
    return outcome


def _drop_silent(session: Session, followers: Mapping[str, _Follower],
                 finished: Mapping[str, NodeState]) -> None:
    """A node that sent neither output nor heartbeat for SILENT_NODE_S is gone: close its
    connection so that its follower ends as unreachable."""
    now = time.monotonic()
    for name, follower in followers.items():
        if name not in finished and now - follower.last_heard > SILENT_NODE_S:
            follower.last_heard = now
            session.connection(follower.host).close()


def _describe(state: NodeState) -> str:
    if state.state == "exited":
        return f"torchrun exited {state.exit_code}"
    return state.state + (f": {state.detail}" if state.detail else "")

