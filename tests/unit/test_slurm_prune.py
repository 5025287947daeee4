"""prune, for the files Slurm jobs from export sbatch leave on the nodes: on a local
host with a stand-in squeue, the old ended jobs' dirs are sized and removed, a job Slurm
still has or a young one is kept, and nothing goes when squeue cannot say."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpucluster import slurm_states
from gpucluster.inventory import load
from gpucluster.launch.prune import once_per_directory
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions
from gpucluster.slurm import prune

DAY = 86400


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A work dir holding the files of Slurm jobs 3 (ended 8 days ago, with a checkpoint),
    4 (written an hour ago), 5 (old, but Slurm still has it) and a stray slurm-x."""
    work = tmp_path / "work dir"
    old = time.time() - 8 * DAY
    for relative, data in (("jobs/slurm-3/rank0.txt", b"x" * 5000),
                           ("checkpoints/slurm-3/ckpt.pt", b"w" * 300_000),
                           ("jobs/slurm-4/rank0.txt", b"y"), ("jobs/slurm-5/rank0.txt", b"z"),
                           ("jobs/slurm-x/keep.txt", b"k")):
        path = work / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if "slurm-4" not in relative:
            for each in (path, path.parent):
                os.utime(each, (old, old))
    recent = time.time() - 3600
    os.utime(work / "jobs/slurm-4", (recent, recent))
    (tmp_path / "bin").mkdir()
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text("#!/bin/sh\n[ -e \"$0.down\" ] && { echo 'slurm_load_jobs error: "
                      "Unable to contact slurm controller' >&2; exit 1; }\n"
                      "echo '5|train|u|RUNNING|8-00:00:00|1|a'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_states, "SET_UP_HERE", "true")
    return work


def session_for(work: Path) -> Session:
    inventory = work.parent / "c.yaml"
    inventory.write_text(f"cluster: {{work_dir: '{work}'}}\n"
                         "hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n")
    return Session(load(inventory), SshOptions(work.parent / "known_hosts"))


def test_old_ended_jobs_are_listed_then_removed_and_the_others_kept(work: Path) -> None:
    session = session_for(work)
    listed = prune.prune(session, session.inventory, 7 * DAY, checkpoints=False, remove=False)
    assert [j.job_id for j in listed.jobs] == ["3"]  # 4 too young, 5 still Slurm's
    assert listed.skipped == [("5", "Slurm still has it (running)")]
    three = listed.jobs[0]
    assert three.nodes["a"].job_bytes is not None and three.nodes["a"].job_bytes >= 5000
    assert three.checkpoint_bytes >= 300_000 and three.node_bytes == three.job_bytes
    assert (work / "jobs/slurm-3").exists()  # only listed
    kept_here = work.parent / ".gpucluster/jobs"  # `stacks slurm-ID`'s looks
    for job in ("slurm-3", "slurm-5"):
        (kept_here / job).mkdir(parents=True)
        (kept_here / job / "stacks-20261207-130000.txt").write_text("== rank 0 ==\n")
    removed = prune.prune(session, session.inventory, 7 * DAY, checkpoints=False,
                          remove=True)
    assert removed.jobs[0].removed and not (work / "jobs/slurm-3").exists()
    assert not (kept_here / "slurm-3").exists() and (kept_here / "slurm-5").exists()
    assert (work / "checkpoints/slurm-3/ckpt.pt").exists()  # kept without --checkpoints
    assert (work / "jobs/slurm-4").exists() and (work / "jobs/slurm-5").exists()
    assert (work / "jobs/slurm-x/keep.txt").exists()  # not a Slurm job's name
    again = prune.prune(session, session.inventory, 7 * DAY, checkpoints=True, remove=True)
    assert [j.job_id for j in again.jobs] == ["3"] and again.jobs[0].removed
    assert not (work / "checkpoints/slurm-3").exists()


def test_nothing_goes_when_squeue_cannot_say_which_jobs_slurm_has(
        work: Path, tmp_path: Path) -> None:
    (tmp_path / "bin" / "squeue.down").touch()
    session = session_for(work)
    report = prune.prune(session, session.inventory, 7 * DAY, checkpoints=True, remove=True)
    assert report.jobs == [] and [job for job, _ in report.skipped] == ["3", "5"]
    assert "Slurm's queue could not be read: a: squeue failed" in report.skipped[0][1]
    assert (work / "jobs/slurm-3").exists() and (work / "checkpoints/slurm-3").exists()


def test_a_work_dir_every_node_sees_is_sized_once(work: Path) -> None:
    """Two nodes sharing one home (both local here): each lists the job's dirs, and the
    bytes are those of one copy."""
    inventory = work.parent / "c.yaml"
    inventory.write_text(f"cluster: {{work_dir: '{work}'}}\n"
                         "hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n"
                         "  - {name: b, address: 127.0.0.2, connection: local}\n")
    shared = Session(load(inventory), SshOptions(work.parent / "known_hosts"))
    single = session_for(work)
    one = prune.prune(single, single.inventory, 7 * DAY, checkpoints=True, remove=False)
    both = prune.prune(shared, shared.inventory, 7 * DAY, checkpoints=True, remove=False)
    assert sorted(both.jobs[0].nodes) == ["a", "b"]
    assert (both.jobs[0].job_bytes, both.jobs[0].checkpoint_bytes) == (
        one.jobs[0].job_bytes, one.jobs[0].checkpoint_bytes)
    assert once_per_directory([("", 5), ("", 7), ("9/1.5", 3), ("9/1.5", 3)]) == 15


def test_a_checkpoint_dir_without_a_file_counts_nothing(work: Path) -> None:
    old = time.time() - 8 * DAY
    for relative in ("jobs/slurm-7", "checkpoints/slurm-7/epoch-dirs-only"):
        (work / relative).mkdir(parents=True)
    (work / "jobs/slurm-7/rank0.txt").write_bytes(b"r")
    for path in (work / "jobs/slurm-7/rank0.txt", work / "jobs/slurm-7",
                 work / "checkpoints/slurm-7/epoch-dirs-only", work / "checkpoints/slurm-7"):
        os.utime(path, (old, old))
    session = session_for(work)
    listed = prune.prune(session, session.inventory, 7 * DAY, checkpoints=False, remove=False)
    seven = next(j for j in listed.jobs if j.job_id == "7")
    assert seven.checkpoint_bytes == 0 and seven.job_bytes > 0  # not the dirs' own blocks
