"""launch --debug, logs search and bundle on a 3-node sandbox of their own: the debug
variables read from the ranks' /proc, the logs merged and filtered, and a bundle of a
job that failed on node2 while node3 cannot be reached, with a planted secret that must
appear nowhere in it."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import gpucluster
from tests.sandbox import Sandbox, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET = "gpcdiag", "198.19.10.0/24"
SECRET = "hf_planted_0123456789abcdef"
FAILS_ON_NODE2 = """\
import os, socket, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} up; HF_TOKEN={os.environ.get('HF_TOKEN')}", flush=True)
for step in range(1000):
    t = torch.ones(1)
    dist.all_reduce(t)
    if step == 20:  # node2 fails alone: the others wait outside any collective
        if socket.gethostname() == "node2":
            raise RuntimeError("staged failure on node2")
        time.sleep(600)
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = start_sandbox(tmp_path_factory.mktemp("diag") / "cluster.yaml", NAME, SUBNET,
                            3, provision="hosts")
    try:
        yield sandbox
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def _ranks(node: str) -> list[int]:
    pids = subprocess.run(["ip", "netns", "pids", f"{NAME}-{node}"], capture_output=True,
                          text=True, check=True).stdout.split()
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if any(e.startswith(b"LOCAL_RANK=") for e in environ):
                found.append(int(pid))
    return found


def events_of(cluster: Sandbox, job: str, rank: int) -> list[dict]:
    lines = gpucluster("logs", "-i", str(cluster.inventory), job, "--rank", str(rank),
                       "--json")
    return [json.loads(line) for line in lines.stdout.splitlines()]


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def test_launch_debug_sets_the_variables_on_every_rank(cluster: Sandbox,
                                                       project: Path) -> None:
    started = gpucluster("launch", "-i", str(cluster.inventory), "-d", "--debug",
                         "--nproc-per-node", "2", "--secret-env", "HF_TOKEN",
                         "--env", "OMP_NUM_THREADS=3", "train.py",
                         "--", "--epochs", "100000", cwd=str(project),
                         env={"HF_TOKEN": SECRET}, timeout=180)
    assert started.code == 0, started.stderr
    job = started.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 120
        while "epoch 1 loss" not in gpucluster("logs", "-i", str(cluster.inventory),
                                               job).stdout:
            assert time.monotonic() < deadline
            time.sleep(2)
        for node in cluster.nodes:
            ranks = _ranks(node)
            assert len(ranks) == 2
            for pid in ranks:
                env = _environ(pid)
                job_dir = f"/srv/gpucluster/jobs/{job}/{node}"
                assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
                assert env["NCCL_DEBUG_FILE"] == f"{job_dir}/nccl/%h.%p.log"
                assert env["TORCH_DISTRIBUTED_DEBUG"] == "INFO"  # CPU nodes: see docs
                assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
                assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
                assert env["OMP_NUM_THREADS"] == "3"  # the job's, not the default of 1
                assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{job_dir}/flight-recorder/rank_"
                # The nodes' torch (2.13) knows the TORCH_FR_* names, and warns about the
                # old ones when they are set: they are not.
                assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
                assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env
                assert env["HF_TOKEN"] == SECRET  # passed, never written down:
        record = json.loads((cluster.inventory.parent / ".gpucluster" / "jobs" / job /
                             "job.json").read_text())
        assert record["env"]["HF_TOKEN"] == "***" and record["debug"] is True
        dirs = gpucluster("run", "-i", str(cluster.inventory),
                          f"ls -d /srv/gpucluster/jobs/{job}/$(hostname)/nccl "
                          f"/srv/gpucluster/jobs/{job}/$(hostname)/flight-recorder")
        assert dirs.code == 0, dirs.stdout + dirs.stderr
        full = gpucluster("logs", "-i", str(cluster.inventory), job)
        assert "rank 0/6" in full.stdout and "is deprecated" not in full.stdout, full.stdout

        # The logs, searched: merged in time order, one rank, ECS JSON.
        lines = gpucluster("logs", "-i", str(cluster.inventory), job, "--rank", "3",
                           "--json")
        assert lines.code == 0, lines.stderr
        events = [json.loads(line) for line in lines.stdout.splitlines()]
        assert events and {(e["rank"], e["job.id"]) for e in events} == {(3, job)}
        assert len({e["host.name"] for e in events}) == 1
        stamps = [e["@timestamp"] for e in events]
        assert stamps == sorted(stamps)
        ready = gpucluster("logs", "-i", str(cluster.inventory), job, "--grep",
                           r"rank \d/6 on node\d ready")
        found = re.findall(r"^\d\d:\d\d:\d\d\.\d{3} \[(node\d)/(\d)\] rank (\d)/6",
                           ready.stdout, re.M)
        assert sorted(int(r) for _, r, _ in found) == list(range(6)), ready.stdout
        assert all(r == again for _, r, again in found)
        # A search that finds nothing says so (it was silent), and names where the ranks
        # asked for ran when -w picked another node
        home = events[0]["host.name"]
        other = next(n for n in cluster.nodes if n != home)
        elsewhere = gpucluster("logs", "-i", str(cluster.inventory), job, "--rank", "3",
                               "-w", other)
        assert elsewhere.code == 0 and elsewhere.stdout == "", elsewhere.stdout
        assert f"no line of job {job} matches: rank 3 ran on {home} (fix: -w {home}, or " \
               f"no -w)" in elsewhere.stderr, elsewhere.stderr
        nothing = gpucluster("logs", "-i", str(cluster.inventory), job, "--grep", "no-such")
        assert nothing.stdout == "" and f"no line of job {job} matches" in nothing.stderr
        # --tail: the last lines across the nodes in time order, as plain `logs` shows
        # lines, or of a search's; the job is stopped first, so that no line comes between.
        assert gpucluster("stop", "-i", str(cluster.inventory), job).code == 0
        everything = gpucluster("logs", "-i", str(cluster.inventory), job, "--since", "1h")
        timed = everything.stdout.splitlines()
        last = gpucluster("logs", "-i", str(cluster.inventory), job, "-n", "4")
        assert last.code == 0 and last.stdout.splitlines() == \
            [line.split(" ", 1)[1] for line in timed[-4:]], (last.stdout, timed[-6:])
        searched = gpucluster("logs", "-i", str(cluster.inventory), job, "--rank", "3",
                              "--tail", "2", "--json")
        assert [json.loads(e) for e in searched.stdout.splitlines()] == events_of(
            cluster, job, rank=3)[-2:]
        nothing = gpucluster("logs", "-i", str(cluster.inventory), job, "-n", "0")
        assert nothing.code == 0 and nothing.stdout == "", nothing.stdout
        # Each line's stamp came with the log, in the same session: the copy has them.
        for node in cluster.nodes:
            copy = cluster.inventory.parent / ".gpucluster" / "jobs" / job / f"{node}.log"
            lines = copy.read_text().splitlines()
            stamps = [float(s) for s in Path(f"{copy}.times").read_text().split()]
            assert len(lines) // 2 <= len(stamps) <= len(lines) and stamps == sorted(stamps)
            assert record["started_at"] - 5 < stamps[0] <= stamps[-1] < time.time() + 5
    finally:
        gpucluster("stop", "-i", str(cluster.inventory), job)


def test_bundle_of_a_failed_job_with_a_node_unreachable(cluster: Sandbox, project: Path,
                                                        tmp_path: Path) -> None:
    (project / "fails.py").write_text(FAILS_ON_NODE2)
    failed = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "2",
                        "--secret-env", "HF_TOKEN", "--env", "WANDB_API_KEY=" + SECRET,
                        "fails.py", cwd=str(project), env={"HF_TOKEN": SECRET},
                        timeout=240)
    assert failed.code != 0
    job = re.search(r"job (\d{8}-\d{6}-[0-9a-f]{4})", failed.stderr)[1]  # type: ignore[index]
    namespace = f"{NAME}-node3"
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-I", chain, "-j",
                        "DROP"], check=True)
    try:
        archive = tmp_path / "report.tar.gz"
        started = time.monotonic()
        done = gpucluster("bundle", "-i", str(cluster.inventory), job, "-o", str(archive),
                          "--connect-timeout", "3", timeout=300)
        took = time.monotonic() - started
    finally:
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-D", chain, "-j",
                            "DROP"], check=False)
    assert done.code == 1, done.stderr  # partial: node3
    assert took < 120, took  # nothing waits on the dead node past its limits
    with tarfile.open(archive) as bundle:
        members = {m.name.split("/", 1)[1]: bundle.extractfile(m).read()  # type: ignore[union-attr]
                   for m in bundle.getmembers() if m.isfile()}
    for node in ("node1", "node2"):
        for name in ("doctor.json", "nvidia-smi-q.txt", "network.txt", "system.txt",
                     "kernel-gpu.txt", "job/node.log"):
            assert f"nodes/{node}/{name}" in members, sorted(members)
        assert b"Attached GPUs" in members[f"nodes/{node}/nvidia-smi-q.txt"]
    assert "nodes/node3/UNREACHABLE.txt" in members
    assert not any(name.startswith("nodes/node3/job/") for name in members)
    summary = members["SUMMARY.md"].decode()
    assert re.search(r"\*\*First failure: node2, rank [23]\*\*", summary), summary
    assert re.search(r"- \*\*node3\*\*: ", summary), summary
    assert "staged failure on node2" in summary
    assert json.loads(members["job/job.json"])["env"]["WANDB_API_KEY"] == "***"
    # The planted secret, printed by every rank and given as --secret-env and as a
    # secret-looking --env: nowhere in the archive, compressed or not.
    assert all(SECRET.encode() not in data for data in members.values())
    assert b"HF_TOKEN=***" in members["nodes/node1/job/node.log"]
    assert SECRET.encode() not in archive.read_bytes()
    assert archive.stat().st_mode & 0o077 == 0  # logs inside: the user's only
