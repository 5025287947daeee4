"""Slurm on a 3-node sandbox of its own behind a default-drop firewall: `provision
--with slurm` brings every node up idle, `srun -N3` and an exported sbatch of
examples/train.py run across them, the epilog ends only its own job's leftover GPU
process, a second run changes nothing, --dry-run shows diffs, and `--undo slurm`
leaves no daemon and no file of ours. One flow: Slurm's start is the slow part."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster import hostrange
from gpucluster.inventory import load
from tests.cli import gpucluster
from tests.sandbox import TRAIN, Sandbox, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET = "gpcslurm", "198.19.13.0/24"
# SSH in, everything else dropped: Slurm's ports must come from the firewall step.
FIREWALL = ("iptables -A INPUT -i lo -j ACCEPT; iptables -A INPUT -m conntrack --ctstate "
            "ESTABLISHED,RELATED -j ACCEPT; iptables -A INPUT -p tcp --dport 22 -j ACCEPT; "
            "iptables -P INPUT DROP")
STEPS = "hosts,firewall,ssh-mesh,slurm"  # the mesh: a requeued start fetches checkpoints
DAEMONS = ("munged", "slurmctld", "slurmd")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = start_sandbox(tmp_path_factory.mktemp("slurm") / "cluster.yaml", NAME,
                            SUBNET, 3)
    for node in sandbox.nodes:
        sandbox.node_exec(node, FIREWALL)
    try:
        yield sandbox
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def provision(cluster: Sandbox, *args: str, inventory: Path | None = None) -> dict:
    done = gpucluster("provision", "-i", str(inventory or cluster.inventory), "--only",
                      STEPS, "--json", *args, timeout=300)
    assert done.stdout.strip(), done.stderr
    report = json.loads(done.stdout)
    report["exit"] = done.code
    return report


def slurm_outcomes(report: dict) -> dict[str, str]:
    return {r["host"]: r["outcome"] for r in report["results"] if r["step"] == "slurm"}


def ranks_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if re.match(r"\[node\d/\d+\] ", line)]


def on_node1(cluster: Sandbox, command: str, timeout: int = 30) -> str:
    done = subprocess.run(cluster.node_argv("node1", ["/bin/sh", "-c", command]),
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout


def wait_until_every_node_idle(cluster: Sandbox) -> None:
    """Every node idle and answering Slurm's pings (a trailing `*` is a node not
    responding: Slurm 22.05 marks a resumed node so until its next ping comes back)."""
    wanted = [[n, "idle", "gpu:h100:8"] for n in ("node1", "node2", "node3")]
    deadline = time.monotonic() + 20
    while (states := sorted(line.split() for line in on_node1(
            cluster, "sinfo -h -N -o '%N %T %G'").splitlines())) != wanted:
        assert time.monotonic() < deadline, states
        time.sleep(0.5)


def exported_metrics(cluster: Sandbox, until: tuple[str, ...]) -> str:
    """What `gpucluster exporter` serves once all of `until` is in it (the nodes' frames
    and Slurm's queue come in threads of their own, after the first scrapes may)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "exporter", "-i", str(cluster.inventory),
         "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    try:
        deadline, text = time.monotonic() + 60, ""
        while not all(part in text for part in until):
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
            with contextlib.suppress(OSError), urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        return text
    finally:
        exporter.send_signal(signal.SIGINT)
        assert exporter.wait(timeout=20) == 0


def running_daemons(cluster: Sandbox, node: str) -> list[str]:
    """The node's own Slurm and munge daemons (its network namespace's processes)."""
    pids = subprocess.run(["ip", "netns", "pids", f"{cluster.name}-{node}"],
                          capture_output=True, text=True, check=True).stdout.split()
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    return sorted(names & set(DAEMONS))


# Per process holding a (simulated) GPU: whether it carries LOCAL_RANK=1 (1) or not (0).
GPU_PROCESSES_WITH_RANK_1 = (
    "nvidia-smi --query-compute-apps=pid --format=csv,noheader | while read p; do "
    "tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -c LOCAL_RANK=1; done; true")


def test_provision_with_slurm_runs_jobs_across_the_nodes_and_undoes(
        cluster: Sandbox, tmp_path: Path) -> None:
    first = provision(cluster, "--with", "slurm")
    assert first["exit"] == 0, first["results"]
    assert set(slurm_outcomes(first).values()) == {"changed"}

    # Every node idle (once provision's own srun has completed), the GPUs counted from
    # their device files; srun answered by all.
    wait_until_every_node_idle(cluster)
    assert sorted(on_node1(cluster, "srun -N3 hostname -s").split()) == cluster.nodes
    # doctor names a node Slurm will not use, with Slurm's reason.
    on_node1(cluster, "scontrol update nodename=node3 state=drain reason='bad GPU 3'")
    outside = tmp_path / "outside-the-queue"
    outside.mkdir()
    (outside / "hello.py").write_text("print('hello')\n")
    try:
        checked = gpucluster("doctor", "-i", str(cluster.inventory), "--json", "--only",
                             "slurm")
        launched = gpucluster("launch", "-i", str(cluster.inventory), "-C", str(outside),
                              "hello.py", timeout=120)
    finally:
        on_node1(cluster, "scontrol update nodename=node3 state=resume")
    wait_until_every_node_idle(cluster)
    found = {r["host"]: r for r in checked.json()["results"]}
    assert [found[n]["status"] for n in cluster.nodes] == ["OK", "OK", "WARN"], found
    assert found["node3"]["message"] == "Slurm has it drained: bad GPU 3"
    # A job launched outside the queue starts, warned about the nodes Slurm could still
    # start jobs on (node3 drained: Slurm starts nothing there).
    assert launched.code == 0, launched.stderr
    assert "warning: node[1-2] in Slurm's queue: Slurm may start its jobs on the GPUs " \
           "this job uses outside it" in launched.stderr, launched.stderr
    assert "scontrol update nodename=node[1-2] state=drain" in launched.stderr
    # bundle takes Slurm's view of the cluster and the node's slurmd log.
    archive = tmp_path / "bundle.tar.gz"
    bundled = gpucluster("bundle", "-i", str(cluster.inventory), "-w", "node1", "-o",
                         str(archive))
    assert bundled.code == 0, bundled.stderr
    # No job asked for: the line after says how to add the one just run.
    hello = re.search(r"starting job (\S+) ", launched.stderr)[1]  # type: ignore[index]
    assert bundled.stderr.endswith("no job's logs in it; gpucluster bundle last adds those of "
                                   f"the newest job, {hello}\n"), bundled.stderr
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("node1/slurm.txt"))
        slurm_txt = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
        summary_md = tar.extractfile(next(  # type: ignore[union-attr]
            m for m in tar.getmembers() if m.name.endswith("SUMMARY.md"))).read().decode()
    assert "node2|idle|none" in slurm_txt and "node2 gpu:h100:8" in slurm_txt, slurm_txt
    assert "slurmd version" in slurm_txt, slurm_txt
    # SUMMARY.md reads the state from that listing with doctor's own parser.
    assert "Every node sinfo lists is healthy (3 nodes)." in summary_md, summary_md
    # Slurm's ports were opened by the firewall step, to peers only.
    rules = cluster.node_exec("node2", "iptables -S INPUT").stdout
    assert f"-s {cluster.addresses['node1']}/32 -p tcp -m multiport --dports " \
           f"29500,6817,6818,61000:61999," in rules
    assert f"-s {cluster.addresses['node2']}/32" not in rules
    # A provision without --with slurm keeps them: Slurm is set up from here (it used
    # to close them under the running daemons).
    kept = gpucluster("provision", "-i", str(cluster.inventory), "--only", "firewall",
                      "--json", timeout=120)
    assert {r["outcome"] for r in kept.json()["results"]} == {"already ok"}, kept.stdout
    assert cluster.node_exec("node2", "iptables -S INPUT").stdout == rules
    # One munge key, the cluster's, 0400 munge:munge on every node.
    key = (cluster.inventory.parent / ".gpucluster" / "slurm" / "munge.key").read_bytes()
    for node in cluster.nodes:
        mode, _, sha = cluster.node_exec(node, "stat -c '%a %U' /etc/munge/munge.key; "
                                               "sha256sum < /etc/munge/munge.key"
                                         ).stdout.partition("\n")
        assert mode.strip() == "400 munge" and sha.split()[0] == hashlib.sha256(
            key).hexdigest()

    # The exported sbatch script, submitted by export itself, runs examples/train.py on
    # every node, even where a node cannot resolve the first one's name (its ranks hung
    # for good before).
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_bytes(TRAIN.read_bytes())
    script = tmp_path / "train.sbatch"
    for node in ("node2", "node3"):
        cluster.node_exec(node, "cp -p /etc/hosts /etc/hosts.gpc-test && "
                                "grep -v -w node1 /etc/hosts.gpc-test > /etc/hosts")
    try:
        assert cluster.node_exec("node2", "getent hosts node1", check=False).returncode != 0
        exported = gpucluster("export", "sbatch", "-i", str(cluster.inventory), "train.py",
                              "-o", str(script), "--follow", "--", "--epochs", "2",
                              "--steps", "5", cwd=str(project), timeout=300)
        assert exported.code == 0, exported.stdout + exported.stderr
        assert "synced: 1 sent" in exported.stderr
        assert script.read_text().startswith("#!/bin/bash\n")  # -o writes it too
        job, _, output = exported.stdout.partition("\n")  # the job ID, then its output
        found = re.search(r"submitted batch job (\d+) on node1; its output: (\S+) on",
                          exported.stderr)
        assert found and found[1] == job, exported.stderr
        assert f"Slurm job {job} completed" in exported.stderr
        written = on_node1(cluster, f"cat {found[2]}")
    finally:
        for node in ("node2", "node3"):
            cluster.node_exec(node, "cat /etc/hosts.gpc-test > /etc/hosts && "
                                    "rm /etc/hosts.gpc-test")
    # The file has each line behind srun's label and torchrun's rank; shown, behind the
    # node (the task's own word for it) and the rank, as launch shows a job's lines.
    assert re.search(r"^\d: \[0\]:done$", written, re.MULTILINE), written
    assert re.search(r"^0: gpucluster: node\d is task 0$", written, re.MULTILINE), written
    for rank in range(3):
        ready = re.search(rf"^\[(node\d)/{rank}\] rank {rank}/3 on (node\d) ready$", output,
                          re.MULTILINE)
        assert ready and ready[1] == ready[2], output
    assert re.search(r"^\[node\d/0\] done$", output, re.MULTILINE), output
    assert " is task " not in output
    # --debug: launch's diagnostics on every rank, their directories in the job's dir.
    (project / "fails.py").write_text(
        "import os, sys\nprint('failing', os.environ.get('NCCL_DEBUG'), "
        "os.environ.get('TORCH_DISTRIBUTED_DEBUG'), flush=True)\nsys.exit(3)\n")
    failed = gpucluster("export", "sbatch", "-i", str(cluster.inventory), "-N", "1",
                        "--debug", "--follow", "fails.py", cwd=str(project), timeout=120)
    assert failed.code == 1 and "failing INFO INFO" in failed.stdout, \
        failed.stdout + failed.stderr
    assert re.search(r"Slurm job \d+ failed \(exit 1:0\)\nfirst failure: rank 0 on node\d, "
                     r"worker exit code 3\n", failed.stderr), failed.stderr
    # bundle slurm-ID: Slurm's record, the output's end, torchrun's root cause, its node.
    failed_id = re.search(r"submitted batch job (\d+)", failed.stderr)[1]  # type: ignore[index]
    # jobs lists it, ended, while Slurm keeps it (it left squeue's default listing at once)
    listed = gpucluster("jobs", "-i", str(cluster.inventory), "--json")
    ended = {j["id"]: j for j in listed.json()["slurm"]}[failed_id]
    assert (ended["state"], ended["where"]) == ("FAILED", "(NonZeroExitCode)"), ended
    listed = gpucluster("jobs", "-i", str(cluster.inventory))
    assert f"slurm-{failed_id} failed (NonZeroExitCode): gpucluster logs slurm-{failed_id} " \
           f"shows its output" in listed.stdout, listed.stdout
    archive = tmp_path / "failed.tar.gz"
    bundled = gpucluster("bundle", "-i", str(cluster.inventory), f"slurm-{failed_id}", "-o",
                         str(archive))
    assert bundled.code == 0, bundled.stderr
    with tarfile.open(archive) as tar:
        files = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        summary_md = tar.extractfile(files["SUMMARY.md"]).read().decode()  # type: ignore[union-attr]
        ran = tar.extractfile(files["slurm-job/output.log"]).read()  # type: ignore[union-attr]
    assert f"## Slurm job {failed_id}\n\nfailed (exit 1:0) on node" in summary_md, summary_md
    assert re.search(r"\*\*First failure: node\d, rank 0\*\* \(exited, worker exit 3\)\.\n\n"
                     r"Its last lines:\n\n```\nfailing INFO INFO\n```", summary_md), summary_md
    assert b"failing INFO INFO\n" in ran and "slurm-job/scontrol.txt" in files
    assert len({name.split("/")[1] for name in files if name.startswith("nodes/")}) == 1
    # logs slurm-ID shows an ended job's output again, and how it ended.
    shown = gpucluster("logs", "-i", str(cluster.inventory), f"slurm-{job}")
    assert shown.code == 0 and ranks_lines(shown.stdout) == ranks_lines(output), \
        shown.stdout + shown.stderr  # (live, a backtrace of torchrun's would be folded)
    assert f"Slurm job {job} completed" in shown.stderr
    last = gpucluster("logs", "-i", str(cluster.inventory), f"slurm-{job}", "-n", "2")
    assert last.code == 0 and \
        last.stdout == "".join(shown.stdout.splitlines(keepends=True)[-2:]), last.stdout
    searched = gpucluster("logs", "-i", str(cluster.inventory), f"slurm-{job}", "--rank", "1",
                          "--grep", "ready")
    assert searched.code == 0 and re.fullmatch(r"\[(node\d)/1\] rank 1/3 on \1 ready\n",
                                               searched.stdout), searched.stdout
    # Slurm requeues a job (as it does when one of its nodes fails), here onto a node
    # the first start did not have: the output of both starts is kept, the new node
    # fetches the checkpoints from one that has them, and the second start resumes from
    # them as attempt 2.
    submitted = gpucluster("export", "sbatch", "-i", str(cluster.inventory), "train.py",
                           "--nodes", "2", "--submit", "--", "--epochs", "20", "--steps",
                           "5", "--step-delay", "0.1", cwd=str(project), timeout=120)
    assert submitted.code == 0, submitted.stderr
    requeued = submitted.stdout.strip()
    output_file = re.search(r"its output: (\S+) on", submitted.stderr)[1]  # type: ignore[index]
    deadline = time.monotonic() + 90
    while "epoch 3 " not in on_node1(cluster, f"cat {output_file} 2>/dev/null; true"):
        assert time.monotonic() < deadline, on_node1(cluster, f"squeue; cat {output_file}")
        time.sleep(0.5)
    first_nodes = hostrange.expand_list(on_node1(cluster, f"squeue -h -j {requeued} -o %N"
                                                 ).strip())
    assert len(first_nodes) == 2, first_nodes
    kept, lost = first_nodes
    new_nodes = [n for n in cluster.nodes if n != lost]
    joined = next(n for n in new_nodes if n not in first_nodes)
    # Slurm holds a requeued job back for 120 s (cred_expire): started at once here, and
    # kept off one of its nodes, as if that one had been lost.
    on_node1(cluster, f"scontrol requeue {requeued} && until squeue -h -j {requeued} -o %T "
                      f"| grep -qx PENDING; do sleep 0.5; done && scontrol update "
                      f"jobid={requeued} StartTime=now ExcNodeList={lost}", timeout=60)
    followed = gpucluster("logs", "-f", "-i", str(cluster.inventory), f"slurm-{requeued}",
                          timeout=180)
    assert followed.code == 0, followed.stdout + followed.stderr
    now_on = hostrange.fold(new_nodes)
    assert f"Slurm job {requeued}: running on {now_on}, start 2 after a requeue" in \
        followed.stderr, followed.stderr
    first, marker, second = followed.stdout.partition(
        f"gpucluster: Slurm job {requeued} requeued: start 2, on {now_on}, ")
    assert marker and "epoch 3 " in first and "rank 0/2" in first, followed.stdout
    assert f"gpucluster: {joined}: fetched Slurm job {requeued}'s checkpoints from {kept}" \
        in second, second
    assert re.search(r"resumed from epoch \d+ \(attempt 2\)", second), second
    assert "epoch 0 " not in second and "done" in second, second
    # Followed with -w: the node's own lines only, labelled by the word its task said.
    joined_only = gpucluster("logs", "-f", "-w", joined, "-i", str(cluster.inventory),
                             f"slurm-{requeued}", timeout=180)
    assert joined_only.code == 0 and joined_only.stdout, joined_only.stderr
    assert all(line.startswith((f"[{joined}/", f"[{joined}] "))
               for line in joined_only.stdout.splitlines()), joined_only.stdout

    # The epilog ends the job's leftover GPU process (escaped from the job's process
    # tree), never one of another's.
    quiet = "</dev/null >/dev/null 2>&1"
    cluster.node_exec("node2", f"LOCAL_RANK=1 setsid -f sleep 600 {quiet}")
    on_node1(cluster, f"sbatch --wait -w node2 -N1 -o /dev/null --wrap "
                      f"'LOCAL_RANK=0 setsid -f sleep 600 {quiet}; sleep 1' >/dev/null",
             timeout=120)
    # The epilog runs while the job completes, which sbatch --wait can report first.
    deadline = time.monotonic() + 30
    while (left := cluster.node_exec("node2", GPU_PROCESSES_WITH_RANK_1).stdout.split()) \
            != ["1"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == ["1"], left  # the foreign one is the only one left
    cluster.node_exec("node2", "kill $(nvidia-smi --query-compute-apps=pid "
                               "--format=csv,noheader)", check=False)

    # stacks slurm-ID: the job's rank (a RANK its parent lacks) read by py-spy on the node
    # Slurm runs it on, the job left running.
    spied = on_node1(cluster, f"sbatch --parsable -w node3 -N1 -o /dev/null --wrap 'RANK=0 "
                              f"exec {sys.executable} -c \"import time; time.sleep(600)\"'"
                     ).strip().split(";")[0]
    deadline = time.monotonic() + 60
    while (looked := gpucluster("stacks", "-i", str(cluster.inventory), f"slurm-{spied}",
                                "--json")).code != 0:
        assert time.monotonic() < deadline, looked.stdout + looked.stderr  # pending, starting
        time.sleep(1)
    assert looked.json()["stacks"] == [{"ranks": [0], "where": "<string> line 1 in <module>",
                                        "nodes": ["node3"], "why": None}], looked.stdout
    assert on_node1(cluster, f"squeue -h -j {spied} -o %T").strip() == "RUNNING"
    assert gpucluster("stop", "-i", str(cluster.inventory), f"slurm-{spied}").code == 0

    # reap tells Slurm's jobs apart: a running one's GPU process is never ended, even with
    # --foreign (it was "foreign" before); one whose job Slurm no longer has is a leftover.
    running = on_node1(cluster, "sbatch --parsable -w node2 -N1 -o /dev/null --wrap "
                                "'LOCAL_RANK=2 exec sleep 600'").strip().split(";")[0]
    cluster.node_exec("node2", f"SLURM_JOB_ID=99999 LOCAL_RANK=3 setsid -f sleep 600 {quiet}")
    deadline = time.monotonic() + 30
    while len(cluster.node_exec("node2", GPU_PROCESSES_WITH_RANK_1).stdout.split()) < 2:
        assert time.monotonic() < deadline, "the Slurm job's process did not show"
        time.sleep(0.5)
    # doctor (and so launch's refusal) says whose they are, never `kill` for Slurm's job.
    checked = gpucluster("doctor", "-i", str(cluster.inventory), "-w", "node2", "--json",
                         "--only", "gpu-processes")
    finding = next(r for r in checked.json()["results"] if r["check"] == "gpu-processes")
    assert f"GPUs held by Slurm job {running} (1 process)" in finding["message"], finding
    assert "leftovers of Slurm job 99999 (Slurm has ended it)" in finding["message"]
    assert f"gpucluster stop slurm-{running}" in finding["remedy"] and \
        "reap --yes" in finding["remedy"]
    reaped = gpucluster("reap", "-i", str(cluster.inventory), "-w", "node2", "--yes",
                        "--foreign", "--grace", "2", "--json")
    held = {p["slurm_job"]: p for p in reaped.json()["nodes"][0]["processes"]}
    assert (held[running]["owner"], held[running]["ended"]) == ("slurm", False), held
    assert (held["99999"]["owner"], held["99999"]["ended"]) == ("leftover", True), held
    # The exporter serves Slurm's queue, the job joining its GPU's series by id.
    metrics = exported_metrics(cluster, until=(
        f'slurm_job_id="{running}",state="RUNNING"', 'slurm_job_info{Hostname="node2"'))
    assert "gpucluster_slurm_up 1.0" in metrics, metrics
    assert 'gpucluster_slurm_jobs{state="RUNNING"} 1.0' in metrics, metrics
    assert 'gpucluster_slurm_jobs{state="PENDING"} 0.0' in metrics, metrics
    assert f'gpucluster_slurm_job_nodes{{name="wrap",slurm_job_id="{running}",' \
           f'state="RUNNING",user="root"}} 1.0' in metrics, metrics
    assert re.search(rf'gpucluster_gpu_slurm_job_info{{Hostname="node2",UUID="[^"]+",'
                     rf'gpu="\d+",slurm_job_id="{running}"}} 1.0', metrics), metrics
    # ...and its GPU's DCGM series carry it as hpc_job, as DCGM exporter's job mapping.
    assert re.search(rf'DCGM_FI_DEV_GPU_UTIL{{Hostname="node2",[^}}]*hpc_job="{running}"',
                     metrics), metrics
    # top sums the queue up beside the GPUs.
    topped = gpucluster("top", "-i", str(cluster.inventory), "--once", "--json")
    assert topped.code == 0, topped.stderr
    assert topped.json()["slurm"] == {"up": True, "error": None,
                                      "jobs": {"PENDING": 0, "RUNNING": 1}}, topped.stdout
    itself = gpucluster("top", "-i", str(cluster.inventory), "--once", "--json", "-j",
                        f"slurm-{running}")  # only the job's node
    assert itself.code == 0 and [n["host"] for n in itself.json()["nodes"]] == ["node2"], \
        itself.stdout + itself.stderr
    # jobs lists Slurm's queue; stop slurm-ID cancels the job and waits for its end.
    listed = gpucluster("jobs", "-i", str(cluster.inventory), "--json")
    queued = {j["id"]: j for j in listed.json()["slurm"]}
    assert (queued[running]["state"], queued[running]["where"]) == ("RUNNING", "node2"), \
        queued
    stopped = gpucluster("stop", "-i", str(cluster.inventory), f"slurm-{running}")
    assert stopped.code == 0, stopped.stderr
    assert stopped.stdout.startswith(f"Slurm job {running} cancelled: cancelled"), \
        stopped.stdout
    assert on_node1(cluster, f"squeue -h -j {running}").strip() == ""
    # prune takes the files exported jobs left on their nodes once Slurm has ended them.
    jobs_dir = f"{load(cluster.inventory).cluster.work_dir}/jobs"
    assert f"slurm-{job}" in on_node1(cluster, f"ls {jobs_dir}").split()
    pruned = gpucluster("prune", "-i", str(cluster.inventory), "--older-than", "0", "--yes",
                        "--json")
    assert pruned.code == 0, pruned.stdout + pruned.stderr
    gone = {j["job"] for j in pruned.json()["slurm"]["jobs"] if j["removed"]}
    assert {job, failed_id} <= gone, pruned.stdout
    for node in cluster.nodes:
        left = cluster.node_exec(node, f"ls {jobs_dir} 2>/dev/null", check=False).stdout
        assert "slurm-" not in left, (node, left)

    # A second run changes nothing; a changed setting shows as a diff, changing nothing.
    again = provision(cluster, "--with", "slurm")
    assert again["exit"] == 0 and set(slurm_outcomes(again).values()) == {"already ok"}
    # A slurmd killed outright leaves its pid file, and a zombie until the node's init
    # reaps it: the next run takes it for down, not for a daemon, and starts it again.
    cluster.node_exec("node3", "kill -KILL $(cat /run/slurm/slurmd.pid)")
    revived = provision(cluster, "--with", "slurm")
    assert slurm_outcomes(revived) == {"node1": "already ok", "node2": "already ok",
                                       "node3": "changed"}, revived
    assert "slurmd" in running_daemons(cluster, "node3")
    # Beside the inventory: the same state directory, so the same munge key.
    renamed = cluster.write_inventory(cluster.inventory.parent / "renamed.yaml",
                                      slurm={**cluster.data["slurm"], "partition": "train"})
    planned = provision(cluster, "--with", "slurm", "--dry-run", inventory=renamed)
    changes = [c for r in planned["results"] if r["step"] == "slurm" for c in r["changes"]]
    assert [c["summary"] for c in changes] == ["write /etc/slurm/slurm.conf"]
    assert "+PartitionName=train" in changes[0]["detail"]
    assert "PartitionName=gpu " in on_node1(cluster, "cat /etc/slurm/slurm.conf")

    # --undo slurm: no daemon left, none of our files.
    undone = gpucluster("provision", "-i", str(cluster.inventory), "--undo", "slurm")
    assert undone.code == 0, undone.stdout + undone.stderr
    time.sleep(0.5)
    for node in cluster.nodes:
        assert running_daemons(cluster, node) == [], node
        present = cluster.node_exec(node, "ls /etc/slurm/slurm.conf /etc/slurm/gres.conf "
                                          "/etc/slurm/gpucluster-epilog.sh /etc/munge/munge.key "
                                          "/var/lib/slurm/slurmd/conf-cache 2>/dev/null",
                                    check=False).stdout
        assert present == "", f"{node}: {present}"
    # ...nor the controller's record of it: the queue is not asked for, and the next
    # provision closes Slurm's ports.
    assert not (cluster.inventory.parent / ".gpucluster" / "slurm" / "munge.key").exists()
    listed = gpucluster("jobs", "-i", str(cluster.inventory))
    assert listed.code == 0 and "Slurm" not in listed.stdout + listed.stderr, listed.stderr
    closed = gpucluster("provision", "-i", str(cluster.inventory), "--only", "firewall",
                        "--json", timeout=120)
    assert {r["outcome"] for r in closed.json()["results"]} == {"changed"}, closed.stdout
    assert "6817" not in cluster.node_exec("node2", "iptables -S INPUT").stdout
