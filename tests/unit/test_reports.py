"""The one report format nodes write and the controller reads."""

from __future__ import annotations

from gpucluster import reports


def test_a_report_line_parses_and_other_lines_are_not_reports() -> None:
    line = "@@gpc state exited 0 1700000000.5"  # as the node scripts write it
    assert reports.parse(line) == ("state", "exited 0 1700000000.5")
    assert reports.parse("@@gpc alive") == ("alive", "")
    for other in ("hello", "@@gpcstate x", "@@gpc ", " @@gpc state x", "[3]:@@gpc-state"):
        assert reports.parse(other) is None


def test_reports_by_kind_keep_their_order_among_other_output() -> None:
    output = "log line\n@@gpc busy j1\nmore\n@@gpc busy j2\n@@gpc started 42\n"
    assert reports.by_kind(output) == {"busy": ["j1", "j2"], "started": ["42"]}


def test_sections_hold_lines_until_their_end_and_its_exit_code() -> None:
    output = ("@@gpc section one\na\nb\n\n@@gpc end 3\n"
              "@@gpc section two\n@@gpc end -1\n@@gpc section cut\nlost")
    assert reports.sections(output) == {"one": reports.Section("a\nb", 3),
                                        "two": reports.Section("", -1)}
