"""The pid report's filter on a command's stderr: what a login script prints before it."""

from gpucluster.remote.connection import LineSplitter
from gpucluster.remote.ssh_channel import PID_REPORT, PidFilter, RemoteGroup


def _filtered(*chunks: bytes) -> tuple[list[str], RemoteGroup, str]:
    lines: list[str] = []
    stderr = LineSplitter("stderr", lambda _stream, line: lines.append(line))
    group = RemoteGroup(as_root=True)
    pid_filter = PidFilter(stderr, group)
    for chunk in chunks:
        pid_filter.feed(chunk)
    pid_filter.finish()
    return lines, group, stderr.finish()


def test_the_report_is_found_after_a_login_scripts_lines_and_only_it_is_taken() -> None:
    report = f"{PID_REPORT} 4242\n".encode()
    # a .bashrc's warnings first (pyenv's stale rehash lock), split across chunks
    lines, group, text = _filtered(b"pyenv: cannot rehash: couldn't acq", b"uire lock\nsecond ",
                                   b"line\n" + report[:5], report[5:] + b"the command's own\n")
    assert group.pid == 4242 and group.reported.is_set()
    assert lines == ["pyenv: cannot rehash: couldn't acquire lock", "second line",
                     "the command's own"]
    assert PID_REPORT not in text


def test_a_report_first_is_taken_and_a_later_look_alike_is_the_commands() -> None:
    lines, group, _ = _filtered(f"{PID_REPORT} 7\n{PID_REPORT} 8\n".encode())
    assert group.pid == 7
    assert lines == [f"{PID_REPORT} 8"]


def test_output_that_never_reaches_the_report_is_kept_whole() -> None:
    lines, group, text = _filtered(b"login script died here\n", b"no newline at the end")
    assert group.pid is None and not group.reported.is_set()
    assert lines == ["login script died here", "no newline at the end"]
    assert text == "login script died here\nno newline at the end"
