"""The controller's record of jobs: `.gpucluster/jobs/<id>/` with job.json and one log
per node, so `jobs`, `logs` and `stop` work from any later shell."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shlex
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gpucluster.errors import GpuclusterError

JOB_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")  # fullmatch: no "\n" tail


@dataclass(frozen=True)
class JobRecord:
    """What was started where; enough to follow, stop and explain the job later."""

    id: str
    script: str
    args: list[str]
    hosts: list[str]
    code_dir: str  # on the nodes
    jobs_dir: str  # on the nodes: <work_dir>/jobs
    started_at: float
    nproc_per_node: dict[str, int]
    image: str | None = None
    container_runtime: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: str = ""  # on the nodes, kept across a recovery's attempts
    attempt: int = 1  # under launch --recover: which attempt of its run this is
    run: str = ""  # under launch --recover: the first attempt's id (names the run)
    env: dict[str, str] = field(default_factory=dict)  # the job's, secrets masked
    debug: bool = False  # started with launch --debug
    module: bool = False  # started with launch -m: script is a module name
    inventory: str = ""  # the inventory it was started with (absolute)
    # node -> where it was reached (address, :port unless 22): another cluster's inventory
    # beside this one shares .gpucluster/ and may reuse the node names.
    endpoints: dict[str, str] = field(default_factory=dict)

    def command(self) -> str:
        """What ran, as the user gave it: `train.py --lr 0.1` or `-m pkg.train ...`, each
        word quoted as a shell needs it (`'my run.py' 'a b'`), so that it can be pasted."""
        return shlex.join([*(["-m"] if self.module else []), self.script, *self.args])

    def started_with(self) -> str:
        """The fix for a node this inventory cannot ask about the job."""
        return (f"-i {self.inventory}, the inventory it was started with" if self.inventory
                else "the inventory the job was started with")

    def marker(self, node: str) -> str:
        """The environment value that tags every process of this job on `node`."""
        return f"{self.id}@{node}"

    def container_name(self) -> str:
        return f"gpucluster-{self.id}"

    def dir_on_node(self, node: str) -> str:
        """The job's dir on `node` (its log, exit code, kept stop...), a shell path."""
        return f"{self.jobs_dir}/{shlex.quote(self.id)}/{shlex.quote(node)}"

    def checkpoints_on_node(self) -> str:
        """The checkpoint dir on the nodes, a shell path: its run's (kept across a
        recovery's attempts), else its own (a record from before that field)."""
        return self.checkpoint_dir or f"{self.jobs_dir}/../checkpoints/{self.id}"


def new_job_id(now: float | None = None, taken: Iterable[str] = ()) -> str:
    """YYYYmmdd-HHMMSS-xxxx. The last part is random (two controllers' jobs started in
    one second differ on the nodes) and, where `taken` has ids of the same second, above
    theirs: ids sort by start, so "the newest" is the last started, not the larger draw."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    above = max((int(i[-4:], 16) for i in taken
                 if JOB_ID.fullmatch(i) and i.startswith(f"{stamp}-")), default=-1) + 1
    if above > 0xFFFF:  # a second's ids used up to ffff: unsortable, still unique-ish
        return f"{stamp}-{secrets.token_hex(2)}"
    # The second's first draw keeps the upper half free for the ones after it, each of
    # which moves up by at most 0x100: room for 128 more in that second, at the least.
    span = 0x8000 if above == 0 else min(0x100, 0x10000 - above)
    return f"{stamp}-{above + secrets.randbelow(span):04x}"


FAILURE_NOTE = "first-failure.txt"
SEEN_ENDED = "seen-ended"  # in a job's directory: its torchrun was seen ended everywhere


class JobStore:
    """Job directories under the state directory, newest id last (ids sort by time)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "jobs"

    def directory(self, job_id: str) -> Path:
        return self.root / job_id

    def new_id(self, now: float | None = None) -> str:
        """A new job's id, sorting after every job recorded here (see new_job_id)."""
        return new_job_id(now, self.ids())

    def save(self, record: JobRecord) -> Path:
        directory = self.directory(record.id)
        directory.mkdir(parents=True, exist_ok=True)
        temporary = directory / "job.json.tmp"
        temporary.write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")
        temporary.replace(directory / "job.json")
        return directory

    def note_failure(self, job_id: str, summary: str) -> None:
        """The job's first failure in a line, once a follow of it named one: `jobs`
        shows it without fetching a log."""
        path = self.directory(job_id) / FAILURE_NOTE
        if not path.parent.is_dir():  # pruned meanwhile: nothing to note it in
            return
        temporary = path.with_name(f"{FAILURE_NOTE}.tmp")
        temporary.write_text(summary + "\n", encoding="utf-8")
        temporary.replace(path)

    def note_seen_ended(self, job_id: str) -> None:
        """The job's torchrun was seen ended on every node: a job never runs again, so
        `jobs` need not ask its nodes whether it still does (a full disk: asked again)."""
        if self.directory(job_id).is_dir():  # pruned meanwhile: nothing to note it in
            with contextlib.suppress(OSError):
                (self.directory(job_id) / SEEN_ENDED).touch()

    def seen_ended(self, job_id: str) -> bool:
        return (self.directory(job_id) / SEEN_ENDED).exists()

    def noted_failure(self, job_id: str) -> str | None:
        try:
            return (self.directory(job_id) / FAILURE_NOTE).read_text(
                encoding="utf-8").strip() or None
        except OSError:
            return None

    def ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if JOB_ID.fullmatch(p.name) and (p / "job.json").is_file())

    def load(self, job_id: str | None) -> JobRecord:
        """A job by id, by a unique prefix or suffix of it, or the newest when None or
        `last` (no id holds it: their last part is hex)."""
        ids = self.ids()
        if not ids:
            raise GpuclusterError(f"no jobs recorded in {self.root} (fix: start one with "
                                  f"gpucluster launch, from beside the same inventory)")
        if job_id is not None and not job_id.strip():  # `stop "$JOB"`, the variable unset
            raise GpuclusterError(f"job {job_id!r}: no job named (fix: an id or a unique "
                                  f"part of it, or last; gpucluster jobs lists them)")
        if job_id is None or job_id == "last":
            chosen = ids[-1]
        else:
            matches = [i for i in ids if i == job_id] or [
                i for i in ids if i.startswith(job_id) or i.endswith(job_id)]
            if len(matches) != 1:
                named = ", ".join(matches[-3:]) + (", ..." if len(matches) > 3 else "")
                what = "matches no job" if not matches else (
                    f"is ambiguous ({len(matches)} jobs: {named})")
                slurm = f"; a Slurm job is slurm-{job_id}" if job_id.isdigit() else ""
                raise GpuclusterError(f"job {job_id!r} {what} (fix: gpucluster jobs lists "
                                      f"them{slurm})")
            chosen = matches[0]
        return self._read(chosen)

    def records(self, newest: int | None = None) -> list[JobRecord]:
        """Every job's record (or the `newest` ones), oldest first: the directory is
        listed once (a `load` per id listed it per job: 5.8 s for 600 jobs)."""
        ids = self.ids()
        return [self._read(job_id) for job_id in (ids[-newest:] if newest else ids)]

    def _read(self, chosen: str) -> JobRecord:
        path = self.directory(chosen) / "job.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            # Fields a newer gpucluster added are left out: a record stays readable.
            known = {f.name for f in fields(JobRecord)}
            record = JobRecord(**{k: v for k, v in data.items() if k in known})
        except (OSError, ValueError, TypeError, AttributeError) as error:
            raise GpuclusterError(f"{path}: not a readable job record ({error}) (fix: "
                                  f"remove that job's directory)") from None
        # The id goes into node scripts and paths: only the directory's own name will do.
        if record.id != chosen:
            raise GpuclusterError(f"{path}: its id {record.id!r} is not its directory's name "
                                  f"(fix: remove that job's directory)")
        return record

    def node_log(self, job_id: str, node: str) -> Path:
        return self.directory(job_id) / f"{node}.log"
