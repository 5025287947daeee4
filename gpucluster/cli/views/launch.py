"""`launch`, `jobs`, `logs` and `stop`: streamed [node/rank] lines, the outcome with the
first failure, the jobs table, what stop found; and each as JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.views.common import discard_writes, print_json
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import (
    FirstFailure,
    JobOutcome,
    LaunchRefused,
    NodeState,
    OutputClosed,
    StopResult,
)
from gpucluster.wording import counted

# A C++ backtrace as torch's c10 errors print it: the line that says where the error was
# raised (which stays), then one line per frame.
_BACKTRACE_START = re.compile(r"Exception raised from .* \(most recent call first\):$")
_BACKTRACE_FRAME = re.compile(r"frame #[0-9]+: |<omitting python frames>$")
# What a node's torchrun agent says when the rendezvous store is gone as it closes it.
_RENDEZVOUS_NOT_CLOSED = re.compile(r"has failed to shutdown the rendezvous ")


class LinePrinter:
    """Lines from all nodes, each whole, prefixed [node/rank] (or [node] for torchrun).

    Live (`full_logs` names the command that prints a job's lines in full), a C++
    backtrace becomes one line: torch prints 20-30 frames even for a warning, such as the
    one a multi-node job can end with on the nodes but the head (whose agent, done first,
    took the rendezvous store with it). The node's log keeps them.

    A stream that cannot be written (stdout redirected to a full disk) stops taking
    lines, said once on `notes`; the job and its follow go on (the error used to end the
    node's follower, and the node was taken for lost: --recover relaunched the job).

    Each node's lines come from a thread of its own. Whichever thread holds the lock
    writes every line waiting, its own and the others', and flushes once; the others
    leave theirs and go on. (A lock taken per line cost 3.3 s of 8.9 for `logs` of two
    nodes' 800000 lines: the threads queued on it, a wake-up per line.)"""

    def __init__(self, stream: TextIO, notes: TextIO | None = None,
                 full_logs: str | None = None, live: bool = True) -> None:
        self._stream, self._notes, self._full_logs = stream, notes, full_logs
        # Live, each line reaches the stream as it comes; else as the stream's buffer fills
        # and at the end, as cat's do (a flush per line was most of the time `logs JOB`
        # took to print 600000 lines).
        self._live = live
        self._lock = threading.Lock()
        self._waiting: deque[tuple[str, str | None, str]] = deque()
        self._failed = False
        # Per node and rank inside a backtrace: its frames left out so far.
        self._frames: dict[tuple[str, str | None], int] = {}
        # Nodes whose agent could not close the rendezvous: after a clean end, torch's
        # teardown race, which print_outcome then names as such.
        self.rendezvous_not_closed: set[str] = set()
        self.heard: set[str] = set()  # nodes whose lines came

    def __call__(self, node: str, rank: str | None, text: str) -> None:
        self._waiting.append((node, rank, text))
        # A line left while another thread wrote is in `_waiting` when that thread,
        # having let go of the lock, looks again.
        while self._waiting and self._lock.acquire(blocking=False):
            try:
                self._write_waiting()
            finally:
                self._lock.release()

    def finish(self) -> None:
        """Says the frames left out at the very end of a node's output."""
        with self._lock:
            self._write_waiting()
            out: list[str] = []
            for node, rank in list(self._frames):
                self._say_frames(out, node, rank)
            self._write(out)
            self._guarded(self._stream.flush)

    def _write_waiting(self) -> None:
        """Every line waiting, written at once."""
        out: list[str] = []
        while self._waiting:
            node, rank, text = self._waiting.popleft()
            self.heard.add(node)
            if self._frames:  # a backtrace is being folded
                if (node, rank) in self._frames and _BACKTRACE_FRAME.match(text):
                    self._frames[(node, rank)] += 1
                    continue
                self._say_frames(out, node, rank)
            out.append(f"[{node}/{rank}] {text}\n" if rank is not None else f"[{node}] {text}\n")
            if rank is None and _RENDEZVOUS_NOT_CLOSED.search(text):
                self.rendezvous_not_closed.add(node)
            if self._full_logs and _BACKTRACE_START.search(text):
                self._frames[(node, rank)] = 0
        self._write(out)

    def _say_frames(self, out: list[str], node: str, rank: str | None) -> None:
        count = self._frames.pop((node, rank), 0)
        if count:
            prefix = f"[{node}/{rank}]" if rank is not None else f"[{node}]"
            out.append(f"{prefix} ({counted(count, 'line')} of C++ backtrace left out: "
                       f"{self._full_logs} prints them)\n")

    def _write(self, out: list[str]) -> None:
        if out:
            self._guarded(lambda: self._stream.write("".join(out)))
        if self._live:
            self._guarded(self._stream.flush)

    def _guarded(self, action: Callable[[], object]) -> None:
        if self._failed:
            return
        try:
            action()
        except BrokenPipeError:
            discard_writes(self._stream)
            raise OutputClosed(f"{self._stream.name}: its reader went away") from None
        except OSError as error:
            self._failed = True
            discard_writes(self._stream)
            with contextlib.suppress(OSError, ValueError):
                print(f"gpucluster: {self._stream.name}: {error.strerror or error}: the "
                      f"job's lines are no longer written there; the job goes on "
                      f"(gpucluster logs shows them)", file=self._notes or sys.stderr,
                      flush=True)


def failure_cause(failure: FirstFailure) -> str:
    worker = failure.worker_exit
    if failure.killing_signal:
        cause = f"worker killed by {failure.killing_signal}"
    elif worker is not None:
        cause = f"worker exit code {worker}"
    elif failure.state.state == "leftover":
        return failure.state.leftover_cause
    else:
        cause = failure.state.state + (f" ({failure.state.detail})"
                                       if failure.state.detail else "")
    if failure.exit_code is not None:
        cause += f"; torchrun exit code {failure.exit_code}"
    return cause


def print_outcome(err: Console, outcome: JobOutcome, store: JobStore,
                  rendezvous_not_closed: Collection[str] = ()) -> None:
    """How the job ended: its first failure, every node's state. `rendezvous_not_closed`:
    nodes whose agent warned that it could not close the rendezvous (LinePrinter)."""
    record = outcome.record
    failure = outcome.first_failure
    if failure is not None:
        where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None \
            else failure.node
        err.print(f"[bold red]first failure: {where}, {escape(failure_cause(failure))}[/]")
        if failure.error_came_before:
            err.print(f"last traceback of rank {failure.rank} (more of its output came "
                      f"after it):")
            for line in failure.rank_error:
                err.print(f"  {escape(line)}", style="dim")
        if failure.rank_tail:
            err.print(f"last lines of rank {failure.rank}:")
            for line in failure.rank_tail:
                err.print(f"  {escape(line)}", style="dim")
        err.print(f"last lines of {failure.node}'s log "
                  f"({store.node_log(record.id, failure.node)}):")
        for line in failure.tail:
            err.print(f"  {escape(line)}", style="dim")
        if failure.cause is not None:
            err.print(f"[bold]likely cause:[/] {escape(failure.cause.what)} "
                      f"(fix: {escape(failure.cause.fix)})")
    by_state = hostrange.hosts_by((state.label, node)
                                  for node, state in outcome.states.items())
    states = ", ".join(f"{label} on {hostrange.fold(nodes)}"
                       for label, nodes in by_state.items())
    err.print(f"job {record.id}: {states or 'no node sent its state (gpucluster jobs asks again)'}"
              f"; logs in {store.directory(record.id)}")
    _name_the_teardown_race(err, outcome, rendezvous_not_closed)
    for reason, nodes in hostrange.hosts_by((why, node) for node, why in
                                            outcome.copies_cut.items()).items():
        err.print(f"[bold yellow]{hostrange.fold(nodes)}: the copy of the log in "
                  f"{store.directory(record.id)} stopped short ({escape(reason)}); the nodes "
                  f"keep it whole (fix: make room, then gpucluster logs {record.id})[/]")
    if outcome.stopped:
        print_stopped(err, record, outcome.stopped)


def _name_the_teardown_race(err: Console, outcome: JobOutcome,
                            rendezvous_not_closed: Collection[str]) -> None:
    """The head's agent hosts the rendezvous store; done first, it can exit before the
    others have closed the rendezvous, and they warn, with a C++ backtrace, at the end of
    a job that succeeded. Said once, so that nobody debugs it."""
    clean = [node for node in rendezvous_not_closed
             if (state := outcome.states.get(node)) is not None
             and state.state == "exited" and state.exit_code == 0]
    if clean:
        err.print(f"[dim]{hostrange.fold(clean)}: torch's \"failed to shutdown the rendezvous\" "
                  f"came after the job exited 0 there: torch's teardown race (the head's "
                  f"agent, done first, took the rendezvous store with it), not a failure[/]")


def print_refusal(err: Console, refused: LaunchRefused, json_out: Console | None = None
                  ) -> None:
    """Doctor's findings that refused the launch, then the refusal; both as JSON on
    `json_out` too (--json's stdout), so that a script reading it is told why no job ran."""
    from gpucluster.cli.views.doctor import print_findings, result_payload

    print_findings(err, refused.findings, [f.name for f in refused.findings])
    err.print(f"[bold red]launch refused: {escape(str(refused))}; nothing was started[/]")
    if json_out is not None:
        print_json(json_out, {"job": None, "refused": str(refused), "exit_code": 1,
                                      "findings": [result_payload(f) for f in refused.findings]})


def stopped_cleanly(results: Mapping[str, StopResult]) -> bool:
    """True when every node confirmed that nothing of the job is left."""
    return all(r.confirmed for r in results.values())


def print_stopped(console: Console, record: JobRecord,
                  results: Mapping[str, StopResult], by_supervisor: bool = False,
                  newest_of_several: bool = False) -> None:
    """A line per node that could not confirm; one summary line when all could.
    `by_supervisor`: its recovery supervisor, ended first, had stopped the job.
    `newest_of_several`: no job was named, and others are recorded (one may run)."""
    for node, result in sorted(results.items()):
        if not result.confirmed:
            left = f" {counted(len(result.left), 'process', 'processes')} left: " \
                f"{result.left}" if result.left else ""
            console.print(f"[bold red]{node}: could not confirm the job ended: "
                          f"{escape(result.detail)}{left}[/]")
    if stopped_cleanly(results):
        found = sum(r.found for r in results.values())
        killed = [n for n, r in results.items() if r.how == "kill"]
        if found == 0 and not by_supervisor:  # "stopped" would claim what did not happen
            others = "; it is the newest job: another is stopped by its id (gpucluster " \
                "jobs lists them and their states)" if newest_of_several else ""
            console.print(f"job {record.id} had already ended: nothing of it is left on "
                          f"{hostrange.fold(list(results))}{others}")
            return
        kill = f"; KILL needed on {hostrange.fold(killed)}" if killed else ""
        how = "its recovery supervisor stopped it as it ended" if found == 0 else \
            f"{counted(found, 'process', 'processes')} ended{kill}"
        console.print(f"job {record.id} stopped: nothing of it is left on "
                      f"{hostrange.fold(list(results))} ({how})")


def print_jobs(console: Console, records: Sequence[JobRecord],
               table: Mapping[str, Mapping[str, NodeState]],
               supervisors: Mapping[str, int | None]) -> None:
    from gpucluster.cli.views.common import print_table

    rows = []
    for record in records:
        states = {node: table[record.id].get(node) for node in record.hosts}
        # No state: this inventory does not list the node, or lists another machine by its
        # name (control.elsewhere), so nobody asked it.
        by_state = hostrange.hosts_by(("not in this inventory" if state is None
                                       else state.label, node)
                                      for node, state in states.items())
        summary = ", ".join(f"{label}: {hostrange.fold(nodes)}"
                            for label, nodes in by_state.items())
        if record.run:
            summary += f"; attempt {record.attempt} of run {record.run}"
        if supervisors.get(record.id):
            summary += f"; recovery supervisor pid {supervisors[record.id]}"
        rows.append((record.id, record.command(),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started_at)),
                     summary))
    print_table(console, "jobs", ("job", "command", "started", "state"), rows)


# -- JSON


def state_payload(state: NodeState) -> dict[str, Any]:
    return {"state": state.state, "exit_code": state.exit_code, "detail": state.detail}


def stop_payload(record: JobRecord, results: Mapping[str, StopResult]) -> dict[str, Any]:
    return {
        "job": record.id,
        "clean": stopped_cleanly(results),
        "nodes": {n: {"found": r.found, "how": r.how, "left": list(r.left), "detail": r.detail}
                  for n, r in sorted(results.items())},
    }


def jobs_payload(records: Sequence[JobRecord],
                 table: Mapping[str, Mapping[str, NodeState]],
                 supervisors: Mapping[str, int | None]) -> dict[str, Any]:
    return {"jobs": [{
        "id": r.id, "script": r.script, "module": r.module, "args": list(r.args),
        "hosts": list(r.hosts),
        "started_at": r.started_at, "image": r.image,
        "run": r.run or r.id, "attempt": r.attempt,  # launch --recover's attempts
        "supervisor": supervisors.get(r.id),
        "nodes": {n: state_payload(s) for n, s in table[r.id].items()},
    } for r in records]}


def outcome_payload(outcome: JobOutcome, store: JobStore) -> dict[str, Any]:
    failure = outcome.first_failure
    return {
        "job": outcome.record.id,
        "hosts": list(outcome.record.hosts),
        "exit_code": outcome.exit_code,
        "interrupted": outcome.interrupted,
        "nodes": {n: state_payload(s) for n, s in outcome.states.items()},
        "first_failure": None if failure is None else {
            "node": failure.node, "rank": failure.rank, "cause": failure_cause(failure),
            "exit_code": failure.exit_code, "worker_exit": failure.worker_exit,
            "rank_tail": list(failure.rank_tail), "rank_error": list(failure.rank_error),
            "tail": list(failure.tail),
            "likely_cause": None if failure.cause is None else dataclasses.asdict(
                failure.cause)},
        "stopped": stop_payload(outcome.record, outcome.stopped)["nodes"]
        if outcome.stopped else None,
        "logs": str(store.directory(outcome.record.id)),
    }
