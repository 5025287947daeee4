"""Following a job's logs from the CLI (`launch`, `logs`): every node's lines as they
come, or only the last few and then what comes, and how the job ended."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from gpucluster import hostrange
from gpucluster.cli.options import stdout_console
from gpucluster.cli.views import common
from gpucluster.cli.views import launch as view
from gpucluster.cli.views.line_printer import LinePrinter
from gpucluster.errors import EXIT_FAILED, Interrupted

if TYPE_CHECKING:
    from gpucluster.inventory import Inventory
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.logsearch import LogFilter, LogLine
    from gpucluster.launch.model import JobOutcome, NodeState, OutputCallback
    from gpucluster.remote.session import Session


def attach(session: Session, inventory: Inventory, store: JobStore, record: JobRecord,
           err: Console, live: bool, fail_fast: bool, grace: float,
           nodes: list[str] | None = None, json_output: bool = False,
           tail: int | None = None, keep: LogFilter | None = None) -> None:
    """Every node's log (live: until the job ends), then how the job ended. With `tail`,
    only the last `tail` lines so far across the nodes, in time order; live, then the
    lines that come after them. With `keep`, only the lines it keeps as they come."""
    from gpucluster.launch import ended_copies
    from gpucluster.launch.follow import follow

    outcome: JobOutcome
    lines = LinePrinter(sys.stderr if json_output else sys.stdout,
                        full_logs=f"gpucluster logs {record.id}" if live else None, live=live)
    printer: OutputCallback = lines if keep is None else keep.passing(lines)
    shown: list[LogLine] = []
    resume: dict[str, int] = {}  # with `tail`: where each node's follow starts
    try:
        if tail is not None:
            outcome, shown, resume = _last_lines(session, inventory, store, record, nodes,
                                                 tail, printer, then_follow=live)
        if tail is None or (live and resume):
            tailed = outcome.states if tail is not None else None
            outcome = follow(session, inventory, record, store, printer,
                             live=live, fail_fast=fail_fast, stop_on_interrupt=fail_fast,
                             grace_s=grace, nodes=list(resume) if resume else nodes,
                             say=lambda why: err.print(f"[bold yellow]gpucluster: "
                                                               f"{why}[/]"),
                             from_bytes=resume)
            if tailed is not None:
                _after_tail(session, inventory, store, record, outcome, tailed)
    except KeyboardInterrupt:  # only when the job is not ours to stop (logs -f)
        raise Interrupted(f"detached from the logs; job {record.id} goes on") from None
    finally:
        lines.finish()  # what came, however it ended (not live, lines wait for this)
    # Nodes that no longer have the job, or cannot be reached, and sent nothing: what the
    # controller kept of their logs is shown instead (with `tail`, it was among the lines
    # shown), said to be the copy. (A node lost while it streamed sent its lines.)
    streamed = lines.heard if tail is None else set()
    gone = {n: s.state for n, s in outcome.states.items()
            if s.state in ("missing", "unreachable") and n not in streamed}
    kept: list[LogLine] = []
    if gone and tail is None:
        kept = ended_copies.lines(store, record, gone)
    ended_copies.hand_on(kept, printer)
    lines.finish()
    for why, words in (("missing", f"job {record.id} is gone from the node"),
                       ("unreachable", "cannot be reached")):
        if from_copy := {line.node for line in kept or shown if gone.get(line.node) == why}:
            err.print(f"{hostrange.fold(from_copy)}: {words}; its lines above are the "
                      f"controller's copy")
    view.print_outcome(err, outcome, store, lines.rendezvous_not_closed)
    if outcome.first_failure is not None:
        from gpucluster.launch.failure import in_a_line

        store.note_failure(record.id, in_a_line(outcome.first_failure))
    if json_output:
        common.print_json(stdout_console(), view.outcome_payload(outcome, store))
    if live:
        raise typer.Exit(outcome.exit_code)  # followed to the end: the job's exit code
    if any(s.state in ("unreachable", "missing") for s in outcome.states.values()):
        raise typer.Exit(EXIT_FAILED)


def _last_lines(session: Session, inventory: Inventory, store: JobStore, record: JobRecord,
                nodes: list[str] | None, tail: int, printer: OutputCallback,
                then_follow: bool) -> tuple[JobOutcome, list[LogLine], dict[str, int]]:
    """`logs -n N`: each node's last N lines only, and their last N across the nodes
    printed; the lines of a node that no longer has the job, or cannot be reached, are
    the controller's copy, and so are those of a node whose copy is final (it is not
    asked). Also where a follow of each node that answered starts: past those lines
    (`then_follow`: at an unfinished last line, which is not printed, for the follow to
    send it whole). Not followed after (nothing to follow), a node where the job failed
    is fetched whole too, for its first failure as launch names it."""
    from gpucluster.launch import ended_copies, log_tail, logsearch
    from gpucluster.launch.model import JobOutcome

    wanted = nodes or record.hosts
    ended = ended_copies.recorded(store, record, wanted, whole=True)
    asked = [node for node in wanted if node not in ended]
    tails = log_tail.fetch(session, inventory, record, asked, tail) if asked else {}
    outcome = JobOutcome(record)
    states = {**ended, **{node: got.state for node, got in tails.items()}}
    outcome.states = {node: states[node] for node in wanted}
    away = {node for node, got in tails.items()
            if got.state.state in ("missing", "unreachable")}
    lines = [line for got in tails.values()
             for line in (got.lines[:-1] if then_follow and got.last_unfinished else got.lines)]
    lines += ended_copies.lines(store, record, away | set(ended), last=tail)
    shown = logsearch.in_time_order(lines, tail)
    ended_copies.hand_on(shown, printer)
    resume = {node: got.resume_at for node, got in tails.items()
              if got.resume_at is not None and node not in away}
    if not (then_follow and resume):  # no follow after these lines: this is the outcome
        _after_tail(session, inventory, store, record, outcome, outcome.states)
    return outcome, shown, resume


def _after_tail(session: Session, inventory: Inventory, store: JobStore, record: JobRecord,
                outcome: JobOutcome, tails: Mapping[str, NodeState]) -> None:
    """`outcome`, of the nodes the follow after a tail did not cover too (`tails`: each
    node's state when its tail was read), in the job's order of nodes; and its first
    failure from the nodes where the job failed, fetched whole (only their end was
    read), but those that could not be reached or no longer have the job: their copy
    here is all there is (a second try cost a second connect timeout)."""
    from gpucluster.launch.failure import failure_of
    from gpucluster.launch.follow import follow
    from gpucluster.launch.model import FirstFailure

    states = {**tails, **outcome.states}
    outcome.states = {node: states[node] for node in record.hosts if node in states}
    failed = [node for node, state in outcome.states.items() if state.failed]
    away = [node for node in failed if outcome.states[node].state in ("unreachable", "missing")]
    failures: list[FirstFailure | None] = [
        failure_of(node, outcome.states[node], store.node_log(record.id, node)) for node in away]
    if fetch := [node for node in failed if node not in away]:
        failures.append(follow(session, inventory, record, store, live=False,
                               fail_fast=False, stop_on_interrupt=False,
                               nodes=fetch).first_failure)
    outcome.first_failure = min((f for f in failures if f is not None),
                                key=FirstFailure.order, default=None)
