"""launch, jobs, logs and stop on a 3-node sandbox of their own: real torchrun with
gloo, 3 nodes x 2 processes; a node's workers killed mid-run; Ctrl-C; detach, follow,
stop; refusal; and a sync that sends only what changed. "Nothing left" is checked
from outside SSH, with `ip netns pids`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from gpucluster import hostrange
from tests.cli import gpucluster, read_to_end
from tests.sandbox import TRAIN, Sandbox, busybox_image, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET = "gpclnch", "198.19.3.0/24"
SLOW = ("--epochs", "200", "--step-delay", "0.05")  # long enough to interrupt
FIRST_RUN = "/srv/gpucluster/first-run"  # checkpoints kept from one launch to the next


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    # torchrun resolves node names (the /etc/hosts block); the image relay needs the mesh
    sandbox = start_sandbox(tmp_path_factory.mktemp("launch") / "cluster.yaml", NAME, SUBNET,
                            3, provision="hosts,ssh-mesh")
    try:
        yield sandbox
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def node_processes(sandbox: Sandbox, wanted: Callable[[bytes, bytes], bool]
                   ) -> dict[str, list[str]]:
    """Processes in each node's namespaces for which `wanted(environ, cmdline)`, seen from
    outside SSH."""
    found: dict[str, list[str]] = {}
    for node in sandbox.nodes:
        pids = subprocess.run(["ip", "netns", "pids", f"{NAME}-{node}"], capture_output=True,
                              text=True, check=True).stdout.split()
        for pid in pids:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue  # gone meanwhile
            if wanted(environ, cmdline):
                found.setdefault(node, []).append(f"{pid} {cmdline.decode()[:80]}")
    return found


def job_processes(sandbox: Sandbox) -> dict[str, list[str]]:
    """Processes that belong to a job: the job marker in their environment, or a
    torchrun/train.py command line."""
    return node_processes(sandbox, lambda environ, cmdline: b"GPUCLUSTER_JOB=" in environ
                          or re.search(rb"torchrun|train\.py", cmdline) is not None)


def start_attached(cluster: Sandbox, project: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "launch", "-i", str(cluster.inventory),
         "--nproc-per-node", "2", "--grace", "5", *args],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_ranks(process: subprocess.Popen[str], count: int, limit: float = 90) -> list[str]:
    """Read the job's output until `count` ranks said they are ready."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit
    while sum("ready" in line for line in lines) < count:
        assert time.monotonic() < deadline, "ranks did not get ready:\n" + "".join(lines)
        line = process.stdout.readline()
        assert line, "the launcher ended early:\n" + "".join(lines) + process.stderr.read()
        lines.append(line)
    return lines


def kill_workers(node: str, agent: bool = False) -> list[str]:
    """SIGKILL the node's train.py workers (not their torchrun), or with `agent` its
    torchrun (not its workers nor the wrapper that runs it); their pids."""
    killed = []
    for pid in subprocess.run(["ip", "netns", "pids", f"{NAME}-{node}"], capture_output=True,
                              text=True, check=True).stdout.split():
        try:  # short-lived processes (the follower's, a login's) come and go meanwhile
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            is_agent = len(argv) > 1 and argv[1].endswith(b"/torchrun")
            is_worker = (any(b"train.py" in word for word in argv)  # not torchrun's wrapper
                         and not any(b"torchrun" in word for word in argv))
            if is_agent if agent else is_worker:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return killed


def finish(process: subprocess.Popen[str], limit: float) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = read_to_end(process, limit)
    return done.code, done.stdout, done.stderr, time.monotonic() - started


def test_ranks_meet_at_cluster_addresses_even_where_names_do_not_resolve(
        cluster: Sandbox, project: Path) -> None:
    """torchrun's rank-0 agent gave the workers its hostname for their store: where the
    others could not resolve it (no /etc/hosts entry yet), every rank hung for good.
    Each node's torchrun now gets its cluster address (--local_addr)."""
    for node in ("node2", "node3"):
        cluster.node_exec(node, "cp -p /etc/hosts /etc/hosts.gpc-test && "
                                "grep -v -w node1 /etc/hosts.gpc-test > /etc/hosts")
    try:
        assert cluster.node_exec("node2", "getent hosts node1", check=False).returncode != 0
        done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "1",
                          "train.py", "--", "--epochs", "1", cwd=str(project), timeout=120)
    finally:
        for node in ("node2", "node3"):
            cluster.node_exec(node, "cat /etc/hosts.gpc-test > /etc/hosts && "
                                    "rm /etc/hosts.gpc-test")
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[node1/0] done" in done.stdout


def test_a_process_the_script_left_behind_is_ended_and_the_job_succeeds(
        cluster: Sandbox, project: Path) -> None:
    """A script that starts a background process and exits 0 left it running (holding
    whatever it held), and launch exited 1 with nothing said but its state."""
    (project / "leaves.py").write_text(
        "import os, subprocess, sys\n"
        "if os.environ.get('RANK') == '0':\n"
        "    subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print('left one', flush=True)\n")
    done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "1",
                      "leaves.py", cwd=str(project), timeout=120)
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"node\d: torchrun exited 0 leaving processes of the job there: "
                     r"ending them", done.stderr), done.stderr
    assert re.search(r"stopped: nothing of it is left on node\[1-3\] \(1 process",
                     done.stderr), done.stderr
    assert job_processes(cluster) == {}


def test_a_cpu_build_of_torch_where_jobs_use_the_gpus_is_refused_before_any_start(
        cluster: Sandbox, project: Path) -> None:
    """The nodes' torch is a CPU build; an inventory whose jobs run on the GPUs started
    every rank, each dying at its first CUDA call. The check reads torch's version.py."""
    defaults = {**cluster.data["defaults"], "torch_device": "cuda"}
    inventory = cluster.write_inventory(project.parent / "cpu-torch.yaml", defaults=defaults)
    refused = gpucluster("launch", "-i", str(inventory), "--nproc-per-node", "1", "train.py",
                         cwd=str(project), timeout=120)
    assert refused.code == 1, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert re.search(r"FAIL torch-build node\[1-3\]: torch \S+\+cpu is a CPU-only build on "
                     r"an NVIDIA GPU node: a job's ranks would find no GPU", message), message
    assert "-m pip install torch --index-url https://download.pytorch.org/whl/cu" in message
    assert "launch refused: node[1-3] not ready for a new job; nothing was started" in message
    assert job_processes(cluster) == {}


def cuda_torch_python(where: Path, nodes_python: str) -> Path:
    """A python in whose path torch reads as a CUDA build to launch's checks (a version.py
    saying so, before the nodes' CPU build): for launches refused later, never started."""
    (where / "site" / "torch").mkdir(parents=True, exist_ok=True)
    (where / "site" / "torch" / "__init__.py").write_text("")
    (where / "site" / "torch" / "version.py").write_text(
        "__version__ = '2.5.1+cu124'\ncuda: Optional[str] = '12.4'\n")
    python = where / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={where / 'site'} exec {nodes_python} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_gpus_in_mig_mode_take_one_process_a_node_not_one_per_gpu(
        cluster: Sandbox, project: Path) -> None:
    """The nodes' GPUs replaying the real H100 MIG capture, under an inventory whose jobs
    run on the GPUs: CUDA would give each process one MIG device, so launch and smoke
    refuse a process per GPU before anything starts, and say how to go on."""
    states = [Path(f"/var/lib/gpucluster/sandbox/{NAME}/{node}/gpu.json")
              for node in cluster.nodes]
    kept = [state.read_text() for state in states]
    defaults = {**cluster.data["defaults"], "torch_device": "cuda"}
    python = cuda_torch_python(project.parent / "cuda-torch", cluster.data["cluster"]["python"])
    inventory = cluster.write_inventory(project.parent / "on-gpus.yaml", defaults=defaults,
                                        cluster={**cluster.data["cluster"],
                                                 "python": str(python)})
    try:
        for state in states:
            state.write_text(json.dumps({**json.loads(state.read_text()),
                                         "model": "h100-mig"}))
        for argv in (["launch", "train.py"], ["launch", "--nproc-per-node", "2", "train.py"],
                     ["smoke"]):
            refused = gpucluster(argv[0], "-i", str(inventory), *argv[1:],
                                 cwd=str(project), timeout=120)
            assert refused.code == 2, refused.stdout + refused.stderr
            message = " ".join(refused.stderr.split())
            processes = 2 if "2" in argv else 8
            assert (f"node[1-3]: 8 GPUs in MIG mode, where CUDA gives a process one MIG "
                    f"device: of {processes} processes a node, {processes - 1} would find "
                    f"no GPU (fix: to train on whole GPUs, turn MIG off there: sudo "
                    f"nvidia-smi -mig 0") in message, message
            assert "or --nproc-per-node 1, one process a node on one MIG device)" in message
            assert job_processes(cluster) == {}
    finally:
        for state, text in zip(states, kept, strict=True):
            state.write_text(text)


def _placed(inventory: str, job: str, ranks: int) -> dict[tuple[str, int], int]:
    """(node, local rank) -> the GPU nvidia-smi shows it on, as top reads it, once `ranks`
    ranks of `job` are there (60 s at most)."""
    deadline, placed = time.monotonic() + 60, {}
    while len(placed) < ranks and time.monotonic() < deadline:
        frame = gpucluster("top", "-i", inventory, "--once", "--json").json()
        placed = {(node["host"], p["local_rank"]): gpu["index"] for node in frame["nodes"]
                  for gpu in node["gpus"] for p in gpu["processes"] if p["job"] == job}
    return placed


def test_gpus_leaves_a_held_gpu_out_and_jobs_run_side_by_side_on_their_own(
        cluster: Sandbox, project: Path) -> None:
    """Someone else's process on node1's GPU 0 refuses a job on every GPU, and the fix
    names the GPUs free there; with --gpus 2-3 the job starts, and nvidia-smi (through
    top) shows each node's ranks on GPU 2 and 3. With cluster.rendezvous_ports a second
    job on GPU 4-5 starts beside it, on port 29504, and stopping it leaves the first."""
    inventory = str(cluster.write_inventory(
        project.parent / "side-by-side.yaml",
        cluster={**cluster.data["cluster"], "rendezvous_ports": 8}))
    holder = subprocess.Popen(cluster.node_argv("node1", ["sleep", "301"]))
    time.sleep(0.2)
    apps = Path(f"/var/lib/gpucluster/sandbox/{NAME}/node1/gpu.apps")
    apps.write_text(f"{holder.pid} 0 30720 python serve.py\n")
    jobs: list[str] = []
    try:
        refused = gpucluster("launch", "-i", inventory, "--nproc-per-node", "2", "train.py",
                             cwd=str(project), timeout=120)
        said = " ".join(refused.stderr.split())
        assert refused.code == 1, said
        assert f"node1: GPUs held by: pid {holder.pid} python serve.py (30720 MiB)" in said
        assert "or start it on the GPUs free here: launch --gpus 1-7" in said
        # doctor --gpus judges the GPUs as launch --gpus would.
        for args, status in (((), "FAIL"), (("--gpus", "2-3"), "OK")):
            found = gpucluster("doctor", "-i", inventory, "--only", "gpu-processes", "--json",
                               *args).json()["results"]
            assert {r["host"]: r["status"] for r in found}["node1"] == status, found
        for first in (2, 4):
            started = gpucluster("launch", "-i", inventory, "-d", "--gpus",
                                 f"{first}-{first + 1}", "--nproc-per-node", "2", "train.py",
                                 "--", *SLOW, cwd=str(project), timeout=120)
            assert started.code == 0, started.stderr
            jobs.append(started.stdout.strip())
            placed = _placed(inventory, jobs[-1], 6)
            assert placed == {(node, local): first + local for node in cluster.nodes
                              for local in (0, 1)}, placed
        listed = gpucluster("jobs", "-i", inventory).stdout
        for job, gpus in zip(jobs, ("2,3", "4,5"), strict=True):
            assert re.search(rf"{job}.*running: node\[1-3\] on GPU {gpus}", listed), listed
        as_json = {j["id"]: j["gpus"] for j in gpucluster("jobs", "-i", inventory,
                                                          "--json").json()["jobs"]}
        assert [as_json[job] for job in jobs] == ["2,3", "4,5"]
        listening = cluster.node_exec("node1", "ss -Hltn 'sport = :29502 or sport = :29504'")
        assert len(listening.stdout.splitlines()) == 2, listening.stdout
        stopped = gpucluster("stop", "-i", inventory, jobs[1], timeout=60)
        assert stopped.code == 0, stopped.stderr
        assert len(_placed(inventory, jobs[0], 6)) == 6  # the first runs on
        # smoke on a GPU of the first job's is refused naming it; on those it left, it runs.
        for args in (("--gpus", "2"), ()):
            held = gpucluster("smoke", "-i", inventory, *args, "--json", timeout=60)
            assert held.code == 1 and held.json()["problems"] == [
                f"not run: node[1-3]: job {jobs[0]} runs on GPU 2,3 there, GPUs this test "
                f"would share with it (fix: let it finish, or end it: gpucluster stop "
                f"{jobs[0]}; or test the GPUs it leaves free: smoke --gpus LIST)"], \
                held.stdout
        beside = gpucluster("smoke", "-i", inventory, "--gpus", "4-5", "--nproc-per-node",
                            "2", "--sizes", "64K", "--json", timeout=180)
        assert beside.code == 0 and beside.json()["world_size"] == 6, beside.stdout
        assert beside.json()["gpus"] == "4,5"
        assert len(_placed(inventory, jobs[0], 6)) == 6
    finally:
        for job in jobs:
            gpucluster("stop", "-i", inventory, job, timeout=60)
        apps.unlink(missing_ok=True)
        holder.kill()
        holder.wait()


def test_show_ranks_streams_those_ranks_and_the_log_keeps_every_rank(
        cluster: Sandbox, project: Path) -> None:
    """6 ranks, 2 of them shown live: the others' lines (rank 0's epochs) are in the
    job's log, not on the screen."""
    done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "2",
                      "--show-ranks", "1,4", "train.py", "--", "--epochs", "2",
                      cwd=str(project), timeout=120)
    assert done.code == 0, done.stdout + done.stderr
    shown = done.stdout.splitlines()
    assert all(re.match(r"\[node\d/[14]\] ", line) for line in shown), shown
    for rank in (1, 4):
        assert re.search(rf"^\[node\d/{rank}\] rank {rank}/6 on node\d ready$", done.stdout,
                         re.MULTILINE), shown
    job = re.search(r"job (\S+): exited 0 on node\[1-3\]", done.stderr)
    assert job, done.stderr
    logs = gpucluster("logs", "-i", str(cluster.inventory), job[1])
    assert re.search(r"^\[node\d/0\] epoch 1 loss ", logs.stdout, re.MULTILINE), logs.stdout
    detached = gpucluster("launch", "-i", str(cluster.inventory), "-d", "--show-ranks", "0",
                          "train.py", cwd=str(project))
    assert detached.code == 2 and "--show-ranks 0: a detached launch streams no lines (fix: " \
        "gpucluster logs -f --rank 0 JOB)" in " ".join(detached.stderr.split())


def test_a_progress_bar_and_the_error_it_died_in_show_apart(
        cluster: Sandbox, project: Path) -> None:
    """torchrun's tee reads a bar's \\r as an empty line of its rank, glued to the redraw
    before it: each showed as "[node1/0] step 1/4[0]:"; a print while the bar was open
    came glued to it, and so did the traceback's first line to the last. Live, the bar
    shows a draw every few seconds, and as it stood before the rank's next line. The
    print's terminal controls (a title, a bell, a cursor move up) reach no terminal."""
    (project / "bar.py").write_text(
        "import os, sys, time\n"
        "if os.environ.get('RANK') == '0':\n"
        "    for step in range(1, 31):\n"
        "        sys.stderr.write(f'\\rstep {step}/30'); sys.stderr.flush(); time.sleep(0.05)\n"
        "        if step == 15:\n"
        "            print('\\x1b]0;retitled\\x07halfway\\x1b[A', flush=True)\n"
        "    raise ValueError('died in the bar')\n"
        "time.sleep(60)\n")
    done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "1",
                      "bar.py", cwd=str(project), timeout=120)
    assert done.code == 1, done.stdout[-3000:] + done.stderr[-3000:]
    bar = [line for line in done.stdout.splitlines() if "step " in line or "halfway" in line]
    assert all(re.fullmatch(r"\[node\d/0\] (step \d+/30|halfway)", line) for line in bar), bar
    halfway = next(at for at, line in enumerate(bar) if line.endswith(" halfway"))
    assert " step " in bar[halfway - 1], bar  # the bar as it stood, above the line
    assert re.fullmatch(r"\[node\d/0\] step 30/30", bar[-1]), bar  # then the error
    assert len(bar) < 10, bar  # not all 30 draws
    assert re.search(r"^\[node\d/0\] Traceback \(most recent call last\):$", done.stdout,
                     re.MULTILINE), done.stdout[-3000:]
    assert re.search(r"^\[node\d/0\] halfway$", done.stdout, re.MULTILINE), bar
    shown = done.stdout.splitlines()
    # The tee's empty lines are left out; the bar's first one stays before a first draw
    # that the tee read whole (its \r had come), not known for a draw until the second.
    assert all(shown[at + 1].endswith(" step 1/30") for at, line in enumerate(shown)
               if re.fullmatch(r"\[node\d/0\] ", line)), shown
    report = done.stderr[done.stderr.index("last lines of rank 0:"):]
    assert "\n  step 30/30\n  Traceback (most recent call last):\n" in report, report
    job = re.search(r"job (\S+): ", done.stderr)
    assert job, done.stderr
    logs = gpucluster("logs", "-i", str(cluster.inventory), job.group(1))
    assert len(re.findall(r"^\[node\d/0\] step \d+/30$", logs.stdout, re.MULTILINE)) == 30
    assert re.search(r"^\[node\d/0\] halfway$", logs.stdout, re.MULTILINE), logs.stdout
    assert not re.search("[\x07\x1b]", done.stdout + logs.stdout)
    copies = cluster.inventory.parent / ".gpucluster" / "jobs" / job.group(1)
    assert any("\x1b]0;retitled\x07halfway\x1b[A" in copy.read_text()
               for copy in copies.glob("node?.log"))  # the copy keeps every byte


def test_train_on_three_nodes_by_two_processes(cluster: Sandbox, project: Path) -> None:
    done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "2",
                      "train.py", "--", "--epochs", "3", "--checkpoint-dir", FIRST_RUN,
                      cwd=str(project), timeout=180)
    assert done.code == 0, done.stdout + done.stderr
    ready = re.findall(r"^\[(node\d)/(\d)\] rank (\d)/6 on (node\d) ready$", done.stdout,
                       re.MULTILINE)
    assert sorted(int(rank) for _, rank, _, _ in ready) == list(range(6))
    assert all(prefix_node == host and prefix_rank == rank
               for prefix_node, prefix_rank, rank, host in ready)
    # A name the nodes do not know is "no such name", as with a server's DNS, not an
    # unreachable DNS server: torch's store names its peers without a warning for each
    assert "hostname of the client socket cannot be retrieved" not in done.stdout
    # torchrun's one-thread default is set ahead of it: not its banner from every node
    assert "Setting OMP_NUM_THREADS" not in done.stdout + done.stderr
    losses = [float(x) for x in re.findall(r"^\[node1/0\] epoch \d loss ([0-9.]+)$",
                                           done.stdout, re.MULTILINE)]
    assert len(losses) == 3 and losses[-1] < losses[0] / 5, done.stdout
    job = re.search(r"job (\d{8}-\d{6}-[0-9a-f]{4}): exited 0 on node\[1-3\]", done.stderr)
    assert job, done.stderr
    logs = cluster.inventory.parent / ".gpucluster" / "jobs" / job.group(1)
    for index, node in enumerate(cluster.nodes):  # each node's log, as the node wrote it
        text = (logs / f"{node}.log").read_text()
        for rank in (2 * index, 2 * index + 1):
            assert f"[{rank}]:rank {rank}/6 on {node} ready" in text
    jobs = gpucluster("jobs", "-i", str(cluster.inventory))
    assert re.search(rf"{job.group(1)}.*exited 0: node\[1-3\]", jobs.stdout), jobs.stdout
    assert job_processes(cluster) == {}

    # Run it again for more epochs: it resumes from the checkpoints every node's local
    # rank 0 wrote on its own node (the nodes share no filesystem)
    again = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "2",
                       "train.py", "--", "--epochs", "5", "--checkpoint-dir", FIRST_RUN,
                       cwd=str(project), timeout=180)
    assert again.code == 0, again.stdout + again.stderr
    assert "[node1/0] resumed from epoch 2 (attempt 1)" in again.stdout
    resumed = re.findall(r"^\[node1/0\] epoch (\d) loss ([0-9.]+)$", again.stdout, re.MULTILINE)
    assert [epoch for epoch, _ in resumed] == ["3", "4"]
    assert float(resumed[-1][1]) <= losses[-1] * 1.5  # it went on from where it was


# Loaded by the agents of node2 and node3 only (PYTHONPATH names its directory): they close
# the rendezvous 2 s late, as a slow node may, so the head's agent, which hosts the
# rendezvous store, has exited by then. torch's teardown race, every time.
LATE_CLOSE = """\
import socket
import sys

if socket.gethostname() != "node1" and sys.argv[0].endswith("torchrun"):
    import time
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    _shutdown = dynamic_rendezvous.DynamicRendezvousHandler.shutdown

    def _late_shutdown(self):
        time.sleep(2)
        return _shutdown(self)

    dynamic_rendezvous.DynamicRendezvousHandler.shutdown = _late_shutdown
"""


def test_torchs_teardown_race_after_a_clean_job_is_named_not_left_to_alarm(
        cluster: Sandbox, tmp_path: Path) -> None:
    # A project of its own: the bytecode of the aid stays in its code dir on the nodes,
    # where the shared `project` would carry it into the other tests' listings.
    project = tmp_path / "late-close"
    (project / "hooks").mkdir(parents=True)
    (project / "hooks" / "sitecustomize.py").write_text(LATE_CLOSE)
    shutil.copy(TRAIN, project / "train.py")
    done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "1",
                      "--env", "PYTHONPATH=/srv/gpucluster/late-close/hooks", "train.py",
                      "--", "--epochs", "1", cwd=str(project), timeout=120)
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for node in ("node2", "node3"):  # torch's warning, its backtrace folded live
        assert re.search(rf"^\[{node}\] .* has failed to shutdown the rendezvous ",
                         done.stdout, re.MULTILINE), done.stdout[-3000:]
        assert re.search(rf"^\[{node}\] \(\d+ lines of C\+\+ backtrace left out: gpucluster "
                         rf"logs \S+ prints them\)$", done.stdout, re.MULTILINE)
    note = ('node[2-3]: torch\'s "failed to shutdown the rendezvous" came after the job '
            "exited 0 there: torch's teardown race")
    assert "exited 0 on node[1-3]" in done.stderr and note in done.stderr, done.stderr
    job = re.search(r"job (\S+): exited 0", done.stderr)
    assert job
    logs = gpucluster("logs", "-i", str(cluster.inventory), job[1])
    assert note in logs.stderr and "frame #0: " in logs.stdout  # every line, then the note


def test_a_work_dir_shared_by_every_node_keeps_each_nodes_files_apart(
        cluster: Sandbox, project: Path) -> None:
    """As on an NFS home: a work dir every node sees (the host's /var/tmp, which the
    sandbox does not give each node a copy of). Each node's job files stay its own."""
    shared = Path(tempfile.mkdtemp(prefix="gpc-shared-", dir="/var/tmp"))
    try:
        cluster_settings = {**cluster.data["cluster"], "work_dir": str(shared)}
        inventory = cluster.write_inventory(project.parent / "shared.yaml",
                                            cluster=cluster_settings)
        done = gpucluster("launch", "-i", str(inventory), "--nproc-per-node", "1",
                          "train.py", "--", "--epochs", "1", cwd=str(project), timeout=180)
        assert done.code == 0, done.stdout + done.stderr
        (job_dir,) = (shared / "jobs").iterdir()
        assert sorted(p.name for p in job_dir.iterdir()) == cluster.nodes
        for node in cluster.nodes:  # each log holds its own node's rank, none other's
            log = (job_dir / node / "node.log").read_text()
            assert re.findall(r"rank \d/3 on (node\d) ready", log) == [node], log
            assert (job_dir / node / "exit_code").read_text().split()[0] == "0"
        states = gpucluster("jobs", "-i", str(inventory), "--json").json()
        assert {n["state"] for n in states["jobs"][-1]["nodes"].values()} == {"exited"}

        # node2 no longer has the job (its files wiped). Its copy here was made after the
        # job had ended there: `logs` reads it, with how the job ended, and asks no node.
        shutil.rmtree(job_dir / "node2")
        shown = gpucluster("logs", "-i", str(inventory), job_dir.name)
        assert shown.code == 0, shown.stderr
        assert "[node2/1] rank 1/3 on node2 ready" in shown.stdout.splitlines(), shown.stdout
        assert "exited 0 on node[1-3]" in shown.stderr, shown.stderr
        # A copy not known to be final (as of a job detached and not followed to its end):
        # node2 is asked, the job is missing there, and `logs` shows the copy, saying so;
        # the copy is kept, so a search finds its lines too.
        (inventory.parent / ".gpucluster" / "jobs" / job_dir.name / "node2.ended").unlink()
        shown = gpucluster("logs", "-i", str(inventory), job_dir.name)
        assert shown.code == 1, shown.stderr  # missing on node2 all the same
        assert "[node2/1] rank 1/3 on node2 ready" in shown.stdout.splitlines(), shown.stdout
        assert f"node2: job {job_dir.name} is gone from the node; its lines above are the " \
               f"controller's copy" in shown.stderr
        found = gpucluster("logs", "-i", str(inventory), job_dir.name, "-w", "node2",
                           "--grep", "ready")
        assert "[node2/1] rank 1/3 on node2 ready" in found.stdout, found.stdout + found.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_node_that_does_not_answer_refuses_the_launch_at_once(cluster: Sandbox,
                                                               project: Path) -> None:
    recorded = cluster.inventory.parent / ".gpucluster" / "jobs"
    jobs_before = sorted(recorded.glob("*"))
    cluster.node_exec("node3", "iptables -I INPUT -p tcp --dport 22 -j DROP")
    try:
        refused = gpucluster("launch", "-i", str(cluster.inventory), "--connect-timeout", "2",
                             "train.py", cwd=str(project))
    finally:
        cluster.node_exec("node3", "iptables -D INPUT -p tcp --dport 22 -j DROP")
    assert refused.code == 1, refused.stderr
    assert "FAIL ssh node3: unreachable: no answer from" in refused.stderr
    assert "nothing was started" in refused.stderr and "sync failed" not in refused.stderr
    # The way on without it: the hosts the findings did not name
    others = hostrange.fold(n for n in cluster.nodes if n != "node3")
    assert "node3 not ready for a new job (fix what the findings say, or start on the " \
           f"others only: -w {others})" in " ".join(refused.stderr.split()), refused.stderr
    assert sorted(recorded.glob("*")) == jobs_before  # no job record
    assert job_processes(cluster) == {}


def test_a_node_whose_gpus_do_not_answer_refuses_the_launch(cluster: Sandbox,
                                                            project: Path) -> None:
    """Its ranks would die at CUDA's first call (the sandbox's run on the CPU and would
    not): refused before anything starts, with doctor's findings and the way on."""
    cluster.restage("--driver", "node3=failed")
    try:
        refused = gpucluster("launch", "-i", str(cluster.inventory), "train.py",
                             cwd=str(project))
    finally:
        cluster.restage()
    message = " ".join(refused.stderr.split())
    assert refused.code == 1, message
    assert "FAIL nvidia-smi node3: NVIDIA-SMI has failed because it couldn't communicate " \
           "with the NVIDIA driver" in message, message
    assert "node3 not ready for a new job (fix what the findings say, or start on the " \
           "others only: -w node[1-2])" in message and "nothing was started" in message
    # The inventory promises more GPUs than node2 has: refused too.
    hosts = [dict(h) for h in cluster.data["hosts"]]
    hosts[1]["gpus"] = 16
    promised = cluster.write_inventory(cluster.inventory.with_name("promised.yaml"),
                                       hosts=hosts)
    try:
        short = gpucluster("launch", "-i", str(promised), "--nproc-per-node", "1", "--json",
                           "train.py", cwd=str(project))
    finally:
        promised.unlink()
    message = " ".join(short.stderr.split())
    assert short.code == 1 and "FAIL gpu-count node2: 8 GPUs found, inventory expects 16" \
        in message, message
    # --json says why no job ran, on stdout, for the script reading it
    told = json.loads(short.stdout)
    assert told["job"] is None and told["exit_code"] == 1, told
    assert "node2 not ready for a new job" in told["refused"], told
    assert [(f["check"], f["host"], f["status"]) for f in told["findings"]] == \
        [("gpu-count", "node2", "FAIL")], told
    assert told["findings"][0]["message"] == "8 GPUs found, inventory expects 16", told
    assert job_processes(cluster) == {}


def test_a_torchrun_missing_on_the_nodes_refuses_the_launch_naming_the_key(
        cluster: Sandbox, project: Path) -> None:
    text = cluster.inventory.read_text()
    configured = re.search(r'^  torchrun: "(.+)"$', text, re.MULTILINE)
    assert configured, text
    moved = cluster.inventory.with_name("moved-torchrun.yaml")
    moved.write_text(text.replace(configured.group(1), "/opt/gpc-nowhere/bin/torchrun"))
    try:
        refused = gpucluster("launch", "-i", str(moved), "train.py", cwd=str(project))
    finally:
        moved.unlink()
    assert refused.code == 1, refused.stderr
    message = " ".join(refused.stderr.split())
    assert "FAIL torchrun node[1-3]: /opt/gpc-nowhere/bin/torchrun (cluster.torchrun) is " \
           "missing or not executable" in message, message
    assert "nothing was started" in message
    assert job_processes(cluster) == {}


def test_a_full_disk_on_one_node_is_named_with_the_systems_words(cluster: Sandbox,
                                                                project: Path) -> None:
    code_dir = f"/srv/gpucluster/{project.name}"
    (project / "data.bin").write_bytes(os.urandom(256 * 1024))
    cluster.node_exec("node3", f"mkdir -p {code_dir} && "
                               f"mount -t tmpfs -o size=64k gpc-full {code_dir}")
    try:
        refused = gpucluster("launch", "-i", str(cluster.inventory), "train.py",
                             cwd=str(project), timeout=120)
    finally:
        cluster.node_exec("node3", f"umount {code_dir}")
        (project / "data.bin").unlink()
    assert refused.code == 2, refused.stderr  # an error before the job ran
    message = " ".join(refused.stderr.split())
    assert f"node3: cannot unpack the work dir into {code_dir} (tar: " in message, message
    assert "No space left on device)" in message, message  # tar's reason, not its summary
    assert "Exiting with failure status" not in message
    # What went with the start was said as planned, never as synced on every node.
    assert "with the start: " in message and "synced" not in message, message
    assert job_processes(cluster) == {}


def test_killed_workers_on_one_node_stop_the_job_everywhere(cluster: Sandbox,
                                                            project: Path) -> None:
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    assert len(kill_workers("node2")) == 2
    code, _, stderr, took = finish(process, 60)
    assert code == 1, stderr
    assert re.search(r"first failure: rank [23] on node2, worker killed by signal 9 "
                     r"\(SIGKILL\)", stderr), stderr
    assert "likely cause: the worker was killed by SIGKILL: most often the kernel's " \
        "out-of-memory killer, for host memory (fix: `gpucluster run -w node2 --sudo" in stderr
    assert "nothing of it is left on node[1-3]" in stderr
    assert took < 30, f"took {took:.1f} s to end after the kill"
    assert job_processes(cluster) == {}
    # The node that failed keeps its own end, though the launcher then stopped the job
    job = re.search(r"^job (\S+): ", stderr, re.MULTILINE)
    assert job, stderr
    [record] = gpucluster("jobs", "-i", str(cluster.inventory), "--json", "-n", "1"
                          ).json()["jobs"]
    assert record["id"] == job.group(1)
    assert record["nodes"]["node2"] == {"state": "exited", "exit_code": 1, "detail": "",
                                      "peers_not_stopped": {}}


def test_max_restarts_re_forms_the_job_after_a_nodes_workers_die(cluster: Sandbox,
                                                                 project: Path) -> None:
    """torchrun's own restart, with the store variable launch sets for --max-restarts:
    the job re-forms, resumes from its checkpoint and finishes (without it, the new
    workers dial the old round's peers and the job fails)."""
    process = start_attached(cluster, project, "--max-restarts", "1", "train.py", "--",
                             "--epochs", "12", "--step-delay", "0.05", "--checkpoint-dir",
                             "/srv/gpucluster/restarted")
    assert process.stdout is not None
    seen = []
    while not any("epoch 2 loss" in line for line in seen):
        line = process.stdout.readline()
        assert line, "the launcher ended early:\n" + "".join(seen)
        seen.append(line)
    assert len(kill_workers("node2")) == 2
    code, stdout, stderr, _ = finish(process, 240)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert re.search(r"^\[node1/0\] resumed from epoch [2-9] \(attempt 1\)$", stdout,
                     re.MULTILINE), stdout[-3000:]
    assert "[node1/0] done" in stdout
    assert job_processes(cluster) == {}


def test_a_killed_torchrun_fails_its_node_though_its_workers_run_on(
        cluster: Sandbox, project: Path) -> None:
    """The OOM killer's pick may be the agent: its workers, orphaned, still carry the
    job's marker. The node used to count as running, and launch followed the others as
    if nothing had happened, the node's part of the job unwatched."""
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    assert len(kill_workers("node2", agent=True)) == 1
    code, _, stderr, _ = finish(process, 60)
    assert code == 1, stderr
    assert "node2 failed (torchrun was killed by signal 9 (SIGKILL) while processes of " \
           "the job still ran there): stopping the job on every node" in stderr, stderr
    assert re.search(r"exited 137 leaving processes on node2, stopped on node\[1,3\]",
                     stderr), stderr
    assert job_processes(cluster) == {}


@pytest.mark.parametrize("press", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_job_on_every_node(cluster: Sandbox, project: Path,
                                            press: signal.Signals) -> None:
    """SIGTERM (`kill`, a supervisor's stop) as Ctrl-C: it used to end the CLI at once
    and leave the job running on every node."""
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    assert job_processes(cluster).keys() == set(cluster.nodes)
    process.send_signal(press)
    code, _, stderr, _ = finish(process, 60)
    assert code == 130, stderr
    assert "interrupted: stopping the job on every node" in stderr
    assert re.search(r"stopped: nothing of it is left on node\[1-3\] \([1-9]\d* processes",
                     stderr), stderr
    assert job_processes(cluster) == {}


def test_a_second_ctrl_c_kills_the_job_at_once_and_still_confirms_it_gone(
        cluster: Sandbox, project: Path) -> None:
    """Ctrl-C pressed twice (or `timeout -s INT`, which signals the process and then its
    group): the second press used to end the wait for the stop, and the CLI exited while
    the job ran on every node."""
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    code, _, stderr, _ = finish(process, 60)
    assert code == 130, stderr
    assert stderr.count("interrupted: stopping the job on every node") == 1, stderr
    assert "interrupted again: killing the job now" in stderr, stderr
    assert re.search(r"job \S+: stopped on node\[1-3\]", stderr), stderr
    assert "nothing of it is left on node[1-3]" in stderr, stderr
    assert job_processes(cluster) == {}


def test_a_closed_output_stops_an_attached_job_but_not_one_logs_follows(
        cluster: Sandbox, project: Path) -> None:
    """`launch ... | head`: once head has its lines the launcher's output has no reader;
    it stops its job as Ctrl-C does (it used to wait for ever, its followers dead of
    BrokenPipeError). `logs -f ... | head` only stops following: the job is not its."""
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as head does once it has its lines
    assert process.wait(timeout=60) != 0
    stderr = process.stderr.read()
    assert "has no reader any more (a closed pipe): stopping the job on every node" in stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert job_processes(cluster) == {}

    inventory = str(cluster.inventory)
    started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "2",
                         "train.py", "--", *SLOW, cwd=str(project))
    job = started.stdout.strip()
    try:
        follower = subprocess.Popen(
            [sys.executable, "-m", "gpucluster", "logs", "-i", inventory, "-f", job],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_ranks(follower, 6)
        assert follower.stdout is not None and follower.stderr is not None
        follower.stdout.close()
        assert follower.wait(timeout=30) == 141  # 128 + SIGPIPE, as a shell reports it
        assert "Traceback" not in follower.stderr.read()
        jobs = gpucluster("jobs", "-i", inventory)
        assert re.search(rf"{job}.*running: node\[1-3\]", jobs.stdout), jobs.stdout
    finally:
        gpucluster("stop", "-i", inventory, job)


_FOLDED = re.compile(r"\((\d+) lines? of .+ left out: gpucluster logs \S+ prints them\)$")


def _unfolded(followed: list[str], log: list[str]) -> list[str]:
    """`followed`, the end of one rank's `log` as `logs -f` showed it, with each run of
    lines the live view folds into one (a rank's faulthandler dump when it aborted during
    the stop: seen in CI, one run in many) put back from `log`, aligned from the end. Per
    rank: the note of a fold comes at its end, after the other ranks' lines meanwhile."""
    lines, end = [], len(log)
    for line in reversed(followed):
        folded = _FOLDED.search(line)
        count = int(folded.group(1)) if folded else 1
        lines[:0] = log[max(0, end - count):end] if folded else [line]
        end -= count
    return lines


def test_detach_refuse_follow_and_stop(cluster: Sandbox, project: Path) -> None:
    inventory = str(cluster.inventory)
    started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "2",
                         "train.py", "--", *SLOW, cwd=str(project))
    assert started.code == 0, started.stderr
    job = started.stdout.strip()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", job)
    recorded = cluster.inventory.parent / ".gpucluster" / "jobs"
    jobs_before = sorted(recorded.iterdir())
    try:
        refused = gpucluster("launch", "-i", inventory, "-d", "train.py", cwd=str(project))
        assert refused.code == 1
        assert f"job {job} still running" in refused.stderr
        assert f"gpucluster stop {job}" in refused.stderr
        # doctor's port test never takes the port from a starting job (it would hang)
        assert f"port 29500 is held by gpucluster job {job}" in refused.stderr
        assert "nothing was started" in refused.stderr
        # The start's sessions, logged in while the checks ran, were sent nothing and ended.
        assert node_processes(cluster, lambda _, cmdline: b"read -r gpc_n" in cmdline) == {}
        jobs = gpucluster("jobs", "-i", inventory)
        assert re.search(rf"{job}.*running: node\[1-3\]", jobs.stdout), jobs.stdout
        assert sorted(recorded.iterdir()) == jobs_before  # the refused one left no record

        env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
        follower = subprocess.Popen(
            [sys.executable, "-m", "gpucluster", "logs", "-i", inventory, "-f", job[-4:]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        wait_for_ranks(follower, 6)
        tailing = subprocess.Popen(  # the last 3 lines so far, then what comes
            [sys.executable, "-m", "gpucluster", "logs", "-i", inventory, "-f", "-n", "3",
             job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ranked = subprocess.Popen(  # two ranks' lines only, as they come
            [sys.executable, "-m", "gpucluster", "logs", "-i", inventory, "-f", "--rank",
             "1,4", job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert tailing.stdout is not None
        first = tailing.stdout.readline()
        assert first, tailing.stderr.read() if tailing.stderr else ""  # the tail came
        time.sleep(6)  # ...and more lines after it (an epoch a second or two)
        # Where each rank is now, read by py-spy, the job left running: a rank stopped
        # (SIGSTOP) is said to be; the others, waiting for it, are in train.py's main.
        pid = int(node_processes(cluster, lambda environ, cmdline: b"train.py" in cmdline
                                 and b"torchrun" not in cmdline and re.search(
                                     rb"(?:^|\0)LOCAL_RANK=0\0", environ) is not None
                                 )["node2"][0].split()[0])
        rank = int(re.findall(rb"(?:^|\0)RANK=(\d+)\0",
                              Path(f"/proc/{pid}/environ").read_bytes())[0])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3)
        looked = gpucluster("stacks", "-i", inventory, job, "--json")
        assert looked.code == 0, looked.stdout + looked.stderr
        groups = looked.json()["stacks"]
        held = [g for g in groups if g["where"].endswith(
            " (its process is stopped: SIGSTOP, Ctrl-Z or a debugger)")]
        assert [(g["ranks"], g["nodes"]) for g in held] == [([rank], ["node2"])], groups
        assert sorted(r for g in groups for r in g["ranks"]) == list(range(6)), groups
        assert all(re.match(r"train\.py line \d+ in main", g["where"]) for g in groups), groups
        assert Path(looked.json()["kept"]).is_file()
        assert set(job_processes(cluster)) == {"node1", "node2", "node3"}  # still running
        stopped = gpucluster("stop", "-i", inventory, job, "--grace", "5")
        assert stopped.code == 0, stopped.stderr
        assert f"job {job} stopped: nothing of it is left on node[1-3]" in stopped.stdout
        assert "KILL" not in stopped.stdout  # the stopped rank was continued to take TERM
        code, _, stderr, _ = finish(follower, 30)
        assert f"job {job}: stopped on node[1-3]" in stderr
        assert code == 1  # a stopped job did not succeed
        code, kept, stderr, _ = finish(ranked, 30)
        assert code == 1 and f"job {job}: stopped on node[1-3]" in stderr, stderr
        assert re.search(r"^\[node\d/1\] rank 1/6 on node\d ready$", kept, re.MULTILINE) and \
            re.search(r"^\[node\d/4\] rank 4/6 on node\d ready$", kept, re.MULTILINE), kept
        assert all(re.match(r"\[node\d/[14]\] ", line) for line in kept.splitlines()), kept
        code, tailed, stderr, _ = finish(tailing, 30)  # on from the lines after `first`
        assert code == 1 and f"job {job}: stopped on node[1-3]" in stderr, stderr
        # Each rank's lines in it are the end of that rank's whole log: none twice, none
        # missed between the tail and the live part (only rank 0 prints its epochs).
        whole = gpucluster("logs", "-i", inventory, job).stdout.splitlines()
        tailed_lines = [first.rstrip("\n"), *tailed.splitlines()]
        assert len(tailed_lines) > 3, tailed_lines
        for prefix in {line.partition("] ")[0] for line in whole}:
            log = [line for line in whole if line.startswith(f"{prefix}] ")]
            own = _unfolded([line for line in tailed_lines
                             if line.startswith(f"{prefix}] ")], log)
            assert own == log[len(log) - len(own):], (prefix, own, log)
        again = gpucluster("stop", "-i", inventory, job)  # nothing to stop: it says so
        assert again.code == 0, again.stderr
        assert again.stdout.strip() == \
            f"job {job} had already ended: nothing of it is left on node[1-3]"
        newest = gpucluster("stop", "-i", inventory)  # not named: the newest, this one
        # (no other job runs here: one would be named, with its own stop)
        assert " ".join(newest.stdout.split()) == \
            f"job {job} had already ended: nothing of it is left on node[1-3]", newest.stdout
    finally:
        gpucluster("stop", "-i", inventory, job)
    assert job_processes(cluster) == {}
    node2 = gpucluster("logs", "-i", inventory, job, "-w", "node2")
    assert node2.code == 0
    assert re.search(r"^\[node2/[23]\] rank [23]/6 on node2 ready$", node2.stdout, re.MULTILINE)
    assert "[node1" not in node2.stdout


ESCAPE = """\
import os, subprocess, sys, time
# A child that drops the whole environment (the job marker with it) in a session of its
# own, as a daemonising helper or `env -i` would: only the job's cgroup still knows it.
subprocess.Popen(["sleep", "1007"], env={}, start_new_session=True)
print("rank", os.environ["RANK"], "ready", flush=True)
time.sleep(600)
"""


def escaped_sleeps(cluster: Sandbox) -> list[str]:
    found = []
    for node in cluster.nodes:
        for pid in subprocess.run(["ip", "netns", "pids", f"{NAME}-{node}"],
                                  capture_output=True, text=True, check=True).stdout.split():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001007\x00":
                    found.append(f"{node}:{pid}")
    return found


def test_stop_ends_a_process_that_reset_its_environment(cluster: Sandbox,
                                                         project: Path) -> None:
    (project / "escape.py").write_text(ESCAPE)
    inventory = str(cluster.inventory)
    started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "1",
                         "escape.py", cwd=str(project))
    assert started.code == 0, started.stderr
    job = started.stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while len(escaped_sleeps(cluster)) < 3:
            assert time.monotonic() < deadline, escaped_sleeps(cluster)
            time.sleep(0.3)
        stopped = gpucluster("stop", "-i", inventory, job, "--grace", "3")
        assert stopped.code == 0, stopped.stderr
        assert f"job {job} stopped: nothing of it is left on node[1-3]" in stopped.stdout
    finally:
        gpucluster("stop", "-i", inventory, job)
        survivors = escaped_sleeps(cluster)
        for survivor in survivors:  # not to leave them to the next test
            os.kill(int(survivor.split(":")[1]), signal.SIGKILL)
    assert survivors == []
    assert job_processes(cluster) == {}


def test_json_of_launch_jobs_and_stop_is_pinned(cluster: Sandbox, project: Path) -> None:
    inventory = str(cluster.inventory)
    detached = gpucluster("launch", "-i", inventory, "-d", "--json", "--nproc-per-node", "1",
                          "train.py", "--", *SLOW, cwd=str(project))
    assert detached.code == 0, detached.stderr
    started = detached.json()
    assert set(started) == {"schema", "job", "detached", "hosts"} and started["schema"] == 1
    job = started["job"]
    try:
        listed = gpucluster("jobs", "-i", inventory, "--json").json()
        # "slurm": Slurm's queue, null where Slurm is not set up (test_slurm lists one).
        assert set(listed) == {"schema", "jobs", "slurm"} and listed["slurm"] is None
        entry = next(j for j in listed["jobs"] if j["id"] == job)
        assert set(entry) == {"id", "script", "module", "args", "hosts", "started_at",
                              "image", "gpus", "run", "attempt", "supervisor", "nodes",
                              "first_failure", "quiet_s"}
        assert entry["gpus"] is None  # every GPU: no --gpus
        assert entry["first_failure"] is None
        assert 0 <= entry["quiet_s"] < 60  # it has just started, and prints as it goes
        assert (entry["script"], entry["module"]) == ("train.py", False)
        assert (entry["run"], entry["attempt"]) == (job, 1)
        assert {n["state"] for n in entry["nodes"].values()} == {"running"}
        stopped = gpucluster("stop", "-i", inventory, job, "--json", "--grace", "5")
        assert stopped.code == 0, stopped.stderr
        payload = stopped.json()
        assert set(payload) == {"schema", "job", "clean", "nodes"} and payload["clean"]
        assert set(payload["nodes"]["node1"]) == {"found", "how", "left", "detail"}
    finally:
        gpucluster("stop", "-i", inventory, job)
    # A project of its own: the shared one's copy on the nodes is other tests' to list.
    needs_a_module = project.parent / "needs-a-module"
    needs_a_module.mkdir(exist_ok=True)
    (needs_a_module / "main.py").write_text("import gpc_no_such_module\n")
    failing = gpucluster("launch", "-i", inventory, "--json", "--nproc-per-node", "1",
                         "main.py", cwd=str(needs_a_module), timeout=180)
    outcome = failing.json()
    assert set(outcome) == {"schema", "job", "hosts", "exit_code", "interrupted", "nodes",
                            "first_failure", "stopped", "logs"}
    assert failing.code == outcome["exit_code"] != 0
    failure = outcome["first_failure"]
    assert failure["node"] in cluster.nodes
    # Python's own words on the node, known for what they mean
    assert set(failure["likely_cause"]) == {"name", "what", "fix", "evidence"}
    assert failure["likely_cause"]["name"] == "module-missing"
    assert failure["likely_cause"]["what"] == \
        "the nodes' python has no module 'gpc_no_such_module'"
    assert failure["likely_cause"]["evidence"].endswith(
        "ModuleNotFoundError: No module named 'gpc_no_such_module'")
    assert "No module named" in failing.stderr  # job lines on stderr, JSON on stdout
    # Its traceback, as the real torchrun copied it, from its first line to its exception.
    assert failure["rank_error"][0] == "Traceback (most recent call last):"
    assert failure["rank_error"][-1] == \
        "ModuleNotFoundError: No module named 'gpc_no_such_module'"
    # `jobs` names it from then on, no log fetched.
    listed = gpucluster("jobs", "-i", inventory, "--json").json()["jobs"]
    noted = next(j for j in listed if j["id"] == outcome["job"])["first_failure"]
    assert noted == f"rank {failure['rank']} on {failure['node']}: the nodes' python has no " \
                    f"module 'gpc_no_such_module'", noted


def test_a_detached_job_that_fails_on_a_node_is_stopped_on_the_others_and_jobs_says_why(
        cluster: Sandbox, project: Path) -> None:
    """`launch -d`, then only `jobs`: it said `running: node[1-2], exited 1: node3` for
    minutes (nothing stopped the others, which held their GPUs until their own end), and
    never why. Now the failed node stops the job on the others itself, over the SSH mesh;
    once it has ended everywhere, jobs reads its first failure from the failed node's log,
    copies it here, and from then on lists it from what it noted, asking the nodes
    nothing."""
    quota = project.parent / "quota"
    quota.mkdir(exist_ok=True)
    (quota / "main.py").write_text(
        "import os, time\n"
        "rank = int(os.environ['RANK'])\n"
        "time.sleep(0 if rank == 2 else 120)\n"
        "raise OSError(f'[Errno 122] Disk quota exceeded: /data/shard-{rank}')\n")
    inventory = str(cluster.inventory)
    started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "1", "main.py",
                         cwd=str(quota))
    assert started.code == 0, started.stderr
    assert "cannot log in" not in started.stderr  # the mesh is whole: no warning
    job = started.stdout.strip()

    def listed() -> dict:
        return next(j for j in gpucluster("jobs", "-i", inventory, "--json").json()["jobs"]
                    if j["id"] == job)

    deadline = time.monotonic() + 60  # the others' ranks would end by themselves at 120 s
    entry = listed()
    while any(node["state"] not in ("exited", "stopped") for node in entry["nodes"].values()):
        assert entry["first_failure"] is None, entry  # not before every node has ended
        assert time.monotonic() < deadline, entry
        time.sleep(1)
        entry = listed()
    states = {name: (node["state"], node["exit_code"]) for name, node in entry["nodes"].items()}
    failed = [name for name, state in states.items() if state == ("exited", 1)]
    assert len(failed) == 1, states
    assert {states[name][0] for name in cluster.nodes if name != failed[0]} == {"stopped"}
    assert entry["first_failure"] is not None, entry
    assert re.fullmatch(rf"rank 2 on {failed[0]}: OSError: \[Errno 122\] Disk quota "
                        r"exceeded: /data/shard-2", entry["first_failure"]), entry
    copies = cluster.inventory.parent / ".gpucluster" / "jobs" / job
    assert {p.name for p in copies.glob("*.ended")} == {f"{failed[0]}.ended"}
    assert listed() == entry
    # What the failed node did, kept in its job dir
    report = gpucluster("run", "-i", inventory, "-w", failed[0],
                        f"cat /srv/gpucluster/jobs/{job}/{failed[0]}/stop-peers.log")
    others = sorted(name for name in cluster.nodes if name != failed[0])
    assert report.stdout.splitlines() == [f"{failed[0]}: {line}" for line in (
        f"torchrun exited 1 on {failed[0]}: stopping job {job} on {hostrange.fold(others)}",
        *(f"{name}: stopped" for name in others))], report.stdout


def test_a_node_stops_the_job_itself_while_its_attached_launch_is_stopped(
        cluster: Sandbox, project: Path) -> None:
    """An attached launch stopped (SIGSTOP, as Ctrl-Z does) when node3's rank fails: the
    others ran on until it was continued, which then took a node it had not heard from
    for lost. Now node3, no stop of its launcher's come within 30 s, stops the job on the
    others itself; continued, launch does not hold the nodes' silence against them and
    reports the job as it ended."""
    away = project.parent / "away"  # a code dir of its own on the nodes
    away.mkdir(exist_ok=True)
    (away / "main.py").write_text(
        "import os, sys, time\n"
        "rank = int(os.environ['RANK'])\n"
        "print('ready', flush=True)\n"
        "time.sleep(3 if rank == 2 else 300)\n"
        "sys.exit(7)\n")
    inventory = str(cluster.inventory)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "launch", "-i", inventory, "--nproc-per-node",
         "1", "main.py"], cwd=away, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    try:
        wait_for_ranks(process, 3)
        process.send_signal(signal.SIGSTOP)
        job = gpucluster("jobs", "-i", inventory, "--json").json()["jobs"][-1]
        deadline = time.monotonic() + 90  # the others' ranks would end by themselves at 300 s
        while {n["state"] for n in job["nodes"].values()} != {"exited", "stopped"}:
            assert time.monotonic() < deadline, job
            time.sleep(1)
            job = gpucluster("jobs", "-i", inventory, "--json").json()["jobs"][-1]
        states = {name: (node["state"], node["exit_code"]) for name, node in job["nodes"].items()}
        assert states["node3"] == ("exited", 1), states
        assert {states["node1"][0], states["node2"][0]} == {"stopped"}, states
        # read from node3's log, not from the stopped launcher's copy of it (behind it)
        job = gpucluster("jobs", "-i", inventory, "--json").json()["jobs"][-1]
        assert job["first_failure"] == "rank 2 on node3: worker exit code 7", job
    finally:
        process.send_signal(signal.SIGCONT)
    code, _, stderr, _ = finish(process, 120)
    said = " ".join(stderr.split())
    assert code == 1, stderr
    assert "this process did not run for" in said, stderr
    assert "first failure: rank 2 on node3, worker exit code 7; torchrun exit code 1" in said
    # in the order the nodes' states came, all at once once it was continued
    ended = re.search(rf"job {job['id']}: ([^:;]*); logs in", said)
    assert ended and set(ended[1].split(", ")) == {
        "exited 1 on node3", "stopped on node[1-2]"}, stderr
    assert "unreachable" not in said, stderr
    report = gpucluster("run", "-i", inventory, "-w", "node3",
                        f"cat /srv/gpucluster/jobs/{job['id']}/node3/stop-peers.log")
    assert report.stdout.splitlines()[1:] == [
        "node3: no stop from its launcher in 30 s: stopping it here",
        "node3: node1: stopped", "node3: node2: stopped"], report.stdout


def test_jobs_says_why_a_failed_node_could_not_stop_the_others(cluster: Sandbox,
                                                              project: Path) -> None:
    """launch -d where node3 cannot log in to the others (its known_hosts set aside):
    its rank fails, its stop of the others reaches neither, and `jobs` says which and
    why; `stop` ends the job there."""
    lonely = project.parent / "lonely"  # a code dir of its own on the nodes
    lonely.mkdir(exist_ok=True)
    (lonely / "main.py").write_text("import os, sys, time\n"
                                    "time.sleep(1 if os.environ['RANK'] == '2' else 300)\n"
                                    "sys.exit(7)\n")
    inventory = str(cluster.inventory)
    known = "~/.ssh/known_hosts"
    aside = gpucluster("run", "-i", inventory, "-w", "node3", f"mv {known} {known}.aside")
    assert aside.code == 0, aside.stderr
    job = ""
    try:
        started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "1",
                             "main.py", cwd=str(lonely))
        assert started.code == 0, started.stderr
        job = started.stdout.strip()
        deadline = time.monotonic() + 60
        while True:
            listed = gpucluster("jobs", "-i", inventory, "--json").json()["jobs"]
            nodes = next(j for j in listed if j["id"] == job)["nodes"]
            if nodes["node3"]["peers_not_stopped"]:
                break
            assert time.monotonic() < deadline, nodes
            time.sleep(1)
        assert nodes["node3"]["peers_not_stopped"] == {
            peer: "Host key verification failed." for peer in ("node1", "node2")}, nodes
        assert {nodes["node1"]["state"], nodes["node2"]["state"]} == {"running"}, nodes
    finally:
        back = gpucluster("run", "-i", inventory, "-w", "node3", f"mv {known}.aside {known}")
        if job:
            stopped = gpucluster("stop", "-i", inventory, job)
    assert back.code == 0, back.stderr
    assert stopped.code == 0, stopped.stderr


def test_a_stopped_detached_job_stops_nothing_from_its_nodes(cluster: Sandbox,
                                                            project: Path) -> None:
    """A stop's TERM fails each node's torchrun: none of them, stopped as asked, stops
    the others in turn. And a detached start warns, without refusing, where a node cannot
    log in to the next (here node3, its known_hosts set aside)."""
    sleepy = project.parent / "sleepy"  # a code dir of its own on the nodes
    sleepy.mkdir(exist_ok=True)
    (sleepy / "main.py").write_text("import time\ntime.sleep(300)\n")
    inventory = str(cluster.inventory)
    known = "~/.ssh/known_hosts"
    aside = gpucluster("run", "-i", inventory, "-w", "node3", f"mv {known} {known}.aside")
    assert aside.code == 0, aside.stderr
    try:
        started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "1",
                             "main.py", cwd=str(sleepy))
    finally:
        back = gpucluster("run", "-i", inventory, "-w", "node3", f"mv {known}.aside {known}")
        assert back.code == 0, back.stderr
    assert started.code == 0, started.stderr
    assert "warning: node3 cannot log in to the next node over SSH (node3 to node1: Host " \
        "key verification failed.): where the job fails on such a node, it is not stopped " \
        "on the others" in " ".join(started.stderr.split()), started.stderr
    job = started.stdout.strip()
    stopped = gpucluster("stop", "-i", inventory, job)
    assert stopped.code == 0, stopped.stderr
    left = gpucluster("run", "-i", inventory, f"ls /srv/gpucluster/jobs/{job}/*/")
    assert "stop-peers.sh" in left.stdout, left.stdout  # it was armed...
    assert "stop-peers.log" not in left.stdout, left.stdout  # ...and never fired


LISTING = """import os
for root, _, files in sorted(os.walk(".")):
    for name in sorted(files):
        print("file", os.path.join(root, name)[2:], flush=True)
open("written-by-job.txt", "w").write("job output")
"""


def test_sync_sends_only_what_changed_and_keeps_job_output(cluster: Sandbox,
                                                           project: Path) -> None:
    (project / "list.py").write_text(LISTING)
    (project / "data").mkdir()
    (project / "data" / "a.txt").write_text("a")
    (project / "gone.txt").write_text("deleted later")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref")
    (project / "env").mkdir()
    (project / "env" / "pyvenv.cfg").write_text("home = /usr")
    (project / "big.ckpt").write_text("local only")
    (project / ".gpuclusterignore").write_text("# not for the nodes\n*.ckpt\n")

    def launch() -> tuple[str, str]:
        done = gpucluster("launch", "-i", str(cluster.inventory), "list.py",
                          cwd=str(project), timeout=120)
        assert done.code == 0, done.stderr
        return done.stdout, done.stderr

    stdout, stderr = launch()
    files = set(re.findall(r"^\[node3/2\] file (\S+)$", stdout, re.MULTILINE))
    assert files == {"list.py", "data/a.txt", "gone.txt", "train.py", ".gpuclusterignore",
                     ".gpucluster-sync"}  # the list of what was sent, kept on the node
    assert re.search(r"with the start: 5 to send .*, 0 to delete, 0 unchanged on "
                     r"node\[1-3\]", stderr)

    (project / "gone.txt").unlink()
    time.sleep(1.1)  # a new mtime second
    (project / "data" / "a.txt").write_text("changed")
    stdout, stderr = launch()
    assert re.search(r"1 to send .*, 1 to delete, 3 unchanged on node\[1-3\]", stderr), \
        stderr
    files = set(re.findall(r"^\[node2/1\] file (\S+)$", stdout, re.MULTILINE))
    assert "gone.txt" not in files and "written-by-job.txt" in files  # the job's own file stays
    code_dir = "/srv/gpucluster/project"
    assert cluster.node_exec("node3", f"cat {code_dir}/data/a.txt").stdout == "changed"
    assert cluster.node_exec("node3", f"cat {code_dir}/written-by-job.txt").stdout == \
        "job output"

    # Ignoring what was sent before (a dataset the nodes hold now) keeps their copy.
    (project / ".gpuclusterignore").write_text("*.ckpt\ndata/\n")
    stdout, stderr = launch()
    assert re.search(r"1 to send .*, 0 to delete, 2 unchanged on node\[1-3\]", stderr), \
        stderr
    assert cluster.node_exec("node3", f"cat {code_dir}/data/a.txt").stdout == "changed"
    (project / ".gpuclusterignore").write_text("# not for the nodes\n*.ckpt\n")


def test_a_module_runs_with_dash_m_and_links_arrive_as_links(cluster: Sandbox,
                                                             project: Path) -> None:
    """launch -m pkg.hello: torchrun -m from the code dir, on every node; a link to a
    dataset path (absent here) arrives as that link."""
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "hello.py").write_text(
        "import os, sys\n"
        "print(f'{__name__} rank {os.environ[\"RANK\"]} args {sys.argv[1:]} '\n"
        "      f'data -> {os.readlink(\"datasets\")}', flush=True)\n")
    (project / "datasets").symlink_to("/mnt/datasets/imagenet")
    try:
        done = gpucluster("launch", "-i", str(cluster.inventory), "--nproc-per-node", "1",
                          "-m", "pkg.hello", "--", "--lr", "0.1", cwd=str(project),
                          timeout=120)
        assert done.code == 0, done.stderr
        for rank, node in enumerate(cluster.nodes):
            assert (f"[{node}/{rank}] __main__ rank {rank} args ['--lr', '0.1'] data -> "
                    f"/mnt/datasets/imagenet") in done.stdout, done.stdout
        listed = gpucluster("jobs", "-i", str(cluster.inventory), "--json").json()["jobs"]
        assert (listed[-1]["script"], listed[-1]["module"], listed[-1]["args"]) == (
            "pkg.hello", True, ["--lr", "0.1"])
    finally:
        shutil.rmtree(project / "pkg")
        (project / "datasets").unlink()


FAKE_TORCHRUN = """#!/bin/sh
# Stands in for torchrun inside a busybox image: the sandbox has no image with torch.
echo "in container: $(hostname) pwd=$PWD args=$*"
echo "marker=$GPUCLUSTER_JOB gloo=$GLOO_SOCKET_IFNAME"
[ "$(hostname)" != "${FAKE_FAIL_ON:-}" ] || exit 3
if [ -n "${FAKE_WORKER:-}" ]; then
  # As torchrun: a worker in a session of its own, TERM passed on to its group (here a
  # moment later) and waited for. The worker notes each TERM, then saves for a second.
  setsid sh -c 'terms=0; trap "terms=\\$((terms + 1)); echo worker: TERM" TERM
    while [ "$terms" = 0 ]; do sleep 0.1; done; sleep 1; echo "worker: saved"' &
  worker=$!
  trap 'sleep 0.3; kill -TERM -$worker; wait $worker; exit 143' TERM
  wait $worker
fi
if [ -n "${FAKE_HANG:-}" ]; then
  # As torchrun with one rank that hangs (fake-rank): its stderr in torchrun's --log-dir
  # by attempt and local rank, its RANK its node's number less one.
  previous= logs=
  for word; do [ "$previous" = --log-dir ] && logs=$word; previous=$word; done
  mkdir -p "$logs/fake/attempt_0/0"
  node=${GPUCLUSTER_JOB##*@node}
  RANK=$((node - 1)) LOCAL_RANK=0 setsid fake-rank 2> "$logs/fake/attempt_0/0/stderr.log" &
  worker=$!
  trap 'kill -TERM -$worker; wait $worker; exit 143' TERM
  wait $worker
  exit $?
fi
sleep "${FAKE_SLEEP:-0}"
"""
# A rank stuck in a wait, standing in for a Python one: on ABRT (a hang's stop) it writes
# what faulthandler would (the image has no Python) and dies of it.
FAKE_RANK = """#!/bin/sh
trap 'printf "%s\\n" "Fatal Python error: Aborted" "" \\
  "Current thread 0x00007f0000000001 (most recent call first):" \\
  "  File \\"/srv/hang.py\\", line 7 in wait" "  File \\"/srv/hang.py\\", line 9 in <module>" \\
  "" "Extension modules: none (total: 0)" >&2; trap - ABRT; kill -ABRT $$' ABRT
while :; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real podman image: busybox, and a stand-in torchrun."""
    with busybox_image(tmp_path_factory.mktemp("rootfs"), "localhost/gpclnch-fake:1",
                       {"bin/torchrun": FAKE_TORCHRUN.encode(),
                        "bin/fake-rank": FAKE_RANK.encode()}) as reference:
        yield reference


def test_an_image_missing_on_the_nodes_is_named_and_never_pulled(cluster: Sandbox,
                                                                 project: Path) -> None:
    refused = gpucluster("launch", "-i", str(cluster.inventory), "--image",
                         "localhost/gpclnch-absent:1", "train.py", cwd=str(project),
                         timeout=120)
    assert refused.code == 2, refused.stderr
    message = " ".join(refused.stderr.split())
    assert "stopped on every node: node[1-3]: image localhost/gpclnch-absent:1 is not on " \
           "this node (fix: set cluster.image to it and run gpucluster provision --only " \
           "image" in message, message
    assert "Trying to pull" not in message  # podman was never asked to pull it
    assert job_processes(cluster) == {}


def test_container_job_runs_in_the_pushed_image_and_stops(cluster: Sandbox, project: Path,
                                                         image: str) -> None:
    data = {**cluster.data, "cluster": {**cluster.data["cluster"], "image": image}}
    inventory = cluster.inventory.with_name("with-image.yaml")
    inventory.write_text(yaml.safe_dump(data))
    pushed = gpucluster("provision", "-i", str(inventory), "--only", "image", timeout=180)
    assert pushed.code == 0, pushed.stdout + pushed.stderr

    done = gpucluster("launch", "-i", str(inventory), "--container", "train.py", "--",
                      "--lr", "0.1", cwd=str(project), timeout=120)
    assert done.code == 0, done.stdout + done.stderr
    for node in cluster.nodes:
        assert re.search(rf"^\[{node}\] in container: {node} pwd=/srv/gpucluster/project "
                         rf"args=--nnodes 3 .* train\.py --lr 0\.1$", done.stdout, re.MULTILINE)
        assert re.search(rf"^\[{node}\] marker=\d{{8}}-\d{{6}}-[0-9a-f]{{4}}@{node} gloo=eth0$",
                         done.stdout, re.MULTILINE), done.stdout

    started = gpucluster("launch", "-i", str(inventory), "-d", "--container", "--env",
                         "FAKE_WORKER=1", "train.py", cwd=str(project))
    assert started.code == 0, started.stderr
    job = started.stdout.strip()
    running = gpucluster("run", "-i", str(inventory), "podman ps --format '{{.Names}}'")
    assert running.stdout.count(f"gpucluster-{job}") >= 1, running.stdout
    stopped = gpucluster("stop", "-i", str(inventory), job, "--grace", "5")
    assert f"job {job} stopped: nothing of it is left on node[1-3]" in stopped.stdout
    # One TERM to each worker, from its torchrun (which the engine's stop TERMed): the
    # stop TERMed the workers too, whose TERM handler (a checkpoint save) ran twice.
    logs = gpucluster("logs", "-i", str(inventory), job).stdout
    for node in cluster.nodes:
        assert re.findall(rf"^\[{node}\] worker: (.*)$", logs, re.MULTILINE) == [
            "TERM", "saved"], logs
    left = gpucluster("run", "-i", str(inventory), "podman ps -a --format '{{.Names}}'")
    assert f"gpucluster-{job}" not in left.stdout
    assert job_processes(cluster) == {}

    # A hang's stacks from containers: each rank found as its container's torchrun's
    # child, held, aborted, its dump read from the job dir the container shares; the
    # rank stopped on node2 said to be stopped.
    started = gpucluster("launch", "-i", str(inventory), "-d", "--container", "--env",
                         "FAKE_HANG=1", "train.py", cwd=str(project))
    assert started.code == 0, started.stderr
    job = started.stdout.strip()
    deadline = time.monotonic() + 30
    while not (ranks := node_processes(cluster, lambda _, cmdline: b"fake-rank" in cmdline)) \
            or len(ranks) < 3:
        assert time.monotonic() < deadline, ranks
        time.sleep(0.2)
    os.kill(int(ranks["node2"][0].split()[0]), signal.SIGSTOP)
    stopped = gpucluster("stop", "-i", str(inventory), job, "--stacks", "--json",
                         "--grace", "5")
    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert stopped.json()["stacks"] == [
        {"ranks": [0, 2], "where": "hang.py line 7 in wait", "nodes": ["node1", "node3"],
         "why": None},
        {"ranks": [1], "where": None, "nodes": ["node2"], "why": "stopped"}], stopped.stdout
    left = gpucluster("run", "-i", str(inventory), "podman ps -a --format '{{.Names}}'")
    assert f"gpucluster-{job}" not in left.stdout
    assert job_processes(cluster) == {}

    # Detached, one node's container failing: that node stops the others' containers.
    started = gpucluster("launch", "-i", str(inventory), "-d", "--container", "--env",
                         "FAKE_SLEEP=300", "--env", "FAKE_FAIL_ON=node2", "train.py",
                         cwd=str(project))
    assert started.code == 0, started.stderr
    job = started.stdout.strip()
    deadline = time.monotonic() + 60
    while True:
        listed = gpucluster("jobs", "-i", str(inventory), "--json").json()["jobs"]
        nodes = next(j for j in listed if j["id"] == job)["nodes"]
        states = {name: (node["state"], node["exit_code"]) for name, node in nodes.items()}
        # stopping, or leftover: a stopped node's container still going away
        if all(state not in ("running", "stopping", "leftover")
               for state, _ in states.values()):
            break
        assert time.monotonic() < deadline, states
        time.sleep(1)
    assert states["node2"] == ("exited", 3), states
    assert {states["node1"][0], states["node3"][0]} == {"stopped"}, states
    left = gpucluster("run", "-i", str(inventory), "podman ps -a --format '{{.Names}}'")
    assert f"gpucluster-{job}" not in left.stdout, left.stdout
    assert job_processes(cluster) == {}


def test_a_job_outlives_this_machine_losing_its_network(cluster: Sandbox,
                                                         project: Path) -> None:
    """40 s without the controller's network: every node is lost at once (dropped as
    silent after 30 s). It used to end launch with `first failure: node1, unreachable`,
    its stop unable to reach any node and the job left running with nobody following
    it. Now launch asks again, follows the job on and ends with it, no line twice."""
    process = start_attached(cluster, project, "train.py", "--", "--epochs", "16",
                             "--step-delay", "0.2")
    seen = wait_for_ranks(process, 6)
    rules = [["OUTPUT", "-d", SUBNET, "-j", "DROP"], ["INPUT", "-s", SUBNET, "-j", "DROP"]]
    for rule in rules:
        subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        time.sleep(40)
    finally:
        for rule in rules:
            subprocess.run(["iptables", "-D", *rule], check=True)
    code, stdout, stderr, _ = finish(process, 240)
    assert code == 0, stderr
    assert "lost contact with every node still running the job (node[1-3]) at once" in \
        stderr, stderr
    assert re.search(r"node\[1-3\]: answering again after \d+s; following the job on",
                     stderr), stderr
    epochs = re.findall(r"^\[node1/0\] epoch (\d+) loss", "".join(seen) + stdout,
                        re.MULTILINE)
    assert epochs == [str(epoch) for epoch in range(16)], stdout
    assert "exited 0 on node[1-3]" in stderr, stderr


def test_a_node_that_dies_mid_job_stops_the_job_everywhere(cluster: Sandbox,
                                                           project: Path) -> None:
    """node3 loses power: every process in its namespace, sshd included, is killed at
    once. The job is stopped on the others and the dead node is named; `sandbox up`
    brings it back for the tests after this one."""
    process = start_attached(cluster, project, "train.py", "--", *SLOW)
    wait_for_ranks(process, 6)
    namespace = f"{NAME}-node3"
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                          text=True, check=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    try:
        code, stdout, stderr, took = finish(process, 90)
        assert code == 1, stderr
        assert "first failure: node3, unreachable (connection lost while running)" in stderr
        # Its lines came while it ran (read above, up to the ranks' ready lines): they
        # are not printed again from the copy
        assert not re.search(r"^\[node3/\d\] rank \d/6 on node3 ready$", stdout,
                             re.MULTILINE), stdout
        assert "controller's copy" not in stderr, stderr
        assert took < 45, f"took {took:.1f} s to notice the dead node"
        assert {n for n in job_processes(cluster)} <= {"node3"} and not job_processes(
            cluster).get("node3"), job_processes(cluster)
    finally:
        up = gpucluster("sandbox", "up", "--name", NAME, "--subnet", SUBNET, "--nodes", "3",
                        "--write-inventory", str(cluster.inventory), timeout=120)
        assert up.code == 0, up.stderr


def test_prune_forgets_ended_jobs_and_never_a_running_one(cluster: Sandbox,
                                                           project: Path) -> None:
    inventory = str(cluster.inventory)
    recorded = cluster.inventory.parent / ".gpucluster" / "jobs"
    ended = sorted(p.name for p in recorded.iterdir())  # every earlier test's job has ended
    assert ended
    started = gpucluster("launch", "-i", inventory, "-d", "train.py", "--", *SLOW,
                         cwd=str(project))
    assert started.code == 0, started.stderr
    running = started.stdout.strip()

    def on_nodes(directory: str) -> dict[str, set[str]]:
        return {node: set(cluster.node_exec(node, f"ls /srv/gpucluster/{directory}")
                          .stdout.split()) for node in cluster.nodes}
    try:
        young = gpucluster("prune", "-i", inventory)  # the default: older than 7 days
        assert young.code == 0 and "no ended job started more than 7d ago" in young.stderr
        listed = gpucluster("prune", "-i", inventory, "--older-than", "0", "--json")
        assert listed.code == 0, listed.stderr
        payload = json.loads(listed.stdout)
        assert sorted(j["job"] for j in payload["jobs"]) == ended
        assert payload["skipped"] == [{"job": running, "why": "running on node[1-3]"}]
        assert sorted(p.name for p in recorded.iterdir()) == sorted([*ended, running])
        checkpoints = on_nodes("checkpoints")
        # A node that does not answer cannot vouch for its jobs: they are kept.
        namespace, rule = f"{NAME}-node3", ["INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
        subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-I", *rule], check=True)
        try:
            blind = gpucluster("prune", "-i", inventory, "--older-than", "0", "--yes",
                               "--json", "--connect-timeout", "2")
        finally:
            subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-D", *rule],
                           check=True)
        on_node3 = {j for j in ended if "node3" in json.loads(
            (recorded / j / "job.json").read_text())["hosts"]}
        assert on_node3, "earlier tests ran jobs on node3"
        kept = {s["job"]: s["why"] for s in json.loads(blind.stdout)["skipped"]}
        assert all("node3 did not answer" in kept.get(j, "") for j in on_node3), kept
        assert all((recorded / j).is_dir() for j in on_node3)

        # Another cluster's inventory beside this one, the same names on other machines:
        # nothing is pruned or stopped through it.
        hosts = [dict(h) for h in cluster.data["hosts"]]
        addresses = [h["address"] for h in hosts]
        for host, address in zip(hosts, addresses[1:] + addresses[:1], strict=True):
            host["address"] = address
        other = cluster.write_inventory(cluster.inventory.parent / "other.yaml", hosts=hosts)
        through = gpucluster("prune", "-i", str(other), "--older-than", "0", "--yes", "--json")
        assert through.code == 0, through.stderr
        kept = {s["job"]: s["why"] for s in json.loads(through.stdout)["skipped"]}
        assert sorted(kept) == sorted([*ended, running]), kept
        for why in kept.values():  # the inventory each was started with: never other.yaml
            started_with = re.search(r"than other\.yaml lists \(fix: -i (\S+), the inventory "
                                     r"it was started with\)", why)
            assert started_with and Path(started_with[1]).name != "other.yaml", why
            assert Path(started_with[1]).is_file(), why
        refused = gpucluster("stop", "-i", str(other), running)
        assert refused.code == 2 and "cannot be reached through this inventory" in \
            refused.stderr, refused.stderr

        removed = gpucluster("prune", "-i", inventory, "--older-than", "0", "--yes", "--json")
        assert removed.code == 0, removed.stderr
        assert all(j["removed"] and not j["checkpoints_removed"]
                   for j in json.loads(removed.stdout)["jobs"])
        assert sorted(p.name for p in recorded.iterdir()) == [running]
        for node, left in on_nodes("jobs").items():
            assert running in left and not left & set(ended), (node, left)
        for node, kept in on_nodes("checkpoints").items():
            assert checkpoints[node] <= kept, node  # checkpoints only with --checkpoints
        jobs = gpucluster("jobs", "-i", inventory)
        assert re.search(rf"{running}.*running: node\[1-3\]", jobs.stdout), jobs.stdout
    finally:
        gpucluster("stop", "-i", inventory, running)
    # A job that ended by itself leaves its cgroup, empty (stop removes the stopped one's,
    # and a node's next start only its own earlier ones): pruning the job removes it.
    by_itself = gpucluster("launch", "-i", inventory, "--json", "--nproc-per-node", "1",
                           "train.py", "--", "--epochs", "1", cwd=str(project), timeout=180)
    assert by_itself.code == 0, by_itself.stderr
    last = by_itself.json()["job"]
    cgroups = [cluster.node_exec(node, f"cat /srv/gpucluster/jobs/{last}/{node}/cgroup")
               .stdout.strip() for node in cluster.nodes]
    assert all(cgroup and Path(cgroup).is_dir() for cgroup in cgroups), cgroups
    gone = gpucluster("prune", "-i", inventory, "--older-than", "0", "--yes", "--checkpoints")
    assert gone.code == 0, gone.stderr
    assert not any(Path(cgroup).exists() for cgroup in cgroups), cgroups
    assert re.search(rf"^job {running} .* removed$", gone.stderr, re.MULTILINE), gone.stderr
    assert not any(recorded.iterdir())
    assert not any(running in names for names in on_nodes("checkpoints").values())
    assert not any(running in names for names in on_nodes("jobs").values())
