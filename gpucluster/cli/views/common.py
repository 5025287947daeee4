"""What every view shares: JSON with its schema number, tables, progress bars."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

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

from gpucluster.wording import WARNING

JSON_SCHEMA_VERSION = 1


def discard_writes(stream: TextIO) -> None:
    """Point a stream whose reader went away (a closed pipe) at /dev/null: what is still
    buffered, and what later code or Python's exit writes, goes nowhere quietly."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def phase_printer(err: Console) -> Callable[[str], None]:
    """A long command's progress lines (launch's, provision's), dim; a line that warns
    stands out."""
    def say(text: str) -> None:
        style = "bold yellow" if text.startswith(WARNING) else "dim"
        err.print(f"[{style}]gpucluster: {escape(text)}[/]")
    return say


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


def table_fits(console: Console, key_width: int, labels: Sequence[str],
               cell_width: int) -> bool:
    """Whether a table of a key column and one column per label, each as wide as its
    label or its widest cell, fits the terminal (rich cuts what does not to `…`)."""
    borders = 3  # a column's padding and rule
    return key_width + 4 + sum(max(len(label), cell_width) + borders
                               for label in labels) <= console.width


_WHOLE_WORD = 30  # the longest word print_table keeps whole by widening its column


def print_table(console: Console, title: str, columns: Sequence[str],
                rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    # The key column stays whole; in the others a word too long for the column (a run's
    # job id) folds rather than losing its end to an ellipsis, and only where the
    # terminal leaves no room for it: each column is at least as wide as its longest
    # word (up to _WHOLE_WORD) where they all fit, else rich narrowed the state column
    # below a run's id while the command beside it kept room to spare.
    widest = [min(max((len(w) for row in rows for w in row[index].split()), default=0),
                  _WHOLE_WORD) for index in range(len(columns))]
    key = max((len(row[0]) for row in rows), default=0)
    fits = key + sum(widest[1:]) + 3 * len(columns) + 1 <= console.width
    for index, column in enumerate(columns):
        table.add_column(column, no_wrap=index == 0, overflow="fold",
                         min_width=widest[index] if fits and index else None)
    for row in rows:
        table.add_row(*row)
    console.print(table)
