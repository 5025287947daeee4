"""`launch --recover`: each attempt's nodes, why it ended, who was quarantined and why,
and the run's end, as text and as JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.views.launch import outcome_payload
from gpucluster.launch.jobs import JobStore
from gpucluster.launch.recover import RecoveryResult


def print_recovery(err: Console, result: RecoveryResult) -> None:
    err.print(f"run {result.run}: {len(result.attempts)} attempt"
              f"{'s' if len(result.attempts) != 1 else ''}")
    for attempt in result.attempts:
        ended = attempt.ended + (f" ({attempt.detail})" if attempt.detail else "")
        err.print(f"  attempt {attempt.number}: job {attempt.job} on "
                  f"{hostrange.fold(list(attempt.nodes))}, {attempt.duration_s:.0f}s, "
                  f"{escape(ended)}")
        for node, why in attempt.quarantined.items():
            err.print(f"    {node} quarantined: {escape(why)}")
    if result.gave_up:
        err.print(f"[bold red]recovery gave up: {escape(result.gave_up)}[/]")


def recovery_payload(result: RecoveryResult, store: JobStore) -> dict[str, Any]:
    return {
        "schema": 1,
        "run": result.run,
        "exit_code": result.exit_code,
        "gave_up": result.gave_up or None,
        "quarantined": result.quarantined,
        "attempts": [{"number": a.number, "job": a.job, "nodes": list(a.nodes),
                      "ended": a.ended, "detail": a.detail,
                      "duration_s": round(a.duration_s, 1), "quarantined": a.quarantined}
                     for a in result.attempts],
        "last": outcome_payload(result.outcome, store) if result.outcome else None,
    }
