"""Following a job: every node's log streamed into the controller's copy and to the
caller (node_follower), with fail-fast (the first failed node gets the job stopped
everywhere), Ctrl-C handling, and a node lost told from this machine cut off
(lost_contact)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from gpucluster import hostrange, interrupts
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import ended_copies, node_scripts
from gpucluster.launch.control import hosts_of, stop
from gpucluster.launch.failure import failure_in, failure_of
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.lost_contact import LostContact
from gpucluster.launch.model import (
    DEFAULT_GRACE_S,
    FirstFailure,
    JobOutcome,
    NodeState,
    OutputCallback,
    OutputClosed,
    StopResult,
)
from gpucluster.launch.node_follower import NodeFollower
from gpucluster.remote.session import Session

SILENT_NODE_S = 30.0  # no output and no heartbeat this long: the node is taken for lost
# The follow's loop turns every 0.5 s: a gap this long means this process did not run
# (Ctrl-Z, a debugger, a starved machine), not that the nodes went silent.
AWAY_S = 5 * node_scripts.HEARTBEAT_S


def follow(session: Session, inventory: Inventory, record: JobRecord, store: JobStore,
           on_output: OutputCallback | None = None, live: bool = True,
           fail_fast: bool = True, stop_on_interrupt: bool = True,
           grace_s: float = DEFAULT_GRACE_S, nodes: Sequence[str] | None = None,
           say: Callable[[str], None] | None = None,
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
    A node whose copy here is final is not asked: its lines and state are the copy's.
    Live, a node whose connection is lost is judged before it fails (lost_contact): one
    of every node lost at once (this machine's network) is asked again and followed on.
    `say`: what the follow does and why (a stop begun, contact lost), for the user."""
    hosts = hosts_of(inventory, record, nodes)
    watch = _Watch(session, inventory, record, hosts, live, fail_fast, say)
    ended = ended_copies.recorded(store, record, [h.name for h in hosts
                                                  if h.name not in (from_bytes or {})],
                                  whole=on_output is not None)
    watch.followers = {
        h.name: NodeFollower(session, h, record, store.node_log(record.id, h.name), live,
                             on_output, watch.done, _cap_bytes(inventory, record),
                             watch.output_closed, (from_bytes or {}).get(h.name, 0))
        for h in hosts if h.name not in ended}
    store.directory(record.id).mkdir(parents=True, exist_ok=True)
    for follower in watch.followers.values():
        follower.start()
    if on_output is not None and not ended_copies.replay(store, record, ended, on_output):
        watch.output_closed.set()
    for node, recorded in ended.items():
        watch.done.put((node, recorded))  # taken as any node's end: fail-fast included
    watch.run(_Stops(watch.stop_all(stop_lost), grace_s), stop_on_interrupt,
              hang_timeout_s if live else None, node_timeout_s)
    outcome, followers = watch.outcome, watch.followers
    failures = [_failure(n, s, followers.get(n), store.node_log(record.id, n))
                for n, s in outcome.states.items() if s.failed]
    outcome.first_failure = min(failures, key=FirstFailure.order, default=None)
    outcome.progress = {n: f.heartbeat for n, f in followers.items() if f.heartbeat}
    outcome.copies_cut = {n: f.copy_cut for n, f in followers.items() if f.copy_cut}
    return outcome


def _failure(node: str, state: NodeState, follower: NodeFollower | None,
             copy: Path) -> FirstFailure:
    """From the controller's copy of the node's log, or where another process wrote
    that copy, from the lines this follow read itself."""
    own = follower.own_tail if follower is not None else None
    return failure_in(node, state, own) if own is not None else failure_of(node, state, copy)


class _Watch:
    """The nodes' ends as they come, and what follows from each: fail-fast, Ctrl-C, a
    hang, a node lost or this machine cut off."""

    def __init__(self, session: Session, inventory: Inventory, record: JobRecord,
                 hosts: list[Host], live: bool, fail_fast: bool,
                 say: Callable[[str], None] | None) -> None:
        self.session, self.inventory, self.record, self.hosts = session, inventory, record, hosts
        self.live, self.fail_fast, self._say_to = live, fail_fast, say
        # Each node's end, and (None) each Ctrl-C: SimpleQueue.put is safe in a signal
        # handler
        self.done: queue.SimpleQueue[tuple[str, NodeState | None]] = queue.SimpleQueue()
        self.output_closed = threading.Event()
        self.followers: dict[str, NodeFollower] = {}
        self.outcome = JobOutcome(record)
        self.contact = LostContact(session, {h.name: h for h in hosts}, self.say) \
            if live else None
        self.stops: _Stops | None = None
        self.turned = time.monotonic()  # the loop's last turn

    def say(self, words: str) -> None:
        _say(self._say_to, words)

    def stop_all(self, stop_lost: bool) -> Callable[[str, float], threading.Thread]:
        outcome = self.outcome

        def start(why: str, grace: float) -> threading.Thread:
            self.say(why)
            lost = [] if stop_lost else [
                n for n, s in outcome.states.items() if s.state == "unreachable"
            ] + list(self.contact.held if self.contact else ())

            def run() -> None:
                outcome.stopped.update(stop(self.session, self.inventory, self.record, grace,
                                            [h.name for h in self.hosts if h.name not in lost],
                                            dump_stacks=bool(outcome.hang)))
                outcome.stopped.update({n: StopResult(n, 0, "unreachable", (),
                                                      "lost: not tried") for n in lost})
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            return thread
        return start

    def run(self, stops: _Stops, stop_on_interrupt: bool, hang_timeout_s: float | None,
            node_timeout_s: float) -> None:
        self.stops = stops
        self.turned = time.monotonic()
        outcome = self.outcome
        with interrupts.deferred(lambda: self.done.put(("", None))):
            # Until every node's part has ended and every stop begun has finished.
            while (len(outcome.states) < len(self.hosts) or stops.running) \
                    and time.monotonic() < stops.deadline:
                self._judge_lost()
                try:
                    node, state = self.done.get(timeout=0.5)
                except queue.Empty:
                    self._back_from_away()
                    self._quiet(stop_on_interrupt, hang_timeout_s, node_timeout_s)
                    continue
                self._back_from_away()
                if state is None:  # Ctrl-C
                    if not stop_on_interrupt:
                        raise KeyboardInterrupt  # logs -f: not ours to stop
                    stops.interrupted(again=outcome.interrupted)
                    outcome.interrupted = True
                    continue
                self._ended(node, state)

    def _back_from_away(self) -> None:
        """After a gap in the loop's turns, every node's silence and lack of progress
        restart from now: what was not read meanwhile is still on its way. (Seen: an
        attached launch stopped for 50 s (SIGSTOP, as Ctrl-Z does) took the first node it
        looked at for lost once continued, though every node had sent its heartbeats.)"""
        now = time.monotonic()
        away, self.turned = now - self.turned, now
        if away < AWAY_S:
            return
        self.say(f"this process did not run for {away:.0f} s (stopped, or starved): the "
                 f"nodes' silence meanwhile is not held against them")
        for follower in self.followers.values():
            follower.last_heard = max(follower.last_heard, now)
            follower.last_progress = max(follower.last_progress, now)

    def _quiet(self, ours: bool, hang_timeout_s: float | None, node_timeout_s: float) -> None:
        """Nothing came for a while: a node silent too long is dropped; a closed output
        or a hang stops the job (no hang while this machine is cut off)."""
        assert self.stops is not None
        gone = {*self.outcome.states, *(self.contact.held if self.contact else ())}
        if len(gone) < len(self.hosts):
            _drop_silent(self.session, self.followers, gone, node_timeout_s)
        if self.contact is not None and self.contact.cut_off:
            hang_timeout_s = None
        why = None if self.stops.begun else _stop_reason(
            self.followers, self.outcome, self.output_closed, ours, hang_timeout_s)
        if why is not None:
            self.stops.begin(why)

    def _ended(self, node: str, state: NodeState, judged: bool = False) -> None:
        assert self.stops is not None
        stops, states = self.stops, self.outcome.states
        follower = self.followers.get(node)
        if self.contact is not None and state.state == "unreachable" and not judged \
                and not stops.begun and follower is not None and follower.heard:
            # Lost after contact: the node, or this machine's network? _judge_lost says
            self.contact.hold(node, state, follower.last_heard)
            return
        states[node] = state
        if self.fail_fast and self.live and state.failed and not stops.begun:
            stops.begin(f"{node} failed ({_describe(state)}): stopping the job on every "
                        f"node")
        left = [n for n, s in states.items() if s.state == "leftover"]
        if self.fail_fast and self.live and left and len(states) == len(self.hosts) \
                and not stops.begun:  # a process the script left: ours to end
            stops.begin(f"{hostrange.fold(left)}: torchrun exited 0 leaving processes "
                        f"of the job there: ending them")

    def _judge_lost(self) -> None:
        if self.contact is None or self.stops is None:
            return
        verdict = self.contact.decide(
            {n: f.last_heard for n, f in self.followers.items()},
            {h.name for h in self.hosts} - set(self.outcome.states), self.stops.begun)
        for node in verdict.resumed:
            self.followers[node] = self.followers[node].again()
            self.followers[node].start()
        for node, state in verdict.failed.items():
            self._ended(node, state, judged=True)


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


def _stop_reason(followers: Mapping[str, NodeFollower], outcome: JobOutcome,
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


def _drop_silent(session: Session, followers: Mapping[str, NodeFollower],
                 finished: Collection[str], limit_s: float) -> None:
    """A node that sent neither output nor heartbeat for `limit_s` is gone: close its
    connection so that its follower ends as unreachable (`finished`: nodes whose
    follower ended)."""
    now = time.monotonic()
    for name, follower in followers.items():
        if name not in finished \
                and now - max(follower.last_heard, follower.dropped_at) > limit_s:
            follower.dropped_at = now  # last_heard stays its last sign of life
            session.connection(follower.host).close()


def _say(say: Callable[[str], None] | None, words: str) -> None:
    if say is not None:
        with contextlib.suppress(OSError):  # a closed stderr must not keep the job on
            say(words)


def _describe(state: NodeState) -> str:
    if state.state == "exited":
        return f"torchrun exited {state.exit_code}"
    if state.state == "leftover":
        return state.leftover_cause
    return state.state + (f": {state.detail}" if state.detail else "")
