"""A job started on this machine by the real start script, as node1 (`connection:
local`), with stand-ins for torchrun and its workers: what the node scripts that find,
read and stop a job's processes are tried against in unit tests."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpucluster import inventory as inventory_module
from gpucluster.launch import node_scripts
from gpucluster.launch.jobs import JobRecord


def job_record() -> JobRecord:
    """A job of two nodes, its arguments and dirs such as a shell must quote."""
    return JobRecord("20261129-120000-abcd", "train.py", ["--lr", "0.1; rm -rf /"],
                     ["node1", "node-2"], "\"$HOME\"/'gpucluster/my proj'",
                     "\"$HOME\"/'gpucluster/jobs'", 0.0, {"node1": 2, "node-2": 2})


def wait_for(done: Callable[[], bool], limit_s: float = 15) -> None:
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


# torchrun as it stops: TERM is passed on to the worker's process group (a session of its
# own), which it waits for; the worker notes each TERM, then "saves" for a second.
WORKER_STAND_IN = """
import os, signal, sys, time
def term(*_):
    with open("terms", "a") as out: out.write("TERM\\n")
    time.sleep(1)
    with open("terms", "a") as out: out.write("saved\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
with open("worker.pid", "w") as out: out.write(str(os.getpid()))
open("ready", "w").close()
time.sleep(60)
"""
TORCHRUN_STAND_IN = """
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "worker.py"], start_new_session=True)
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
while worker.poll() is None and not stopping:
    time.sleep(0.05)
os.killpg(worker.pid, signal.SIGTERM)
worker.wait(10)
sys.exit(143)
"""


# torchrun as far as a stop with --stacks needs it: the worker's rank in its environment,
# its stderr in a file of torchrun's --log-dir by local rank.
LOGGING_TORCHRUN_STAND_IN = """
import os, subprocess, sys
logs = os.path.join(os.environ["GPC_JOB_DIR"], "torchrun", "j_x", "attempt_0", "0")
os.makedirs(logs)
with open(os.path.join(logs, "stderr.log"), "w") as stderr:
    worker = subprocess.Popen([sys.executable, "worker.py"], start_new_session=True,
                              stderr=stderr, env={**os.environ, "RANK": "3", "LOCAL_RANK": "0"})
sys.exit(1 if worker.wait() else 0)
"""


@contextlib.contextmanager
def local_job(tmp_path: Path, torchrun: str = TORCHRUN_STAND_IN
                        ) -> Iterator[tuple[inventory_module.Inventory, JobRecord]]:
    """A job started on this machine as node1 (`connection: local`) by the real start
    script: the torchrun stand-in and its worker, which saves for a second on TERM.
    Yields once the worker is ready."""
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts:\n  - {name: node1, address: 127.0.0.1, connection: local}\n")
    record = dataclasses.replace(job_record(), hosts=["node1"], nproc_per_node={"node1": 1},
                                 jobs_dir=shlex.quote(str(tmp_path / "jobs")),
                                 code_dir=shlex.quote(str(tmp_path)))
    (tmp_path / "worker.py").write_text(WORKER_STAND_IN)
    (tmp_path / "torchrun.py").write_text(torchrun)
    start = node_scripts.start_script(record, "node1", f"{sys.executable} torchrun.py",
                                      "", False, None)
    ran = subprocess.run(["sh", "-c", start], capture_output=True, text=True, timeout=20,
                         check=True)
    leader = int(ran.stdout.split("@@gpc started ")[1].split()[0])
    try:
        wait_for((tmp_path / "ready").exists)
        yield inventory_module.load(inventory), record
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, 9)
        # in a session of its own: a test failing before its stop left it holding node1's
        # marker for a minute, and the next tests' starts found node1 busy
        pids = (tmp_path / "worker.pid").read_text().split() \
            if (tmp_path / "worker.pid").exists() else []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        for cgroup in (tmp_path / "jobs").glob("*/*/cgroup"):  # made where root runs it
            with contextlib.suppress(OSError):
                Path(cgroup.read_text().strip()).rmdir()
