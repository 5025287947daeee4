"""All output: rich tables and clush-style folded results for people, JSON for machines.

Core code returns values; only this module (called by the CLI) turns them into text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich import filesize
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from gpucluster import hostrange
from gpucluster.inventory import Inventory
from gpucluster.remote.result import CommandResult, FanoutResult

JSON_SCHEMA_VERSION = 1


def print_json(console: Console, payload: dict[str, Any]) -> None:
    """JSON on stdout, exactly as given (no rich markup or wrapping)."""
    console.file.write(json.dumps({"schema": JSON_SCHEMA_VERSION, **payload}, indent=2) + "\n")


@contextmanager
def host_progress(console: Console, total: int, what: str) -> Iterator[Callable[[], None]]:
    """A transient "hosts done" bar on a terminal; nothing when output is piped."""
    if not console.is_terminal or total < 2:
        yield lambda: None
        return
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(what, total=total)
        yield lambda: progress.advance(task)


class AverageRateColumn(ProgressColumn):
    """Bytes per second since the node's first byte; it stays shown once the node is
    done (rich's own speed column shows "?" for a transfer too short to sample)."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        if not elapsed or not task.completed:
            return Text("?", style="progress.data.speed")
        rate = filesize.decimal(int(task.completed / elapsed))
        return Text(f"{rate}/s", style="progress.data.speed")


@contextmanager
def byte_progress(console: Console) -> Iterator[Callable[[str, int, bool], None]]:
    """Per-node bars of bytes received and rate, for image pushes; silent when piped."""
    if not console.is_terminal:
        yield lambda _node, _bytes, _done: None
        return
    from rich.progress import DownloadColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  AverageRateColumn(), console=console, transient=False) as progress:
        tasks: dict[str, Any] = {}

        def update(node: str, received: int, done: bool) -> None:
            if node not in tasks:
                tasks[node] = progress.add_task(node, total=None)
            progress.update(tasks[node], completed=received,
                            total=received if done else None)

        yield update


# -- inventory


def hosts_payload(inventory: Inventory) -> dict[str, Any]:
    return {
        "inventory": str(inventory.path),
        "cluster": {
            "rendezvous_port": inventory.cluster.rendezvous_port,
            "python": inventory.cluster.python,
            "torchrun": inventory.cluster.torchrun,
            "env": dict(inventory.cluster.env),
            "image": inventory.cluster.image,
            "work_dir": inventory.cluster.work_dir,
            "known_hosts": inventory.cluster.known_hosts,
        },
        "groups": {name: list(members) for name, members in inventory.groups.items()},
        "hosts": [
            {
                "name": h.name, "address": h.address, "user": h.user, "port": h.port,
                "identity_file": h.identity_file, "jump_host": h.jump_host,
                "connection": h.connection, "gpus": h.gpus, "gpu_model": h.gpu_model,
                "torch_device": h.torch_device,
                "labels": dict(h.labels), "groups": list(h.groups),
            }
            for h in inventory.hosts
        ],
    }


def print_hosts(console: Console, inventory: Inventory) -> None:
    """The resolved hosts; columns that are empty for every host are left out."""
    columns: dict[str, list[str]] = {
        "name": [h.name for h in inventory.hosts],
        "address": ["local" if h.is_local else h.address for h in inventory.hosts],
        "user": [h.user for h in inventory.hosts],
        "port": [str(h.port) for h in inventory.hosts],
        "via": [h.jump_host or "" for h in inventory.hosts],
        "gpus": ["" if h.gpus is None else str(h.gpus) for h in inventory.hosts],
        "model": [h.gpu_model or "" for h in inventory.hosts],
        "groups": [",".join(h.groups) for h in inventory.hosts],
        "labels": [",".join(f"{k}={v}" for k, v in h.labels.items()) for h in inventory.hosts],
    }
    shown = {name: cells for name, cells in columns.items() if any(cells)}
    table = Table(title=f"{len(inventory.hosts)} hosts in {inventory.path}")
    for name in shown:
        table.add_column(name)
    for row in zip(*shown.values(), strict=True):
        table.add_row(*row)
    console.print(table)
    cluster = inventory.cluster
    console.print(f"head (rendezvous): {inventory.head.name}:{cluster.rendezvous_port}  "
                  f"python: {cluster.python}  work_dir: {cluster.work_dir}")


# -- gpucluster run


def run_payload(command: str, result: FanoutResult[CommandResult]) -> dict[str, Any]:
    hosts = []
    for name in result.hosts:
        value = result.values.get(name)
        failure = result.failures.get(name)
        hosts.append({
            "host": name,
            "ok": value is not None and value.ok,
            "exit_code": value.exit_code if value else None,
            "stdout": value.stdout if value else None,
            "stderr": value.stderr if value else None,
            "duration_s": round(value.duration_s, 3) if value else None,
            "error": {"kind": failure.kind.value, "message": failure.message}
            if failure else None,
        })
    return {"command": command, "hosts": hosts,
            "failed": [h["host"] for h in hosts if not h["ok"]]}


def fold_outputs(result: FanoutResult[CommandResult]) -> list[tuple[list[str], str, int]]:
    """Hosts grouped by identical output and exit code, in order of first appearance."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name in result.hosts:
        value = result.values.get(name)
        if value is not None:
            groups.setdefault((value.stdout + value.stderr, value.exit_code), []).append(name)
    return [(hosts, output, code) for (output, code), hosts in groups.items()]


def print_run(console: Console, result: FanoutResult[CommandResult]) -> None:
    """clush -b: a shared output under its folded host list, a unique one line-prefixed."""
    for hosts, output, exit_code in fold_outputs(result):
        folded = hostrange.fold(hosts)
        lines = output.rstrip("\n").split("\n") if output else []
        if len(hosts) > 1 and lines:
            console.print(f"[bold cyan]{'-' * 15}\n{escape(folded)} ({len(hosts)})"
                          f"\n{'-' * 15}[/]")
            for line in lines:
                console.print(escape(line))
        else:
            for line in lines:
                console.print(f"[cyan]{escape(folded)}:[/] {escape(line)}")
        if exit_code != 0:
            console.print(f"[yellow]{escape(folded)}: exited with exit code {exit_code}[/]")
    for name in result.failed_hosts:
        failure = result.failures[name]
        console.print(f"[bold red]{escape(name)}: {failure.kind.value}:[/] "
                      f"{escape(failure.message)}")


def failure_summary(result: FanoutResult[CommandResult]) -> str | None:
    """One line naming every host that failed and why; None when all succeeded."""
    reasons: list[str] = []
    for name in result.hosts:
        failure = result.failures.get(name)
        value = result.values.get(name)
        if failure is not None:
            reasons.append(f"{name} ({failure.kind.value})")
        elif value is not None and not value.ok:
            reasons.append(f"{name} (exit {value.exit_code})")
    if not reasons:
        return None
    return f"{len(reasons)} of {len(result.hosts)} hosts failed: {', '.join(reasons)}"


def print_table(console: Console, title: str, columns: Sequence[str],
                rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, no_wrap=index == 0)  # the key column stays whole
    for row in rows:
        table.add_row(*row)
    console.print(table)
