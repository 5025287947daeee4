"""Doctor's output: the checks x nodes table, the cross-node summary, the findings with
their remedies, and the versioned JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpucluster import hostrange
from gpucluster.cli.views.common import table_fits
from gpucluster.doctor.model import REGISTRY, CheckResult, Status
from gpucluster.doctor.runner import DoctorReport, fold_summary
from gpucluster.wording import counted

STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


def print_report(console: Console, report: DoctorReport, verbose: bool) -> None:
    """The table, the cross-node summary, the findings (all results with -v), a total."""
    _print_table(console, report)
    if report.summary:
        console.print("[bold]Across nodes[/]")
        for label, values in report.summary.items():
            marker = "[yellow]![/]" if len(values) > 1 else " "
            console.print(f" {marker} {label}: {escape(fold_summary(values))}")
    _print_findings(console, report, verbose)
    counts = Counter(r.status for r in report.results)
    console.print(f"doctor: {counts[Status.FAIL]} FAIL, {counts[Status.WARN]} WARN, "
                  f"{counts[Status.OK]} OK, {counts[Status.SKIP]} SKIP on "
                  f"{counted(len(report.hosts), 'node')} in {report.duration_s:.1f}s")


def _print_table(console: Console, report: DoctorReport) -> None:
    """Checks x nodes, nodes with the same status for every check in one column (16
    columns cut at 80 characters hid a node's FAIL behind `…`); when the columns still
    do not fit, a line per check: each status and its nodes."""
    cells = {(r.name, r.host): r.status for r in report.results}
    groups = hostrange.hosts_by((tuple(cells.get((c, h)) for c in report.checks), h)
                                for h in report.hosts)
    columns = [(hostrange.fold(hosts), statuses) for statuses, hosts in groups.items()]
    check_width = max((len(c) for c in report.checks), default=5)
    if not table_fits(console, check_width, [label for label, _ in columns], len("SKIP")):
        _print_check_lines(console, report, cells, check_width)
        return
    table = Table(title=f"gpucluster doctor: {counted(len(report.hosts), 'node')}")
    table.add_column("check", no_wrap=True)
    for label, _ in columns:
        table.add_column(label, justify="center", no_wrap=True)
    for row, check in enumerate(report.checks):
        table.add_row(check, *[_cell(statuses[row]) for _, statuses in columns])
    console.print(table)


def _cell(status: Status | None) -> str:
    return f"[{STYLE[status]}]{status.value}[/]" if status else ""


def _print_check_lines(console: Console, report: DoctorReport,
                       cells: dict[tuple[str, str], Status], width: int) -> None:
    console.print(f"[bold]gpucluster doctor: {counted(len(report.hosts), 'node')}[/]")
    for check in report.checks:
        by_status = hostrange.hosts_by((cells[(check, h)], h) for h in report.hosts
                                       if (check, h) in cells)
        console.print(f" {check:<{width}}  " + "  ".join(
            f"[{STYLE[s]}]{s.value}[/] {escape(hostrange.fold(by_status[s]))}"
            for s in (Status.FAIL, Status.WARN, Status.OK, Status.SKIP) if s in by_status))


def _print_findings(console: Console, report: DoctorReport, verbose: bool) -> None:
    print_findings(console, report.results, report.checks, verbose)


def print_findings(console: Console, results: Sequence[CheckResult], checks: Sequence[str],
                   verbose: bool = False) -> None:
    """WARN and FAIL (every status with -v), identical findings folded across hosts."""
    shown = {Status.WARN, Status.FAIL} | ({Status.OK, Status.SKIP} if verbose else set())
    findings = hostrange.hosts_by(((r.name, r.status, r.message, r.remedy), r.host)
                                  for r in results if r.status in shown)
    if not findings:
        return
    console.print("[bold]Findings[/]")
    details = {(r.name, r.host): r.details for r in results if r.details}
    position = {name: i for i, name in enumerate(checks)}
    for (name, status, message, remedy), hosts in sorted(
            findings.items(), key=lambda item: position.get(item[0][0], 0)):
        console.print(f" [{STYLE[status]}]{status.value}[/] {name} "
                      f"[cyan]{escape(hostrange.fold(hosts))}[/]: {escape(message)}")
        if remedy:
            console.print(f"      fix: {escape(remedy)}")
        for host in hosts if verbose else []:
            if (name, host) in details:
                console.print(f"      {host}: {escape(str(details[(name, host)]))}", style="dim")


def result_payload(result: CheckResult) -> dict[str, Any]:
    return {"check": result.name, "host": result.host, "status": result.status.value,
            "message": result.message, "remedy": result.remedy, "details": dict(result.details)}


def payload(report: DoctorReport, exit_code: int) -> dict[str, Any]:
    counts = Counter(r.status.value for r in report.results)
    return {
        "hosts": list(report.hosts),
        "checks": list(report.checks),
        "results": [result_payload(r) for r in report.results],
        "summary": report.summary,
        "facts": report.facts,
        "counts": {s.value: counts.get(s.value, 0) for s in Status},
        "exit_code": exit_code,
        "duration_s": round(report.duration_s, 3),
    }


def print_check_list(console: Console) -> None:
    table = Table(title="doctor checks")
    for column in ("check", "category", "what it looks at"):
        table.add_column(column)
    for spec in REGISTRY.values():
        table.add_row(spec.name, spec.category, spec.summary)
    console.print(table)
