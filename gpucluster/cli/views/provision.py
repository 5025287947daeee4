"""Provision's output: the dry-run plan, the nodes x steps summary, the SSH matrix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpucluster import hostrange
from gpucluster.cli.views.common import table_fits
from gpucluster.provision.model import NodeResult, Outcome
from gpucluster.provision.runner import STEP_TYPES, ProvisionReport
from gpucluster.wording import counted

_ABOUT = {"parity": "the nodes' driver, CUDA, GPUs, torch and NCCL must match (a node's "
                    "first run imports torch)",
          **{s.name: s.summary for s in STEP_TYPES},
          "smoke": "all-reduce across every node through torchrun"}


def phase_line(step: str) -> str:
    """What provision says as a step begins: `hosts: /etc/hosts block: ...`."""
    return f"{step}: {_ABOUT[step]}"


STYLE = {Outcome.CHANGED: "cyan", Outcome.OK: "green", Outcome.PASSED: "green",
         Outcome.PLANNED: "yellow",
         Outcome.FAILED: "bold red", Outcome.SKIPPED: "dim"}


def print_report(console: Console, report: ProvisionReport, dry_run: bool) -> None:
    if report.gate_blocked:
        console.print("[bold red]Parity gate: the nodes differ where a job needs them to "
                      "match; nothing was changed (rerun with --force to go on anyway)[/]")
        for finding in report.gate:
            console.print(f"  FAIL {finding.name} [cyan]{finding.host}[/]: "
                          f"{escape(finding.message)}")
        return
    if dry_run:
        changes = hostrange.hosts_by(((r.step, change), r.host)
                                     for r in report.results for change in r.changes)
        for (step, change), hosts in changes.items():
            console.print(f"[yellow]{escape(hostrange.fold(hosts))}[/] {step}: "
                          f"{escape(change.summary)}")
            if change.detail:
                console.print(escape(change.detail.rstrip("\n")), style="dim")
    steps = [s for s in report.steps if s != "parity"]
    table = Table(title="gpucluster provision" + (" --dry-run" if dry_run else ""))
    table.add_column("node", no_wrap=True)
    for step in steps:
        table.add_column(step)
    cells = {(r.host, r.step): r.outcome for r in report.results}
    # Nodes with the same outcome at every step share a row: 64 nodes provisioned
    # alike are one line.
    rows = hostrange.hosts_by((tuple(cells.get((h, s), Outcome.SKIPPED) for s in steps), h)
                              for h in report.hosts)
    for outcomes, hosts in rows.items():
        table.add_row(hostrange.fold(hosts), *[f"[{STYLE[o]}]{o.value}[/]" for o in outcomes])
    console.print(table)
    _print_messages(console, report.results)
    if len(report.hosts) < 2:
        pass  # one node: no pairs to log in between
    elif report.mesh:
        _print_mesh(console, report)
    elif not dry_run and any(r.step == "ssh-mesh" and r.outcome is Outcome.OK
                             for r in report.results):
        console.print("ssh-mesh: already right on every node; its pairs were not tested "
                      "again (--verify tests them)")
    changed = sum(1 for r in report.results if r.outcome is Outcome.CHANGED)
    verb = "would change" if dry_run else "changed"
    planned = sum(1 for r in report.results if r.outcome is Outcome.PLANNED)
    console.print(f"provision: {counted(planned if dry_run else changed, 'node-step')} {verb} "
                  f"in {timing(report)}; log: {report.log}")


def timing(report: ProvisionReport) -> str:
    """`31.9 s (parity 2.1 s, ssh-mesh 4.4 s, ...)`: where a long run's time went."""
    phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in report.phases.items()
                       if seconds >= 0.05)
    return f"{report.duration_s:.1f} s" + (f" ({phases})" if phases else "")


def _print_messages(console: Console, results: Sequence[NodeResult]) -> None:
    """Why a node-step failed; a slow smoke node; a note on a step that went well. Said
    once for all the nodes it applies to."""
    said = hostrange.hosts_by(((r.step, r.outcome is Outcome.FAILED, r.message), r.host)
                              for r in results if r.outcome is Outcome.FAILED or (
                                  r.message and (r.step != "smoke"
                                                 or r.message.startswith("slow"))))
    for (step, failed, message), hosts in said.items():
        style = "bold red" if failed else "yellow"
        console.print(f"[{style}]{escape(hostrange.fold(hosts))} {step}:[/] {escape(message)}")


def _print_mesh(console: Console, report: ProvisionReport) -> None:
    """Every pair that logs in: one line. Else the matrix where it fits the terminal
    (a 16 x 16 one is cut at 80 columns), and the pairs that cannot, named."""
    broken = [f"{source} -> {target}" for source in report.hosts
              for target, state in report.mesh.get(source, {}).items() if state != "ok"]
    if not broken:
        pairs = len(report.hosts) * (len(report.hosts) - 1)
        console.print(f"ssh-mesh: every node logs in to every other ({pairs} pairs)")
        return
    if table_fits(console, max(map(len, report.hosts)), report.hosts, len("ok")):
        _print_matrix(console, report)
    console.print(f"[bold red]ssh-mesh:[/] {counted(len(broken), 'pair')} cannot log in: "
                  f"{escape(', '.join(broken))} (fix: `ssh -v PEER` from the first node "
                  f"of the pair shows why: sshd down, a firewall, a changed host key)")


def _print_matrix(console: Console, report: ProvisionReport) -> None:
    table = Table(title="SSH from (row) to (column)")
    table.add_column("")
    for host in report.hosts:
        table.add_column(host, justify="center")
    for source in report.hosts:
        row = report.mesh.get(source, {})
        cells = []
        for target in report.hosts:
            state = "-" if source == target else row.get(target, "?")
            style = "green" if state == "ok" else ("dim" if state == "-" else "bold red")
            cells.append(f"[{style}]{state}[/]")
        table.add_row(source, *cells)
    console.print(table)


def summary_payload(report: ProvisionReport) -> dict[str, Any]:
    return {
        "hosts": list(report.hosts),
        "steps": list(report.steps),
        "gate_blocked": report.gate_blocked,
        "gate": [{"check": r.name, "host": r.host, "message": r.message} for r in report.gate],
        "results": [{"step": r.step, "host": r.host, "outcome": r.outcome.value,
                     "changes": [{"summary": c.summary, "detail": c.detail} for c in r.changes],
                     "message": r.message} for r in report.results],
        "ssh_mesh": report.mesh,
        "log": str(report.log) if report.log else None,
        "failed": report.failed,
        "duration_s": round(report.duration_s, 2),
        "phases_s": {phase: round(seconds, 2) for phase, seconds in report.phases.items()},
    }


def print_undo(console: Console, results: list[NodeResult]) -> None:
    """`--undo STEP`: per node what was removed, said once for the nodes it is the same on."""
    said = hostrange.hosts_by(((r.step, r.outcome, r.message), r.host) for r in results)
    for (step, outcome, message), hosts in said.items():
        style = "bold red" if outcome is Outcome.FAILED else ""
        line = f"{hostrange.fold(hosts)} {step}: {outcome.value} ({message})"
        console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))
