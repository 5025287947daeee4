"""A job's lines printed among every node's: what a terminal takes as a command left
out, colours kept."""

from __future__ import annotations

import io

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
