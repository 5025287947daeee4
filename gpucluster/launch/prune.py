"""`gpucluster prune`: forget ended jobs started long enough ago. Each left on every node its
job dir (logs, pid files, torchrun's per-rank logs) and its checkpoints, and here its
record and log copies; nothing removes them but this. A job is removed only when every
node it ran on answers that nothing of it runs, and no recovery supervisor watches it.
Checkpoints stay unless asked for: they can be the weights of weeks of training."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster import hostrange, reports
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch.control import elsewhere, states
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.logsearch import duration_s
from gpucluster.launch.supervisor import supervisor_of
from gpucluster.remote.connection import Connection
from gpucluster.remote.session import Session
from gpucluster.templating import render

PRUNE_TIMEOUT_S = 300.0  # sizing and rm of the jobs' checkpoints: large, but bounded
def parse_age(text: str) -> float:
    """`7d`, `12h`, `30m`, `90s`, `2w`, `1d12h`, `0` (every ended job); a bare number is
    days."""
    seconds = duration_s(text) if not _bare_number(text) else float(text) * 86400
    if seconds is None:
        raise GpuclusterError(f"--older-than {text!r}: not an age (fix: a number with w, d, "
                              f"h, m or s, e.g. 7d, 12h or 1d12h; 0 for every ended job)")
    return seconds


def age_words(text: str) -> str:
    """The age as the lines about it say it: a bare number with its unit, days."""
    return f"{text.strip()}d" if _bare_number(text) else text.strip()


def _bare_number(text: str) -> bool:
    return re.fullmatch(r"[0-9]+(\.[0-9]+)?", text.strip()) is not None


@dataclass(frozen=True)
class NodeFiles:
    """A job's files on one node, in bytes; None where the node has none."""

    job_bytes: int | None
    checkpoint_bytes: int | None
    checkpoint_dir: str = ""  # which directory (once_per_directory): shared homes share it


@dataclass
class JobPrune:
    record: JobRecord
    remove_checkpoints: bool  # asked for, and no attempt of its run is kept
    local_bytes: int
    nodes: dict[str, NodeFiles] = field(default_factory=dict)
    unlisted: list[str] = field(default_factory=list)  # ran there; the inventory lost it
    removed: bool = False
    problem: str = ""  # why it was not (wholly) removed

    @property
    def node_bytes(self) -> int:
        """What removing it frees on the nodes."""
        return self.job_bytes + (self.checkpoint_bytes if self.remove_checkpoints else 0)

    @property
    def job_bytes(self) -> int:
        return sum(f.job_bytes or 0 for f in self.nodes.values())

    @property
    def checkpoint_bytes(self) -> int:
        return once_per_directory((f.checkpoint_dir, f.checkpoint_bytes)
                                  for f in self.nodes.values())


def once_per_directory(sizes: Iterable[tuple[str, int | None]]) -> int:
    """Bytes summed over nodes, counting once a directory several nodes see (a home they
    share): nodes reporting the same identity (its inode and newest file's time, as
    prune's node scripts print it) see one directory. "" is a directory of its own."""
    unique: dict[str, int] = {}
    for index, (identity, count) in enumerate(sizes):
        unique[identity or f"#{index}"] = count or 0
    return sum(unique.values())


@dataclass
class PruneReport:
    jobs: list[JobPrune]
    skipped: list[tuple[str, str]]  # job id, why it stays
    removing: bool  # --yes: the jobs were removed, not only listed


def prune(session: Session, inventory: Inventory, store: JobStore, older_than_s: float,
          checkpoints: bool, remove: bool, now: float | None = None) -> PruneReport:
    """Size (and with `remove`, delete) the files of every ended job started more than
    `older_than_s` ago: one round trip per node for the jobs' states, one for their
    files."""
    cutoff = (now if now is not None else time.time()) - older_than_s
    records = store.records()
    old = [r for r in records if r.started_at <= cutoff]
    skipped: list[tuple[str, str]] = []
    ended = _ended(session, inventory, store, old, skipped)
    ended_ids = {r.id for r in ended}  # a set: hundreds of records each looked up
    kept_runs = {r.checkpoints_on_node() for r in records if r.id not in ended_ids}
    listed = {h.name for h in inventory.hosts}
    jobs = [JobPrune(r, checkpoints and r.checkpoints_on_node() not in kept_runs,
                     _local_bytes(store.directory(r.id)),
                     unlisted=[n for n in r.hosts if n not in listed]) for r in ended]
    _on_nodes(session, inventory, jobs, remove)
    if remove:
        for job in jobs:
            if not job.problem:
                shutil.rmtree(store.directory(job.record.id), ignore_errors=True)
                job.removed = True
    return PruneReport(jobs, skipped, remove)


def _ended(session: Session, inventory: Inventory, store: JobStore,
           records: Sequence[JobRecord], skipped: list[tuple[str, str]]) -> list[JobRecord]:
    """The records whose every node answers that nothing of the job runs there."""
    table = states(session, inventory, records) if records else {}
    listed = {h.name for h in inventory.hosts}
    ended = []
    for record in records:
        # Listed here, but another machine: another cluster's inventory beside this one.
        moved = [n for n in elsewhere(inventory, record) if n in listed]
        if supervisor_of(store, record.id) is not None:
            skipped.append((record.id, "its recovery supervisor still runs"))
            continue
        if moved:
            skipped.append((record.id, f"it ran on another {hostrange.fold(moved)} than "
                                       f"{inventory.path.name} lists (fix: "
                                       f"{record.started_with()})"))
            continue
        by_state = hostrange.hosts_by((s.state, n) for n, s in table[record.id].items())
        if "running" in by_state:
            skipped.append((record.id, f"running on {hostrange.fold(by_state['running'])}"))
        elif "stopping" in by_state:
            skipped.append((record.id, f"being stopped on "
                                       f"{hostrange.fold(by_state['stopping'])}"))
        elif "leftover" in by_state:
            skipped.append((record.id, f"processes of it are left on "
                                       f"{hostrange.fold(by_state['leftover'])} (fix: "
                                       f"gpucluster stop {record.id})"))
        elif "unreachable" in by_state:
            skipped.append((record.id, f"{hostrange.fold(by_state['unreachable'])} did not "
                                       f"answer: its state there is unknown"))
        else:
            ended.append(record)
    return ended


def _on_nodes(session: Session, inventory: Inventory, jobs: list[JobPrune],
              remove: bool) -> None:
    by_node = {h.name: [j for j in jobs if h.name in j.record.hosts] for h in inventory.hosts}
    wanted = [h for h in inventory.hosts if by_node[h.name]]

    def run(connection: Connection) -> dict[str, tuple[str, ...]]:
        mine = by_node[connection.host]
        script = render("launch/prune.sh.j2", node=connection.host, remove=remove, jobs=[
            {"id": j.record.id, "jobs_dir": j.record.jobs_dir,
             "checkpoints": j.record.checkpoints_on_node(),
             "remove_checkpoints": j.remove_checkpoints} for j in mine])
        done = connection.run(script, timeout=PRUNE_TIMEOUT_S)
        found = {fields[0]: tuple(fields[1:]) for fields in
                 (line.split() for line in reports.by_kind(done.stdout).get("pruned", []))
                 if len(fields) == 5}
        if not done.ok or len(found) != len(mine):
            raise GpuclusterError(done.stderr.strip()[-200:] or f"exit {done.exit_code}")
        return found

    answers = session.map(wanted, run)
    by_id = {j.record.id: j for j in jobs}
    for node, found in answers.values.items():
        for job_id, (job_kib, checkpoint_kib, code, checkpoint_dir) in found.items():
            job = by_id[job_id]
            job.nodes[node] = NodeFiles(_bytes(job_kib), _bytes(checkpoint_kib),
                                        "" if checkpoint_dir == "-" else checkpoint_dir)
            if code != "0":
                job.problem = f"{node}: removing its files failed (exit {code})"
    for node, failure in answers.failures.items():
        for job in by_node[node]:
            job.problem = f"{node}: {failure.message}"


def _bytes(kib: str) -> int | None:
    return int(kib) * 1024 if kib.isdigit() else None


def _local_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
