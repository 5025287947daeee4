"""The controller's copies of job logs as one stream: every line with its time, node,
rank and job; filtered (pattern, time window, nodes, ranks) and merged in time order
across nodes and jobs; as text or as Elastic Common Schema JSON for log shippers."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpucluster.errors import GpuclusterError
from gpucluster.launch.bar_draws import BarDraws
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import OutputCallback
from gpucluster.launch.tee_lines import FailureSummary, ranked
from gpucluster.numerals import ranges

TIMES_SUFFIX = ".times"  # beside each node's log: one stamp per line, from the node
ROTATED_SUFFIX = ".1"  # the older half of a node's log once it passed its share of the cap
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class LogLine(NamedTuple):  # a tuple: made for each of millions of lines, twice as fast
    time: float
    job: str
    node: str
    rank: int | None
    text: str


@dataclass(frozen=True)
class LogFilter:
    pattern: re.Pattern[str] | None = None
    since: float | None = None
    until: float | None = None
    nodes: frozenset[str] | None = None
    ranks: frozenset[int] | None = None

    def keeps(self, line: LogLine) -> bool:
        return ((self.since is None or line.time >= self.since)
                and (self.until is None or line.time <= self.until)
                and self._keeps(line.node, line.rank, line.text))

    def keeps_as_it_comes(self, node: str, rank: str | None, text: str) -> bool:
        """A line followed live, which has no time yet: by its node, rank and text."""
        return self._keeps(node, int(rank) if rank is not None else None, text)

    def _keeps(self, node: str, rank: int | None, text: str) -> bool:
        return ((self.nodes is None or node in self.nodes)
                and (self.ranks is None or rank in self.ranks)
                and (self.pattern is None or self.pattern.search(text) is not None))

    def passing(self, on_line: OutputCallback) -> OutputCallback:
        """`on_line`, given only the lines this filter keeps as they come."""
        def kept(node: str, rank: str | None, text: str) -> None:
            if self.keeps_as_it_comes(node, rank, text):
                on_line(node, rank, text)
        return kept


def duration_s(text: str) -> float | None:
    """`30s`, `10m`, `2h`, `1d` (or `1.5d`), `2w`, and sums such as `2h30m`, in seconds;
    None for anything else."""
    if not _DURATION.fullmatch(text.strip()):
        return None
    return sum(float(number) * _UNIT_S[unit]
               for number, unit in _DURATION_PART.findall(text.strip()))


def parse_when(text: str, option: str, now: float | None = None) -> float:
    """`10m`, `2h`, `1d` ago; or a local date and time, `2026-11-30T13:05` or `13:05`: the
    last 13:05 that has been (yesterday's, when it is 00:10 now: a log holds no future)."""
    now = time.time() if now is None else now
    ago = duration_s(text)
    if ago is not None:
        return now - ago
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text.strip()):
            today = datetime.datetime.fromtimestamp(now).date()
            when = datetime.datetime.fromisoformat(f"{today.isoformat()}T{text.strip()}")
            if when.timestamp() > now:
                when = datetime.datetime.combine(today - datetime.timedelta(days=1),
                                                 when.time())
            return when.timestamp()
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise GpuclusterError(f"{option} {text!r}: neither a duration ago nor a local time "
                              f"(fix: e.g. {option} 10m, 2h or 1d; or 13:05, "
                              f"2026-11-30T13:05:00)") from None


def time_window(since: str | None, until: str | None, now: float | None = None
                ) -> tuple[float | None, float | None]:
    """--since and --until as times, read against one `now`; a window that closes before
    it opens is refused, where filtering by it would only say that no line matches."""
    now = time.time() if now is None else now
    start = parse_when(since, "--since", now) if since is not None else None
    end = parse_when(until, "--until", now) if until is not None else None
    if start is not None and end is not None and start > end:
        raise GpuclusterError(f"--since {since} is after --until {until}: no line can be in "
                              f"between (fix: an earlier --since or a later --until; a "
                              f"duration is how long ago, so --since 2h --until 10m)")
    return start, end


def parse_pattern(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as error:
        raise GpuclusterError(f"--grep {text!r}: not a regular expression ({error}) "
                              f"(fix: escape it, e.g. 'loss \\\\(avg\\\\)')") from None


MAX_RANK = (1 << 20) - 1  # far beyond any world torchrun starts; bounds the set built


def parse_ranks(text: str, option: str = "--rank") -> frozenset[int]:
    """`3`, `0,4-7`: global ranks, single or as ranges."""
    spans = ranges(text)
    if spans is None:
        raise GpuclusterError(f"{option} {text!r}: expected global ranks from 0, single "
                              f"or as ranges (fix: e.g. {option} 3 or {option} 0,4-7)")
    if max(high for _, high in spans) > MAX_RANK:
        raise GpuclusterError(f"{option} {text!r}: ranks go up to {MAX_RANK} (fix: give "
                              f"the job's ranks, e.g. 0-15)")
    return frozenset(rank for low, high in spans for rank in range(low, high + 1))


def parse_stamp(value: str, previous: float) -> float:
    """One line of a node's node.times; `previous` where it is not a time."""
    try:
        return float(value.replace(",", "."))  # EPOCHREALTIME follows the locale
    except ValueError:
        return previous


def _stamps(path: Path) -> list[float]:
    stamps: list[float] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return stamps
    for value in text.splitlines():
        stamps.append(parse_stamp(value, stamps[-1] if stamps else 0.0))
    return stamps


def _node_lines(store: JobStore, record: JobRecord, node: str) -> Iterator[LogLine]:
    """The node's lines, the rotated part first, their stamps never going back (so that
    a merge keeps each node's own order, and a tail of it is each node's last lines). A
    line without a stamp of its own (a node without bash, an older job) takes the
    previous one's, else the job's start; but lines past the last stamp of a running
    job, which the stamper (a poll every 0.2 s) had not reached, were written before the
    copy: they take its time, as the newest lines they are."""
    log = store.node_log(record.id, node)
    texts: list[str] = []
    times: list[float] = []
    for path in (log.with_name(log.name + ROTATED_SUFFIX), log):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            copied = path.stat().st_mtime
        except OSError:
            continue
        stamps = _stamps(path.with_name(path.name + TIMES_SUFFIX))
        texts += lines
        # 0.0: a stamp missing, or no stamps at all; past them: not stamped yet
        times += [stamps[index] if index < len(stamps) else copied if stamps else 0.0
                  for index in range(len(lines))]
    return timed_lines(record, node, texts, times)


def timed_lines(record: JobRecord, node: str, texts: Iterable[str],
                times: Iterable[float]) -> Iterator[LogLine]:
    """A node's lines with each one's own time (0.0: none), as lines whose times never
    go back: one without a time of its own takes the previous line's, else the job's
    start. A progress bar's every draw; another rank's line glued to a draw cut off,
    and the empty line that ends a draw something was glued to left out, as live."""
    last = record.started_at
    job = record.id
    draws = BarDraws(every_s=0, live=False)
    summary = FailureSummary()  # its "[0]:" is torchrun's, no line of rank 0's
    for text, own in zip(texts, times, strict=True):
        last = max(last, own)  # 0.0 (none) never is more
        for piece in ranked(text):
            for shown in draws.take(piece):
                rank, message = summary.own(*shown)
                yield LogLine(last, job, node, int(rank) if rank else None, message)
    for shown in draws.rest():
        rank, message = summary.own(*shown)
        yield LogLine(last, job, node, int(rank) if rank else None, message)


def merged(store: JobStore, records: Iterable[JobRecord], keep: LogFilter,
           last: int | None = None) -> list[LogLine]:
    """Every kept line of these jobs, in time order (a node's own order within a stamp);
    only the `last` of them when given."""
    return in_time_order([line for record in records for node in record.hosts
                          if keep.nodes is None or node in keep.nodes
                          for line in _node_lines(store, record, node) if keep.keeps(line)],
                         last)


def in_time_order(lines: list[LogLine], last: int | None = None) -> list[LogLine]:
    """`lines` from several nodes merged in time order (a node's own order within a
    stamp); only the `last` of them when given."""
    lines.sort(key=lambda line: line.time)  # stable: per-node order kept
    return lines if last is None else lines[max(len(lines) - last, 0):]


def ecs(line: LogLine) -> dict[str, Any]:
    """One line in Elastic Common Schema field names (Filebeat, Vector, Promtail)."""
    stamp = datetime.datetime.fromtimestamp(line.time, tz=datetime.timezone.utc)
    return {"@timestamp": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "host.name": line.node, "job.id": line.job, "rank": line.rank,
            "stream": "combined" if line.rank is not None else "torchrun",
            "message": line.text}


def text(line: LogLine, across_jobs: bool = False) -> str:
    """`13:05:07.250 [node2/3] ...`; across jobs (days apart) with the day and the job."""
    clock = time.strftime("%Y-%m-%d %H:%M:%S" if across_jobs else "%H:%M:%S",
                          time.localtime(line.time)) + f".{int(line.time * 1000) % 1000:03d}"
    job = f" {line.job}" if across_jobs else ""
    return f"{clock}{job} {where(line.node, line.rank)} {line.text}"


def where(node: str, rank: int | str | None) -> str:
    """`[node2/3]`, or `[node2]` for a line of torchrun's own: how a job's line is shown."""
    return f"[{node}]" if rank is None else f"[{node}/{rank}]"
