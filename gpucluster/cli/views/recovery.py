"""`launch --recover`: each attempt's nodes, why it ended, who was quarantined and why,
and the run's end, as text and as JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.views.launch import outcome_payload
from gpucluster.launch import hang_stacks
from gpucluster.launch.attempt_report import AttemptReport
from gpucluster.launch.jobs import JobStore
from gpucluster.launch.recover import RecoveryResult, left_running
from gpucluster.wording import counted


def print_recovery(err: Console, result: RecoveryResult) -> None:
    err.print(f"run {result.run}: {counted(len(result.attempts), 'attempt')}")
    for node, why in result.set_aside.items():
        err.print(f"  before attempt 1: {node} set aside: {escape(why)}")
    previous: AttemptReport | None = None
    for attempt in result.attempts:
        ended = attempt.ended + (f" ({attempt.detail})" if attempt.detail else "")
        err.print(f"  attempt {attempt.number}: job {attempt.job} on "
                  f"{hostrange.fold(list(attempt.nodes))}, {attempt.duration_s:.0f}s, "
                  f"{escape(ended)}")
        if previous is not None:
            err.print(f"    {_resumed_text(*attempt.resumed(previous))}")
        previous = attempt
        for node, why in attempt.quarantined.items():
            err.print(f"    {node} quarantined: {escape(why)}")
        if attempt.out_of_reach:
            reach = hostrange.fold(list(attempt.out_of_reach))
            err.print(f"    {escape(left_running(attempt.job, reach))}")
    if result.gave_up:
        err.print(f"[bold red]recovery gave up: {escape(result.gave_up)}[/]")


def _resumed_text(step: int | None, redone: int | None, lost_s: float | None) -> str:
    where = (f"resumed at step {step}" + (f" ({redone} steps done again)" if redone else "")
             if step is not None else "resume step unknown (the script writes no step in "
                                      "its heartbeat file)")
    return where + (f", {lost_s:.0f}s without progress" if lost_s is not None else "")


def recovery_payload(result: RecoveryResult, store: JobStore) -> dict[str, Any]:
    def resumed(index: int, attempt: AttemptReport) -> dict[str, Any]:
        if index == 0:
            return {"resumed_step": attempt.first_step, "steps_redone": None, "lost_s": None}
        step, redone, lost = attempt.resumed(result.attempts[index - 1])
        return {"resumed_step": step, "steps_redone": redone,
                "lost_s": round(lost, 1) if lost is not None else None}

    return {
        "schema": 1,
        "run": result.run,
        "exit_code": result.exit_code,
        "gave_up": result.gave_up or None,
        "quarantined": result.quarantined,
        "attempts": [{"number": a.number, "job": a.job, "nodes": list(a.nodes),
                      "ended": a.ended, "detail": a.detail,
                      "duration_s": round(a.duration_s, 1), "quarantined": a.quarantined,
                      "out_of_reach": list(a.out_of_reach),
                      "stacks": hang_stacks.payload(a.stacks),
                      "first_step": a.first_step, "last_step": a.last_step, **resumed(i, a)}
                     for i, a in enumerate(result.attempts)],
        "last": outcome_payload(result.outcome, store) if result.outcome else None,
    }
