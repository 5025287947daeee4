"""A job's lines printed among every node's: what a terminal takes as a command left
out, colours kept."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from gpucluster.cli.views.line_printer import LinePrinter
from gpucluster.cli.views.terminal_text import printable


def test_cursor_moves_titles_and_bells_are_left_out_and_colours_kept() -> None:
    assert printable(" 97%|######### | 39/40 [00:03<00:09, 10.00it/s]\x1b[A") == (
        " 97%|######### | 39/40 [00:03<00:09, 10.00it/s]")  # tqdm's bar below another
    assert printable("\x1b[2J\x1b[Hcleared") == "cleared"
    assert printable("\x1b]0;pwned\x07title") == "title"
    assert printable("bell\x07 back\x08space \x9b2J") == "bell backspace 2J"
    assert printable("\x1b[1;31mred\x1b[0m") == "\x1b[1;31mred\x1b[0m"
    for text in ("plain █▌ 45%|", "a\tb", ""):
        assert printable(text) == text


def test_a_ranks_cursor_move_up_does_not_reach_the_terminal() -> None:
    """Printed as it came, the next line of the view wrote over this one."""
    out = io.StringIO()
    printer = LinePrinter(out)
    printer("node1", "0", " 5%|          | 2/40\x1b[A")
    printer("node2", "1", "\x1b[32mloss 0.5\x1b[0m")
    printer.finish()
    assert out.getvalue() == "[node1/0]  5%|          | 2/40\n[node2/1] \x1b[32mloss 0.5\x1b[0m\n"


def test_the_first_failures_report_prints_the_ranks_lines_without_controls(
        tmp_path: Path) -> None:
    from gpucluster.cli.views.launch import print_outcome
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import FirstFailure, JobOutcome, NodeState

    state = NodeState("node2", "exited", exit_code=1)
    failure = FirstFailure("node2", state, 3, 1, tail=("[3]:\x1b]0;pwned\x07epoch 2",),
                           rank_tail=("\x1b[2J\x1b[Hloss nan", "ValueError: nan\x1b[A"))
    record = JobRecord("20261206-040000-abcd", "train.py", [], ["node2"], "/c", "/j", 0.0,
                       {"node2": 2})
    out = io.StringIO()
    print_outcome(Console(file=out, width=200), JobOutcome(record, {"node2": state}, failure),
                  JobStore(tmp_path))
    shown = out.getvalue()
    assert "  loss nan\n  ValueError: nan\n" in shown and "  [3]:epoch 2\n" in shown, shown
    assert "\x1b" not in shown and "\x07" not in shown
