"""The controller's job logs as one searchable stream: stamps, filters, time order, ECS
JSON; and the per-node copy's size cap."""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pytest

from gpucluster.errors import GpuclusterError
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.log_copy import LogCopy
from gpucluster.launch.logsearch import (
    LogFilter,
    LogLine,
    ecs,
    merged,
    parse_when,
    text,
    time_window,
)

JOB = "20261130-120000-abcd"


def _job(tmp_path: Path, logs: dict[str, list[tuple[float, str]]]) -> tuple[JobStore,
                                                                            JobRecord]:
    store = JobStore(tmp_path)
    record = JobRecord(JOB, "t.py", [], list(logs), "/c", "/j", 100.0, {n: 2 for n in logs})
    store.save(record)
    for node, lines in logs.items():
        store.node_log(JOB, node).write_text("".join(f"{t}\n" for _, t in lines))
        store.node_log(JOB, node).with_name(f"{node}.log.times").write_text(
            "".join(f"{s}\n" for s, _ in lines))
    return store, record


def test_lines_of_all_nodes_merge_in_time_order_and_filter(tmp_path: Path) -> None:
    store, record = _job(tmp_path, {
        "node1": [(101.0, "[0]:epoch 0 loss 0.5"), (103.0, "[1]:epoch 1 loss 0.2"),
                  (105.0, "torchrun: done")],
        "node2": [(102.0, "[2]:ready"), (104.0, "[3]:Traceback: RuntimeError boom")]})
    every = merged(store, [record], LogFilter())
    assert [(line.node, line.rank) for line in every] == [
        ("node1", 0), ("node2", 2), ("node1", 1), ("node2", 3), ("node1", None)]
    loss = merged(store, [record], LogFilter(pattern=re.compile(r"loss \d")))
    assert [line.text for line in loss] == ["epoch 0 loss 0.5", "epoch 1 loss 0.2"]
    window = merged(store, [record], LogFilter(since=102.0, until=104.0, ranks=frozenset({3})))
    assert [line.text for line in window] == ["Traceback: RuntimeError boom"]
    assert [line.rank for line in merged(store, [record], LogFilter(
        nodes=frozenset({"node2"})))] == [2, 3]
    assert [line.rank for line in merged(store, [record], LogFilter(), last=2)] == [3, None]
    assert merged(store, [record], LogFilter(), last=0) == []
    assert merged(store, [record], LogFilter(), last=99) == every


def test_a_line_without_its_own_stamp_takes_the_one_before(tmp_path: Path) -> None:
    store, record = _job(tmp_path, {"node1": [(101.0, "[0]:a"), ("-", "[0]:b")],
                                    "node2": [(101.5, "[2]:x")]})
    store.node_log(JOB, "node2").with_name("node2.log.times").unlink()  # no bash there
    assert [(line.node, line.time) for line in merged(store, [record], LogFilter())] == [
        ("node2", 100.0), ("node1", 101.0), ("node1", 101.0)]  # node2: the job's start


def test_lines_the_stamper_has_not_reached_are_as_new_as_the_copy(tmp_path: Path) -> None:
    """A running job's newest lines, copied before the stamper (a poll every 0.2 s)
    stamped them, took the stamp before theirs: a merge put them among older lines of
    other nodes, and `logs -n` showed one rank's line but not the line written before it
    on the same node."""
    store, record = _job(tmp_path, {"node1": [(101.0, "[0]:a"), (102.5, "[1]:b")],
                                    "node2": [(105.0, "[2]:x")]})
    copy = store.node_log(JOB, "node1")
    copy.write_text("[0]:a\n[1]:b\n[0]:c\n")  # c: not stamped yet
    os.utime(copy, (110.0, 110.0))
    assert [(line.text, line.time) for line in merged(store, [record], LogFilter())] == [
        ("a", 101.0), ("b", 102.5), ("x", 105.0), ("c", 110.0)]


def test_a_node_keeps_its_own_order_when_its_clock_steps_back(tmp_path: Path) -> None:
    store, record = _job(tmp_path, {"node1": [(101.0, "[0]:a"), (104.0, "[0]:b"),
                                              (102.0, "[0]:c")],
                                    "node2": [(103.0, "[2]:x")]})
    assert [line.text for line in merged(store, [record], LogFilter())] == ["a", "x", "b",
                                                                            "c"]


def test_ecs_fields_for_log_shippers() -> None:
    from gpucluster.launch.logsearch import LogLine

    line = LogLine(1764504000.25, JOB, "node2", 3, "epoch 1 loss 0.2")
    assert ecs(line) == {"@timestamp": "2025-11-30T12:00:00.250Z", "host.name": "node2",
                         "job.id": JOB, "rank": 3, "stream": "combined",
                         "message": "epoch 1 loss 0.2"}
    assert ecs(LogLine(0.0, JOB, "n", None, "x"))["stream"] == "torchrun"


def test_lines_across_jobs_name_their_job_and_day() -> None:
    """`logs --all-jobs` merges every job's lines: each must say which job, and its day."""
    moment = datetime.datetime(2026, 11, 30, 13, 5, 7, 250000).timestamp()
    line = LogLine(moment, JOB, "node2", 3, "epoch 1 loss 0.2")
    assert text(line) == "13:05:07.250 [node2/3] epoch 1 loss 0.2"
    assert text(line, across_jobs=True) == \
        f"2026-11-30 13:05:07.250 {JOB} [node2/3] epoch 1 loss 0.2"


def test_since_and_until_take_durations_and_local_times() -> None:
    now = datetime.datetime(2026, 11, 30, 14, 0, 0).timestamp()
    assert parse_when("10m", "--since", now) == now - 600
    assert parse_when("1.5h", "--since", now) == now - 5400
    assert parse_when("1h30m", "--since", now) == now - 5400
    assert parse_when("1w", "--since", now) == now - 7 * 86400
    assert parse_when("13:05", "--since", now) == now - 55 * 60
    # A time of day still to come is yesterday's: at 00:10, 23:50 is 20 minutes ago
    after_midnight = datetime.datetime(2026, 12, 1, 0, 10, 0).timestamp()
    assert parse_when("23:50", "--since", after_midnight) == after_midnight - 20 * 60
    assert parse_when("2026-11-30T13:00:00", "--until", now) == now - 3600
    with pytest.raises(GpuclusterError, match=r"^--since 'yesterday': .* \(fix: e\.g\. "
                       r"--since 10m, 2h or 1d; or 13:05, 2026-11-30T13:05:00\)$"):
        parse_when("yesterday", "--since", now)


def test_a_time_window_that_closes_before_it_opens_is_refused() -> None:
    now = datetime.datetime(2026, 11, 30, 14, 0, 0).timestamp()
    assert time_window("2h", "10m", now) == (now - 7200, now - 600)
    assert time_window("10m", "10m", now) == (now - 600, now - 600)  # one `now` for both
    assert time_window(None, "13:00", now) == (None, now - 3600)
    with pytest.raises(GpuclusterError, match=r"^--since 10m is after --until 1h: .*"
                       r"\(fix: .* --since 2h --until 10m\)$"):
        time_window("10m", "1h", now)


def test_a_nodes_copy_rotates_at_half_its_cap_with_its_stamps(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    copy = LogCopy(log, cap_bytes=40)  # rotates past 20 bytes
    lines = [f"line {i:02d} ......" for i in range(7)]  # 16 bytes each with the newline
    for line in lines:
        copy.write(line)
    for i in range(7):
        copy.stamp(str(100 + i))
    copy.close(answered=True)
    rotated = log.with_name("node1.log.1")
    # 7 lines of 16 bytes: [0,1] [2,3] [4,5] [6]: the first two rotations dropped 0-3.
    assert rotated.read_text().splitlines() == lines[4:6]
    assert log.read_text().splitlines() == lines[6:]
    assert log.with_name("node1.log.1.times").read_text().split() == ["104", "105"]
    assert log.with_name("node1.log.times").read_text().split() == ["106"]


def test_an_unreachable_node_leaves_the_old_copy_be(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    log.write_text("what we had\n")
    LogCopy(log, 1 << 20).close(answered=False)
    assert log.read_text() == "what we had\n"
    LogCopy(log, 1 << 20).close(answered=True)  # it answered: its log is empty
    assert log.read_text() == ""


def test_a_nodes_last_lines_pair_with_their_stamps_from_the_end() -> None:
    """`logs -n`: the node sends its log's and its node.times' last lines. On a running
    job the stamper is behind, so there are fewer stamps: the newest are paired with
    the newest, and a line left without one takes the next older one's (or the job's
    start), so that no node's lines go back in time."""
    from gpucluster.launch.log_tail import parse_tail

    record = JobRecord("20260101-000000-abcd", "t.py", [], ["n1"], "/c", "/j", 100.0,
                       {"n1": 2})
    tail = parse_tail(record, "n1", "[0]:step 7\n[1]:step 7\ntorchrun says\n"
                                    "@@gpc state exited 0 150.5\n@@gpc times\n"
                                    "120,5\nnot a time\n")
    assert (tail.state.state, tail.state.exit_code) == ("exited", 0)
    assert [(line.time, line.rank, line.text) for line in tail.lines] == [
        (100.0, 0, "step 7"), (120.5, 1, "step 7"), (120.5, None, "torchrun says")]
    # A node cut off before its state: all it sent is taken for log, with no stamps.
    lost = parse_tail(record, "n1", "only\n@@gpc times\n1\n")
    assert lost.state.state == "lost" and [line.time for line in lost.lines] == [100.0] * 3
    # More stamps than lines (the log's last line half written): the newest pair up.
    whole = parse_tail(record, "n1", "a\n@@gpc state running - \n@@gpc times\n101\n102\n")
    assert [line.time for line in whole.lines] == [102.0]


def _copy_of(log: Path, lines: list[str], cap_bytes: int, until: int | None = None,
             answered: bool = True) -> LogCopy:
    """A copy of `lines` with a stamp each; `until`: cut short there, never closed (the
    process ended by Ctrl-C)."""
    copy = LogCopy(log, cap_bytes)
    for line in lines[:until]:
        copy.write(line)
    if until is None:
        for index in range(len(lines)):
            copy.stamp(str(100 + index))
        copy.close(answered=answered)
    elif copy.file is not None:
        copy.file.flush()
    return copy


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())
            if not p.name.endswith("copy-lock")}


@pytest.mark.parametrize("cap_bytes", [1 << 20, 40])  # 40: it rotates every 2 lines
def test_a_copy_written_again_and_cut_short_leaves_the_one_before_whole(
        tmp_path: Path, cap_bytes: int) -> None:
    """`logs -f` of a job whose copy was whole, ended by Ctrl-C while it fetched the log
    again from its first line: the copy was cut to what had come, its stamps left
    behind it."""
    lines = [f"line {i:02d} ......" for i in range(9)]
    whole = tmp_path / "whole"
    whole.mkdir()
    _copy_of(whole / "node1.log", lines, cap_bytes)
    log = tmp_path / "job" / "node1.log"
    log.parent.mkdir()
    _copy_of(log, lines[:7], cap_bytes)  # the copy before: the job had printed 7 lines
    before = _files(log.parent)
    for until in (1, 3, 6):
        cut = _copy_of(log, lines, cap_bytes, until=until)
        assert {k: v for k, v in _files(log.parent).items() if "part" not in k} == before
        cut.close(answered=False)  # a node that stopped answering: the same
        assert _files(log.parent) == before
    # Caught up with the log as it was when the follow began, it is the copy, written on
    # where readers of a running job look.
    running = _copy_of(log, lines, cap_bytes, until=8)
    running.caught_up()
    running.write(lines[8])
    assert running.file is not None
    running.file.flush()
    assert "".join(v for k, v in _files(log.parent).items()
                   if not k.endswith(".times")).count("line 08") == 1
    assert not [name for name in _files(log.parent) if "part" in name]
    running.close(answered=False)
    _copy_of(log, lines, cap_bytes)  # and whole, as a copy made from nothing
    assert _files(log.parent) == _files(whole)


def test_one_process_writes_a_copy_the_others_leave_it_be(tmp_path: Path) -> None:
    """An attached launch writing the copy while `logs` of the job fetched it again: both
    wrote it, each from its own offset."""
    log = tmp_path / "node1.log"
    live = LogCopy(log, 1 << 20)
    live.write("line 1")
    other = _copy_of(log, ["line 1", "line 2"], 1 << 20)
    assert other.elsewhere
    live.write("line 2")
    live.write("line 3")
    live.close(answered=True)
    assert log.read_text() == "line 1\nline 2\nline 3\n"
    again = _copy_of(log, ["line 1", "line 2", "line 3", "line 4"], 1 << 20)
    assert not again.elsewhere and log.read_text().endswith("line 4\n")


def test_a_copy_made_after_the_job_ended_is_final_until_one_replaces_it(
        tmp_path: Path) -> None:
    from gpucluster.launch.log_copy import Ending, ending

    log = tmp_path / "node1.log"
    _copy_of(log, ["line 1"], 1 << 20)  # the job still ran
    assert ending(log) is None
    copy = LogCopy(log, 1 << 20)
    copy.write("line 1")
    copy.write("line 2")
    copy.close(answered=True, ended="exited 0 1800000002.5")
    assert ending(log) == Ending("exited 0 1800000002.5", whole=True)
    cut = _copy_of(log, ["line 1", "line 2"], 1 << 20, until=1)
    cut.close(answered=False)  # cut short: the copy before, final, stays
    assert ending(log) is not None and log.read_text() == "line 1\nline 2\n"
    again = _copy_of(log, ["line 1", "line 2"], 1 << 20, until=2)
    again.caught_up()  # in its place, not yet whole
    assert ending(log) is None
    log.with_name("node1.ended").write_text("")  # a version before marked it so
    assert ending(log) is None


def test_a_final_copy_that_lost_its_oldest_lines_is_not_whole(tmp_path: Path) -> None:
    from gpucluster.launch.log_copy import ending

    log = tmp_path / "node1.log"
    copy = LogCopy(log, 40)  # each half holds two lines of 10 bytes
    for index in range(6):
        copy.write(f"line {index:04d}")
    copy.close(answered=True, ended="stopped - 1800000002.5")
    end = ending(log)
    assert end is not None and not end.whole and end.state.startswith("stopped")
    kept = LogCopy(tmp_path / "node2.log", 40)
    for index in range(4):  # rotated once: NODE.log.1 and NODE.log hold them all
        kept.write(f"line {index:04d}")
    kept.close(answered=True, ended="exited 0")
    assert (end := ending(tmp_path / "node2.log")) is not None and end.whole


def test_an_ended_job_is_read_from_its_final_copies_without_a_connection(
        tmp_path: Path) -> None:
    """`logs JOB --grep` fetched every node's whole log again each time: 5.2 s for a
    finished job's 52 MB on the sandbox, where reading the copies takes 1.8 s. A plain
    `logs JOB` did too, and with a node down since, said the job's first failure was
    that node, unreachable, where the job had exited 0 on it."""
    import contextlib
    import socket
    import subprocess
    import sys
    import threading

    from gpucluster.launch.jobs import JobRecord, JobStore, new_job_id

    listener = socket.create_server(("127.0.0.2", 0))  # n2's: counts connections, answers none
    listener.settimeout(0.2)
    asked: list[socket.socket] = []
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listener.accept()
                connection.close()
                asked.append(connection)

    threading.Thread(target=count, daemon=True).start()
    port = listener.getsockname()[1]
    inventory = tmp_path / "c.yaml"
    inventory.write_text(f"hosts:\n  - {{name: n1, address: 127.0.0.1, port: 9}}\n"
                         f"  - {{name: n2, address: 127.0.0.2, port: {port}}}\n")
    store = JobStore(tmp_path / ".gpucluster")
    record = JobRecord(new_job_id(1_800_000_000), "train.py", [], ["n1", "n2"], "/srv/p",
                       "/srv/jobs", 1_800_000_000.0, {"n1": 1, "n2": 1})
    store.save(record)
    for node, rank, code in (("n1", 0, 0), ("n2", 1, 1)):
        copy = LogCopy(store.node_log(record.id, node), 1 << 20)
        for number, words in enumerate((f"loss 0.5 on {node}", f"done on {node}")):
            copy.write(f"[{rank}]:{words}")
            copy.stamp(f"180000000{number + 1}.{rank}")
        copy.close(answered=True, ended=f"exited {code} 1800000003")
    logs = [sys.executable, "-m", "gpucluster", "logs", "-i", str(inventory), record.id,
            "--connect-timeout", "2"]
    search = [*logs, "--grep", "loss"]
    try:
        found = subprocess.run(search, capture_output=True, text=True, check=False)
        assert found.returncode == 0, found.stderr
        assert [line.split(" ", 1)[1] for line in found.stdout.splitlines()] == [
            "[n1/0] loss 0.5 on n1", "[n2/1] loss 0.5 on n2"]
        for options, code, shown in (
                ([], 0, ["loss 0.5 on n1", "loss 0.5 on n2", "done on n1", "done on n2"]),
                (["-f"], 1, ["loss 0.5 on n1", "loss 0.5 on n2", "done on n1", "done on n2"]),
                # followed, a search keeps the lines as they come (they have no time yet)
                (["-f", "--rank", "1"], 1, ["loss 0.5 on n2", "done on n2"]),
                (["-f", "--grep", "done"], 1, ["done on n1", "done on n2"]),
                (["-n", "1"], 0, ["done on n2"])):
            plain = subprocess.run([*logs, *options], capture_output=True, text=True,
                                   check=False)
            assert plain.returncode == code, plain.stderr
            assert [line.split("] ", 1)[1] for line in plain.stdout.splitlines()] == shown
            words = " ".join(plain.stderr.split())
            assert "first failure: n2" in words and "exited 0 on n1, exited 1 on n2" in words
        timed = subprocess.run([*logs, "-f", "--since", "1h"], capture_output=True,
                               text=True, check=False)
        assert timed.returncode == 2 and "-f shows the lines as they come, which have no " \
            "time yet: not with --since, --until or --json" in timed.stderr, timed.stderr
        listed = subprocess.run([sys.executable, "-m", "gpucluster", "jobs", "-i",
                                 str(inventory), "--json", "--connect-timeout", "2"],
                                capture_output=True, text=True, check=False)
        assert listed.returncode == 0, listed.stderr
        [job] = json.loads(listed.stdout)["jobs"]
        assert {node: (s["state"], s["exit_code"]) for node, s in job["nodes"].items()} == {
            "n1": ("exited", 0), "n2": ("exited", 1)}
        assert asked == []
        # A node whose copy is not final is asked (here it fails; its copy is shown).
        store.node_log(record.id, "n2").with_name("n2.ended").unlink()
        again = subprocess.run(search, capture_output=True, text=True, check=False)
        assert again.stdout == found.stdout and len(asked) == 1
    finally:
        done.set()
