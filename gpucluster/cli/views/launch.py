"""`launch`, `jobs`, `logs` and `stop`: the outcome with the first failure, the jobs
table, what stop found; and each as JSON. The lines themselves: line_printer.py."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.views.common import print_json
from gpucluster.cli.views.terminal_text import printable
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.known_causes import KnownCause
from gpucluster.launch.model import (
    FirstFailure,
    JobOutcome,
    LaunchRefused,
    NodeState,
    StopResult,
)
from gpucluster.launch.node_scripts import DEBUG_DIRS
from gpucluster.quiet import QUIET_SAID_S, quiet_words
from gpucluster.wording import ago, counted


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


def _said(text: str) -> str:
    """The job's own words as markup: escaped, and without the terminal controls they
    may hold."""
    return escape(printable(text))


def print_failure(err: Console, failure: FirstFailure) -> None:
    """The first failure in a line, and its likely cause where its words name one: where
    its lines were shown just before (a Slurm job's)."""
    err.print(_first_failure(failure))
    if failure.cause is not None:
        err.print(_likely_cause(failure.cause))


def _first_failure(failure: FirstFailure) -> str:
    where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None \
        else failure.node
    return f"[bold red]first failure: {where}, {_said(failure_cause(failure))}[/]"


def _likely_cause(cause: KnownCause) -> str:
    return f"[bold]likely cause:[/] {escape(cause.what)} (fix: {escape(cause.fix)})"


def print_outcome(err: Console, outcome: JobOutcome, store: JobStore,
                  rendezvous_not_closed: Collection[str] = ()) -> None:
    """How the job ended: its first failure, every node's state. `rendezvous_not_closed`:
    nodes whose agent warned that it could not close the rendezvous (LinePrinter)."""
    record = outcome.record
    failure = outcome.first_failure
    if failure is not None:
        err.print(_first_failure(failure))
        if failure.error_came_before:
            err.print(f"last traceback of rank {failure.rank} (more of its output came "
                      f"after it):")
            for line in failure.rank_error:
                err.print(f"  {_said(line)}", style="dim")
        if failure.rank_tail:
            err.print(f"last lines of rank {failure.rank}:")
            for line in failure.rank_tail:
                err.print(f"  {_said(line)}", style="dim")
        err.print(f"last lines of {failure.node}'s log "
                  f"({store.node_log(record.id, failure.node)}):")
        for line in failure.tail:
            err.print(f"  {_said(line)}", style="dim")
        if failure.cause is not None:
            err.print(_likely_cause(failure.cause))
    by_state = hostrange.hosts_by((state.label, node)
                                  for node, state in outcome.states.items())
    states = ", ".join(f"{label} on {hostrange.fold(nodes)}"
                       for label, nodes in by_state.items())
    err.print(f"job {record.id}: {states or 'no node sent its state (gpucluster jobs asks again)'}"
              f"; logs in {store.directory(record.id)}")
    if record.debug:
        _name_the_debug_files(err, record)
    _name_the_teardown_race(err, outcome, rendezvous_not_closed)
    for reason, nodes in hostrange.hosts_by((why, node) for node, why in
                                            outcome.copies_cut.items()).items():
        err.print(f"[bold yellow]{hostrange.fold(nodes)}: the copy of the log in "
                  f"{store.directory(record.id)} stopped short ({escape(reason)}); the nodes "
                  f"keep it whole (fix: make room, then gpucluster logs {record.id})[/]")
    if outcome.stopped:
        print_stopped(err, record, outcome.stopped)


def _name_the_debug_files(err: Console, record: JobRecord) -> None:
    """Where --debug's files are: on the nodes, which the job's log does not say."""
    where = " and ".join(f"{record.dir_on_node('NODE')}/{name}/" for name in DEBUG_DIRS)
    err.print(f"--debug: NCCL's and the flight recorder's files in {escape(where)} on each "
              f"node (empty on gloo); gpucluster bundle {record.id} collects them")


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
                  still_running: Mapping[str, Sequence[str]] | None = None) -> None:
    """A line per node that could not confirm; one summary line when all could.
    `by_supervisor`: its recovery supervisor, ended first, had stopped the job.
    `still_running`: no job was named and the newest had ended: the other jobs that
    still run (id -> nodes)."""
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
            others = "".join(f"; job {job} still runs on {hostrange.fold(list(nodes))}: "
                             f"gpucluster stop {job} ends it"
                             for job, nodes in (still_running or {}).items())
            if len(still_running or {}) > 1:
                others += " (gpucluster stop --all ends them all)"
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
               supervisors: Mapping[str, int | None], failures: Mapping[str, str]) -> None:
    from gpucluster.cli.views.common import print_table

    rows, now = [], time.time()
    for record in records:
        states = {node: table[record.id].get(node) for node in record.hosts}
        # No state: this inventory does not list the node, or lists another machine by its
        # name (control.elsewhere), so nobody asked it.
        by_state = hostrange.hosts_by(("not in this inventory" if state is None
                                       else state.label, node)
                                      for node, state in states.items())
        summary = ", ".join(f"{label}: {hostrange.fold(nodes)}"
                            for label, nodes in by_state.items())
        if (gpus := record.env.get("CUDA_VISIBLE_DEVICES")) is not None:  # launch --gpus
            summary += f" on GPU {gpus}"
        if record.run:
            summary += f"; attempt {record.attempt} of run {record.run}"
        if supervisors.get(record.id):
            summary += f"; recovery supervisor pid {supervisors[record.id]}"
        if record.id in failures:
            summary += f"\nfirst failure: {printable(failures[record.id])}"
        if not supervisors.get(record.id) and (half := _failed_while_running(record, states)):
            summary += f"\n{half}"
        if (quiet := quiet_for(table[record.id].values())) is not None and quiet >= QUIET_SAID_S:
            summary += f"\n{quiet_words(quiet)}"
            if not supervisors.get(record.id):  # launch --recover's --hang-timeout ends it
                summary += f" (a hang? gpucluster stacks {record.id} says where each rank " \
                           f"is; stop --stacks ends it so)"
        # `5m ago`: the id already says when (its local date and time), and a column of
        # full dates left an 80-column terminal a state column 18 wide, folding each state
        rows.append((record.id, record.command(),
                     f"{ago(max(0.0, now - record.started_at))} ago", summary))
    print_table(console, "jobs", ("job", "command", "started", "state"), rows)


def _failed_while_running(record: JobRecord, states: Mapping[str, NodeState | None]
                          ) -> str | None:
    """A job failed on a node while others run on: nothing stops those (a detached job),
    whose torchrun waits for the failed node's (up to 5 minutes) or whose ranks wait on
    it in a collective (NCCL: 10 minutes). Said, with the way to end it."""
    running = [n for n, s in states.items() if s is not None and s.state == "running"]
    failed = [n for n, s in states.items()
              if s is not None and s.failed and s.state != "unreachable"]
    if not running or not failed:
        return None
    return (f"failed on {hostrange.fold(failed)}, still running on {hostrange.fold(running)}: "
            f"gpucluster logs {record.id} says why; gpucluster stop {record.id} ends it"
            + "".join(_could_not_stop(node, state) for node, state in states.items()
                      if state is not None and state.peers_left))


def _could_not_stop(node: str, state: NodeState) -> str:
    """`; node3 could not stop it on node[1-2] (Host key verification failed.)`: why
    the failed node's stop of the others (launch -d's, or a launcher's while away)
    left them running."""
    return "".join(f"; {node} could not stop it on {hostrange.fold(peers)} ({why})"
                   for why, peers in hostrange.hosts_by(
                       (why, peer) for peer, why in state.peers_left).items())


# -- JSON


def state_payload(state: NodeState) -> dict[str, Any]:
    return {"state": state.state, "exit_code": state.exit_code, "detail": state.detail,
            "peers_not_stopped": dict(state.peers_left)}


def stop_payload(record: JobRecord, results: Mapping[str, StopResult]) -> dict[str, Any]:
    return {
        "job": record.id,
        "clean": stopped_cleanly(results),
        "nodes": {n: {"found": r.found, "how": r.how, "left": list(r.left), "detail": r.detail}
                  for n, r in sorted(results.items())},
    }


def quiet_for(states: Iterable[NodeState]) -> int | None:
    """Seconds since the job's newest output or heartbeat on any node where it runs;
    None where none said."""
    said = [state.quiet_s for state in states
            if state.quiet_s is not None and state.state == "running"]
    return min(said) if said else None


def jobs_payload(records: Sequence[JobRecord],
                 table: Mapping[str, Mapping[str, NodeState]],
                 supervisors: Mapping[str, int | None],
                 failures: Mapping[str, str]) -> dict[str, Any]:
    return {"jobs": [{
        "id": r.id, "script": r.script, "module": r.module, "args": list(r.args),
        "hosts": list(r.hosts),
        "started_at": r.started_at, "image": r.image,
        "gpus": r.env.get("CUDA_VISIBLE_DEVICES"),  # launch --gpus; null: all of them
        "run": r.run or r.id, "attempt": r.attempt,  # launch --recover's attempts
        "supervisor": supervisors.get(r.id),
        "nodes": {n: state_payload(s) for n, s in table[r.id].items()},
        "first_failure": failures.get(r.id),
        "quiet_s": quiet_for(table[r.id].values()),
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
