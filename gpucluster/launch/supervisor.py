"""`launch --detach --recover`: recovery needs someone to watch, so the controller runs
the attached `launch --recover` as a process of its own, out of the terminal's session,
logging to the state dir. It leaves its pid in each attempt's job dir: `jobs` shows it,
`stop` ends it (SIGINT, as Ctrl-C would: it stops the attempt it runs) before stopping
the job on the nodes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from gpucluster.errors import GpuclusterError
from gpucluster.launch.jobs import JobStore
from gpucluster.lossy_output import UNWATCHED
from gpucluster.procfs import gone

PID_FILE = "supervisor.pid"
DETACH_FLAGS = ("--detach", "-d")
FIRST_ATTEMPT_S = 300.0  # how long `launch -d --recover` waits for attempt 1 to start
_FIRST_JOB = re.compile(r"attempt 1: job (\S+) on ")


def supervised_argv(argv: list[str]) -> list[str]:
    """The same launch command line, attached: the supervisor follows the job itself."""
    if "--" in argv:
        split = argv.index("--")
        return [a for a in argv[:split] if a not in DETACH_FLAGS] + argv[split:]
    return [a for a in argv if a not in DETACH_FLAGS]


def spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The supervisor, in a session of its own (the terminal's Ctrl-C and hangup do not
    reach it), writing everything to `log`."""
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with log.open("ab") as out:
        # Its log filling the disk must not end it (the job would go unwatched).
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env={**os.environ, UNWATCHED: "1"})


def wait_for_first_job(process: subprocess.Popen[bytes], log: Path) -> str:
    """The first attempt's job id, once the supervisor has started it."""
    deadline = time.monotonic() + FIRST_ATTEMPT_S
    while time.monotonic() < deadline:
        found = _FIRST_JOB.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise GpuclusterError(f"the recovery supervisor ended before the job started "
                                  f"(exit {process.returncode}): {' | '.join(tail)} "
                                  f"(log: {log})")
        time.sleep(0.2)
    raise GpuclusterError(f"the job did not start within {FIRST_ATTEMPT_S:g}s (the "
                          f"supervisor, pid {process.pid}, goes on; log: {log})")


def record_pid(store: JobStore, job_id: str, pid: int) -> None:
    (store.directory(job_id) / PID_FILE).write_text(f"{pid}\n")


def supervisor_of(store: JobStore, job_id: str) -> int | None:
    """The live supervisor of a job, if it has one (a pid since reused is not it)."""
    try:
        pid = int((store.directory(job_id) / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"launch" in cmdline and b"--recover" in cmdline else None


def end(pid: int, limit_s: float) -> bool:
    """SIGINT, as Ctrl-C: the supervisor stops the attempt it runs, then exits. True
    when it is gone within `limit_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.2)
    return False
