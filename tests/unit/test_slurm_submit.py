"""`export sbatch --submit` and `--follow` on a local host with stand-in sbatch and
scontrol on PATH: the script arrives on sbatch's stdin in the work dir, the job ID
comes back, the output streams whole through a busy slurmctld, and each way it can go
wrong is one line with the fix. And `--container`, as launch has it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import load
from gpucluster.remote.result import CommandResult
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions
from gpucluster.slurm.submit import refusal, submit
from tests.cli import gpucluster


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Keeps what it was given and where, and answers as sbatch --parsable does.
    fake = bin_dir / "sbatch"
    fake.write_text(f"#!/bin/sh\npwd > {tmp_path}/where; cat > {tmp_path}/script\n"
                    f'[ -e {tmp_path}/refuse ] && {{ echo "sbatch: error: Batch job '
                    f'submission failed: Invalid partition name specified" >&2; exit 1; }}\n'
                    f"echo '42;cluster'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n")
    return Session(load(inventory), SshOptions(tmp_path / "known_hosts"))


def test_the_script_goes_to_sbatch_in_the_work_dir_and_the_job_id_comes_back(
        session: Session, tmp_path: Path) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    job = submit(session, session.inventory, "#!/bin/bash\necho hi\n", f"'{work}'", "~/w")
    assert (job.job_id, job.host) == ("42", "a")
    assert job.output == "~/w/slurm-42.out"
    assert (tmp_path / "where").read_text().strip() == str(work)
    assert (tmp_path / "script").read_text() == "#!/bin/bash\necho hi\n"


def test_a_missing_work_dir_or_a_refusal_is_one_line_with_the_fix(
        session: Session, tmp_path: Path) -> None:
    with pytest.raises(GpuclusterError, match=r"^a: no ~/nowhere there, so nothing was "
                                              r"submitted \(fix: drop --no-sync"):
        submit(session, session.inventory, "x", "'/nowhere'", "~/nowhere")
    (tmp_path / "refuse").touch()
    with pytest.raises(GpuclusterError, match=r"^a: sbatch refused the job: sbatch: error: "
                                              r"Batch job submission failed: Invalid "
                                              r"partition name specified$"):
        submit(session, session.inventory, "x", f"'{tmp_path}'", str(tmp_path))


def test_a_slurm_that_is_not_running_gets_the_fix() -> None:
    said = refusal(CommandResult(
        "a", "sbatch", 1, "", "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error\n"
        "sbatch: fatal: Could not establish a configuration source\n", 0.1))
    assert said == ("sbatch: fatal: Could not establish a configuration source (fix: is "
                    "Slurm set up and running? gpucluster provision --with slurm)")


def test_export_takes_the_inventory_image_with_container_as_launch_does(
        tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n")
    bare = gpucluster("export", "sbatch", "-i", str(inventory), "--no-sync", "--container",
                      "train.py", cwd=str(tmp_path))
    assert bare.code == 2 and bare.stderr.strip() == (
        f"gpucluster: error: {inventory}: --container needs cluster.image in the inventory "
        f"(fix: set it, or give --image NAME)")
    inventory.write_text("cluster: {image: 'localhost/train:1'}\n"
                         "hosts:\n  - {name: a, address: 10.0.0.1}\n")
    imaged = gpucluster("export", "sbatch", "-i", str(inventory), "--no-sync", "--container",
                        "train.py", cwd=str(tmp_path))
    assert imaged.code == 0, imaged.stderr
    assert " localhost/train:1 torchrun " in imaged.stdout


def test_scontrols_one_line_job_record_is_read_by_key() -> None:
    from gpucluster.slurm.follow import parse_job

    line = ("JobId=9 JobName=wrap UserId=gcuser(2000) JobState=FAILED Reason=NonZeroExitCode "
            "ExitCode=3:0 BatchHost=node1 WorkDir=/home/gcuser StdOut=/home/gcuser/w-9.log")
    assert parse_job(line) == parse_job(line + "\n")
    job = parse_job(line)
    assert (job.state, job.batch_host, job.stdout, job.exit_code) == (
        "FAILED", "node1", "/home/gcuser/w-9.log", "3:0")
    assert parse_job("slurm_load_jobs error: Invalid job id specified").state == ""


def test_follow_streams_the_output_whole_and_outlasts_a_busy_slurmctld(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in scontrol fails twice (slurmctld restarting), then says RUNNING twice
    while the job writes, then COMPLETED. Chunks of 3 bytes split the é."""
    from gpucluster.slurm import follow as following

    monkeypatch.setattr(following, "POLL_S", 0.01)
    monkeypatch.setattr(following, "CHUNK_BYTES", 3)
    out = tmp_path / "slurm-7.out"
    calls = tmp_path / "calls"
    record = f"JobId=7 BatchHost=a StdOut={out} ExitCode=0:0 NodeList=a Reason=None"
    (tmp_path / "bin" / "scontrol").write_text(
        f"#!/bin/sh\necho x >> {calls}; n=$(wc -l < {calls})\n"
        f"case $n in\n"
        f"  1|2) echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1;;\n"
        f"  3) printf 'step 1 h\\303\\251\\n' > {out}; echo '{record} JobState=RUNNING';;\n"
        f"  4) echo 'step 2' >> {out}; echo '{record} JobState=RUNNING';;\n"
        f"  *) echo 'done' >> {out}; echo '{record} JobState=COMPLETED';;\n"
        f"esac\n")
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    shown: list[str] = []
    statuses: list[str] = []
    ended = following.follow(session, session.inventory, "7", shown.append, statuses.append)
    assert ended.state == "COMPLETED" and ended.exit_code == "0:0"
    assert statuses == ["running on a"]  # said once, not at every poll
    assert "".join(shown) == "step 1 hé\nstep 2\ndone\n"


def test_follow_gives_up_on_a_slurmctld_that_never_answers_and_says_the_job_goes_on(
        session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.slurm import follow as following

    monkeypatch.setattr(following, "POLL_S", 0.01)
    monkeypatch.setattr(following, "UNANSWERED_LIMIT_S", 0.05)
    (tmp_path / "bin" / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\n"
        "exit 1\n")
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    with pytest.raises(GpuclusterError, match=r"^a: scontrol has not answered for 0.05 s: "
                                              r".*Unable to contact slurm controller \(is "
                                              r"slurmctld running\? the job may go on"):
        following.follow(session, session.inventory, "7", lambda text: None)


def test_a_waiting_job_says_why() -> None:
    from gpucluster.slurm.follow import parse_job

    pending = parse_job("JobId=8 JobState=PENDING Reason=Resources NodeList=(null)")
    assert pending.status == "pending (Resources)"
    assert parse_job("JobId=8 JobState=RUNNING Reason=None NodeList=n[1-2]").status == \
        "running on n[1-2]"
    # Requeued (a node failed): Slurm holds it back, then starts it again.
    assert parse_job("JobId=8 JobState=PENDING Reason=BeginTime Restarts=1 NodeList=(null)"
                     ).status == "pending (BeginTime), start 2 after a requeue"


def test_more_nodes_than_the_cluster_has_is_refused_before_anything(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: 'n[1-2]', address: '10.0.0.[1-2]'}\n")
    refused = gpucluster("export", "sbatch", "-i", str(inventory), "-N", "3", "--submit",
                         "train.py", cwd=str(tmp_path))
    assert refused.code == 2 and refused.stderr.strip() == (
        "gpucluster: error: -N 3: the cluster has 2 nodes, so Slurm could never run the "
        "job (fix: -N 2 or fewer)")


def test_export_syncs_every_node_from_one_tar_and_names_the_nodes_it_could_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes sharing one work dir (both local here): each is planned from its own
    listing, and the nodes that lack the same files get one tar, made once."""
    from gpucluster.launch import workdir
    from gpucluster.slurm.export import export_sbatch

    project, work = tmp_path / "proj", tmp_path / "work"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    inventory = tmp_path / "c.yaml"
    inventory.write_text(f"cluster: {{work_dir: '{work}'}}\n"
                         "hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n"
                         "  - {name: b, address: 127.0.0.2, connection: local}\n")
    session = Session(load(inventory), SshOptions(tmp_path / "known_hosts"))
    made: list[str] = []
    write_tar = workdir.write_tar
    monkeypatch.setattr(workdir, "write_tar", lambda target, *rest: (
        made.append("tar"), write_tar(target, *rest))[1])
    script, note = export_sbatch(session, session.inventory, project, "train.py", [], True)
    assert made == ["tar"] and note.startswith("synced: 1 sent"), note
    assert (work / "proj/train.py").read_text() == "print(1)\n"
    assert "proj" in script
    (project / "train.py").write_text("print(2)\n")
    shutil.rmtree(work / "proj")
    (work / "proj").write_text("a file where the code dir goes")
    with pytest.raises(GpuclusterError, match=r"^the work dir could not be synced to "
                                              r"a,b \(.*\); no script written$"):
        export_sbatch(session, session.inventory, project, "train.py", [], True)
