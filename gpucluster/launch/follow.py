"""Following a job: every node's log streamed into the controller's copy and to the
caller, with fail-fast (the first failed node gets the job stopped everywhere) and
Ctrl-C handling."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpucluster import hostrange, interrupts, reports
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import ended_copies, node_scripts
from gpucluster.launch.control import hosts_of, stop
from gpucluster.launch.failure import failure_of, split_rank
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.log_copy import LogCopy, NoCopy
from gpucluster.launch.model import (
    DEFAULT_GRACE_S,
    FirstFailure,
    JobOutcome,
    NodeState,
    OutputCallback,
    OutputClosed,
    Progress,
    StopResult,
    parse_state,
)
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session

SILENT_NODE_S = 30.0  # no output and no heartbeat this long: the node is taken for lost
FOLLOW_LIMIT_S = 30 * 24 * 3600.0  # a job may run for weeks; heartbeats catch dead nodes
# A node's part of the job is over and nothing of it is left to write to its log.
FINAL_STATES = ("exited", "stopped")


class _Follower:
    """One node's log, streamed into the controller's copy and to the caller."""

    def __init__(self, session: Session, host: Host, record: JobRecord, log: Path,
                 follow: bool, on_output: OutputCallback | None,
                 done: queue.SimpleQueue[tuple[str, NodeState | None]], cap_bytes: int,
                 output_closed: threading.Event, from_byte: int = 0) -> None:
        self.session, self.host, self.record = session, host, record
        self.from_byte = from_byte  # past 0: the log's end only, and no copy of it
        self.log, self.follow, self.on_output, self.done = log, follow, on_output, done
        self.output_closed = output_closed  # shared: the output's reader went away
        self.cap_bytes = cap_bytes
        self.last_heard = time.monotonic()
        self.last_progress = time.monotonic()  # output, or a newer heartbeat file
        self.progressed = False  # any progress yet (imports and rendezvous make none)
        self.heartbeat_mtime = ""
        self.heartbeat: Progress | None = None
        self.state: NodeState | None = None
        self.state_said = ""  # the node's own words for it, kept with a final copy
        self.copy_cut = ""  # why the controller's copy of the log stopped short, if it did

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        copy = LogCopy(self.log, self.cap_bytes) if not self.from_byte else NoCopy()
        stamping = False  # the log and its state have come: the rest is its stamps
        try:
            def on_line(stream: str, line: str) -> None:
                nonlocal stamping
                self.last_heard = time.monotonic()
                if stamping:
                    if stream == "stdout":
                        copy.stamp(line)
                    return
                kind, rest = reports.parse(line) or ("", "")
                if kind == "alive" and stream == "stderr":
                    copy.flush()  # a quiet job's last lines reach the disk within a beat
                    mtime, step = [*rest.split(), "", ""][:2]
                    if mtime not in ("", "-") and rest.strip() != self.heartbeat_mtime:
                        self.heartbeat_mtime = rest.strip()  # a new mtime or step
                        self.last_progress, self.progressed = time.monotonic(), True
                        self._beat(int(step) if step.isdigit() else None)
                    return
                if kind == "state":
                    self.state, self.state_said = parse_state(self.host.name, rest), rest
                    return
                if kind == "caught-up" and stream == "stdout":
                    copy.caught_up()  # the log as it was at the start has come
                    return
                if kind == "times" and self.state is not None:
                    stamping = True
                    return
                rank, text = split_rank(line)
                # A rank's own line is progress; torchrun's (its start-up warnings, printed
                # before the workers have even imported torch) is not, else the hang
                # timer would be armed during the imports.
                if rank is not None:
                    self.last_progress, self.progressed = time.monotonic(), True
                copy.write(line)
                if self.on_output is not None and not self.output_closed.is_set():
                    try:
                        self.on_output(self.host.name, rank, text)
                    except OutputClosed:  # the copy goes on; follow() decides the rest
                        self.output_closed.set()

            self.session.connection(self.host).run(
                node_scripts.follow_script(self.record, self.host.name, self.follow,
                                           from_byte=self.from_byte),
                timeout=FOLLOW_LIMIT_S if self.follow else 120, on_line=on_line)
            state = self.state or NodeState(self.host.name, "lost", None,
                                            "the log ended without a state")
        except RemoteError as error:
            state = self.state or NodeState(self.host.name, "unreachable", None,
                                            error.message)
        except Exception as error:  # else the wait for this node's end would never end
            state = self.state or NodeState(self.host.name, "lost", None,
                                            f"following its log failed: {error!r}")
        finally:
            # A node that no longer has the job (its work dir wiped, the node re-imaged)
            # sends no log: the controller's copy is all that is left, so it is kept.
            ended = self.state is not None and self.state.state in FINAL_STATES
            copy.close(answered=self.state is not None and self.state.state != "missing",
                       ended=self.state_said if ended else "")
        self.copy_cut = copy.cut
        self.done.put((self.host.name, state))

    def _beat(self, step: int | None) -> None:
        now = time.time()
        if self.heartbeat is None:
            self.heartbeat = Progress(now, now, step, step)
        else:
            self.heartbeat.last_at = now
            if step is not None:
                self.heartbeat.last_step = step
                if self.heartbeat.first_step is None:
                    self.heartbeat.first_step = step


def follow(session: Session, inventory: Inventory, record: JobRecord, store: JobStore,
           on_output: OutputCallback | None = None, live: bool = True,
           fail_fast: bool = True, stop_on_interrupt: bool = True,
           grace_s: float = DEFAULT_GRACE_S, nodes: Sequence[str] | None = None,
           on_stopping: Callable[[str], None] | None = None,
           hang_timeout_s: float | None = None,
           node_timeout_s: float = SILENT_NODE_S, stop_lost: bool = True,
           from_bytes: Mapping[str, int] | None = None) -> JobOutcome:
    """Stream every node's log (live, or what is there when not) until each node's part
    of the job has ended. With fail_fast, the first node that fails gets the job stopped
    everywhere; Ctrl-C stops it too when stop_on_interrupt. A node silent (no output, no
    heartbeat) for `node_timeout_s` is lost; with `hang_timeout_s`, a job where no node
    made progress (output, or a touch of its heartbeat file) for that long is hung and
    stopped. Without `stop_lost`, a node already lost is not waited for when stopping
    (its connect timeout): the caller deals with it (recovery re-checks it). A node in
    `from_bytes` is followed from that offset of its log on, its copy left as it was.
    A node whose copy here is final is not asked: its lines and state are the copy's."""
    hosts = hosts_of(inventory, record, nodes)
    # Each node's end, and (None) each Ctrl-C: SimpleQueue.put is safe in a signal handler
    done: queue.SimpleQueue[tuple[str, NodeState | None]] = queue.SimpleQueue()
    output_closed = threading.Event()
    ended = ended_copies.recorded(store, record, [h.name for h in hosts
                                                  if h.name not in (from_bytes or {})],
                                  whole=on_output is not None)
    followers = {h.name: _Follower(session, h, record, store.node_log(record.id, h.name),
                                   live, on_output, done, _cap_bytes(inventory, record),
                                   output_closed, (from_bytes or {}).get(h.name, 0))
                 for h in hosts if h.name not in ended}
    store.directory(record.id).mkdir(parents=True, exist_ok=True)
    for follower in followers.values():
        follower.start()
    if on_output is not None and not ended_copies.replay(store, record, ended, on_output):
        output_closed.set()
    for node, recorded in ended.items():
        done.put((node, recorded))  # taken as any node's end: fail-fast included
    outcome = JobOutcome(record)

    def stop_all(why: str, grace: float) -> threading.Thread:
        if on_stopping is not None:
            with contextlib.suppress(OSError):  # a closed stderr must not keep the job on
                on_stopping(why)

        lost = [] if stop_lost else [n for n, s in outcome.states.items()
                                     if s.state == "unreachable"]

        def run() -> None:
            outcome.stopped.update(stop(session, inventory, record, grace,
                                        [h.name for h in hosts if h.name not in lost]))
            outcome.stopped.update({n: StopResult(n, 0, "unreachable", (), "lost: not tried")
                                    for n in lost})
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    stops = _Stops(stop_all, grace_s)
    with interrupts.deferred(lambda: done.put(("", None))):
        # Until every node's part has ended and every stop begun has finished.
        while (len(outcome.states) < len(hosts) or stops.running) \
                and time.monotonic() < stops.deadline:
            try:
                node, state = done.get(timeout=0.5)
            except queue.Empty:
                if len(outcome.states) < len(hosts):
                    _drop_silent(session, followers, outcome.states, node_timeout_s)
                why = None if stops.begun else _stop_reason(
                    followers, outcome, output_closed, stop_on_interrupt,
                    hang_timeout_s if live else None)
                if why is not None:
                    stops.begin(why)
                continue
            if state is None:  # Ctrl-C
                if not stop_on_interrupt:
                    raise KeyboardInterrupt  # logs -f: not ours to stop
                stops.interrupted(again=outcome.interrupted)
                outcome.interrupted = True
                continue
            outcome.states[node] = state
            if fail_fast and live and state.failed and not stops.begun:
                stops.begin(f"{node} failed ({_describe(state)}): stopping the job on every "
                            f"node")
            left = [n for n, s in outcome.states.items() if s.state == "leftover"]
            if fail_fast and live and left and len(outcome.states) == len(hosts) \
                    and not stops.begun:  # a process the script left: ours to end
                stops.begin(f"{hostrange.fold(left)}: torchrun exited 0 leaving processes "
                            f"of the job there: ending them")
    failures = [failure_of(n, s, store.node_log(record.id, n))
                for n, s in outcome.states.items() if s.failed]
    outcome.first_failure = min(failures, key=FirstFailure.order, default=None)
    outcome.progress = {n: f.heartbeat for n, f in followers.items() if f.heartbeat}
    outcome.copies_cut = {n: f.copy_cut for n, f in followers.items() if f.copy_cut}
    return outcome


class _Stops:
    """The stops a follow begins: the first with the grace period; on a Ctrl-C while it
    runs, one more without it. After a Ctrl-C the wait for them is bounded."""

    def __init__(self, start: Callable[[str, float], threading.Thread],
                 grace_s: float) -> None:
        self.start, self.grace_s = start, grace_s
        self.threads: list[threading.Thread] = []
        self.killing = False
        self.deadline = float("inf")

    @property
    def begun(self) -> bool:
        return bool(self.threads)

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def begin(self, why: str) -> None:
        if not self.threads:
            self.threads.append(self.start(why, self.grace_s))

    def interrupted(self, again: bool) -> None:
        if self.deadline == float("inf"):  # the stop's own limit, then the last states
            self.deadline = time.monotonic() + self.grace_s + 35 + node_scripts.HEARTBEAT_S + 3
        if not self.threads:
            self.begin("interrupted: stopping the job on every node")
        elif not self.killing:  # a stop is in its grace period: kill now
            self.killing = True
            self.threads.append(self.start(
                f"interrupted{' again' if again else ''}: killing the job now (no grace "
                f"period) and confirming it is gone", 0.0))


def _stop_reason(followers: Mapping[str, _Follower], outcome: JobOutcome,
                 output_closed: threading.Event, ours: bool,
                 hang_timeout_s: float | None) -> str | None:
    """Why to stop the job now, if anything: the reader of its output went away (as
    Ctrl-C, for a job that is `ours`; else following ends), or no rank made progress
    for `hang_timeout_s`."""
    if output_closed.is_set():
        if not ours:  # logs -f: not ours to stop
            raise OutputClosed("the output's reader went away")
        outcome.interrupted = True
        return "the job's output has no reader any more (a closed pipe): stopping the " \
               "job on every node"
    # Armed once every node has made progress: starting up (imports, the rendezvous) is
    # torchrun's join timeout's to judge, not a hang.
    if hang_timeout_s is None or not followers \
            or not all(f.progressed for f in followers.values()):
        return None
    quiet = time.monotonic() - max(f.last_progress for f in followers.values())
    if quiet <= hang_timeout_s:
        return None
    outcome.hang = f"no rank made progress for {quiet:.0f}s (--hang-timeout {hang_timeout_s:g})"
    return f"{outcome.hang}: stopping the job on every node"


def _cap_bytes(inventory: Inventory, record: JobRecord) -> int:
    """Each node's share of cluster.log_max_mb."""
    return inventory.cluster.log_max_mb * 1024 * 1024 // max(len(record.hosts), 1)


def _drop_silent(session: Session, followers: Mapping[str, _Follower],
                 finished: Mapping[str, NodeState], limit_s: float) -> None:
    """A node that sent neither output nor heartbeat for `limit_s` is gone: close its
    connection so that its follower ends as unreachable."""
    now = time.monotonic()
    for name, follower in followers.items():
        if name not in finished and now - follower.last_heard > limit_s:
            follower.last_heard = now
            session.connection(follower.host).close()


def _describe(state: NodeState) -> str:
    if state.state == "exited":
        return f"torchrun exited {state.exit_code}"
    if state.state == "leftover":
        return state.leftover_cause
    return state.state + (f": {state.detail}" if state.detail else "")
