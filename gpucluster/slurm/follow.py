"""`export sbatch --follow` and `logs -f slurm-ID`: a Slurm job's output as it is
written, from the node that runs its batch step, until Slurm says the job has ended; then
how it ended. Polled, each poll one short command with its own time limit."""

from __future__ import annotations

import base64
import binascii
import codecs
import dataclasses
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpucluster import hostrange
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.remote.connection import Connection
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session
from gpucluster.slurm.output_lines import TASK_LINE_ERE
from gpucluster.slurm.submit import submit_host
from gpucluster.slurm_states import ENDED_JOB_STATES

POLL_S = 2.0
POLL_TIMEOUT_S = 30.0
UNANSWERED_LIMIT_S = 120.0  # scontrol failing this long (not: no such job) ends following
FORGOTTEN = "Invalid job id"  # scontrol, of a job Slurm no longer keeps
CHUNK_BYTES = 4 << 20  # read per poll at most: a job that floods its output is caught up
TASK_LINES = 4096  # the tasks' words of their node read before a tail: nodes x starts


@dataclass(frozen=True)
class JobInfo:
    state: str  # COMPLETED, FAILED, RUNNING...; "" once Slurm has forgotten the job

    @property
    def ended(self) -> bool:
        return self.state == "" or self.state in ENDED_JOB_STATES
    batch_host: str
    stdout: str
    exit_code: str  # CODE:SIGNAL
    reason: str = ""  # why it waits (Resources, Priority...), else None
    nodes: str = ""  # Slurm's NodeList, once it runs
    restarts: int = 0  # how often Slurm has requeued it (a node failed, scontrol requeue)

    @property
    def status(self) -> str:
        """`pending (Resources)`, `running on node[1-3]`: what a user waits for."""
        waiting = f" ({self.reason})" if self.reason not in ("", "None") else ""
        where = f" on {self.nodes}" if self.nodes not in ("", "(null)") and \
            self.state != "PENDING" else ""
        again = f", start {self.restarts + 1} after a requeue" if self.restarts else ""
        return f"{self.state.lower()}{where}{waiting}{again}"


def parse_job(text: str) -> JobInfo:
    """`scontrol show job [-o] ID`: KEY=VALUE words, on one line with -o (bundle keeps
    the readable lines, which split the same)."""
    fields = dict(word.partition("=")[::2] for word in text.split() if "=" in word)
    restarts = fields.get("Restarts", "0")
    return JobInfo(fields.get("JobState", ""), fields.get("BatchHost", ""),
                   fields.get("StdOut", ""), fields.get("ExitCode", ""),
                   fields.get("Reason", ""), fields.get("NodeList", ""),
                   int(restarts) if restarts.isdigit() else 0)


def unknown_job(job_id: str, then: str) -> GpuclusterError:
    """The error for a job scontrol does not know; `then`: what to do, or where its
    output stays."""
    return GpuclusterError(f"Slurm does not know job {job_id}: it forgets an ended job "
                           f"after MinJobAge, 300 s by default ({then})")


def running_nodes(session: Session, job_id: str, fix: str) -> list[str]:
    """The nodes Slurm runs the job on; a job not running is one line saying so, with
    `fix`."""
    info = job_info(session.connection(submit_host(session.inventory)), job_id)
    if isinstance(info, str):
        raise GpuclusterError(f"Slurm job {job_id}: scontrol did not answer: {info} (fix: "
                              f"try again; squeue -j {job_id} on a node shows it)")
    if info.state == "":
        raise unknown_job(job_id, "fix: gpucluster jobs lists Slurm's queue")
    if info.state != "RUNNING" or not info.nodes:
        raise GpuclusterError(f"Slurm job {job_id} is {info.status}: it runs on no node "
                              f"now (fix: {fix})")
    return hostrange.expand_list(info.nodes)


def job_info(connection: Connection, job_id: str) -> JobInfo | str:
    """The job as scontrol shows it (state "" once Slurm has forgotten it), or
    scontrol's complaint where it did not answer (slurmctld busy or restarting)."""
    try:
        shown = connection.run(f"scontrol show job -o {shlex.quote(job_id)}", POLL_TIMEOUT_S)
    except RemoteError as error:
        raise GpuclusterError(f"{connection.host}: lost while asking about Slurm job "
                              f"{job_id}: {error.message} (the job goes on: squeue -j "
                              f"{job_id} on a node shows it)") from None
    if shown.ok:
        return parse_job(shown.stdout)
    if FORGOTTEN in shown.stderr:
        return JobInfo("", "", "", "")
    return shown.last_word[-200:]  # a line: scontrol's last word says why


def follow(session: Session, inventory: Inventory, job_id: str,
           on_output: Callable[[str], None],
           on_status: Callable[[str], None] = lambda status: None,
           live: bool = True, tail: int | None = None) -> JobInfo:
    """Stream the job's output to `on_output` until it ends (or, not `live`, what it has
    written so far), from its last `tail` lines when given (after the lines before them
    where the job's tasks said their node, which output_lines takes and does not show),
    and each change of its state to `on_status` while it has not ended; its last
    JobInfo."""
    controller = session.connection(submit_host(inventory))
    by_name = {host.name: host for host in inventory.hosts}
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset, last = 0, JobInfo("", "", "", "")
    unanswered_since: float | None = None  # when scontrol began failing
    while True:
        info = job_info(controller, job_id)
        if isinstance(info, str):
            unanswered_since = unanswered_since or time.monotonic()
            if time.monotonic() - unanswered_since >= UNANSWERED_LIMIT_S:
                raise GpuclusterError(
                    f"{controller.host}: scontrol has not answered for "
                    f"{UNANSWERED_LIMIT_S:g} s: {info} (is slurmctld running? the job may "
                    f"go on: squeue -j {job_id} on a node)")
            time.sleep(POLL_S)
            continue
        unanswered_since = None
        if info.state == "":  # forgotten: where its output was is still known
            info = dataclasses.replace(last, state="", reason="", nodes="")
        if live and not info.ended and info.status != last.status:
            on_status(info.status)
        host = by_name.get(info.batch_host)
        if tail is not None and host is not None and info.stdout:
            start = _last_lines_at(session, host, info.stdout, tail)
            if start is not None:  # else not written yet: the next poll asks again
                (offset, tasks), tail = start, None
                on_output(tasks)
        while host is not None and info.stdout and tail is None:  # what the node has written since
            chunk = _read_from(session, host, info.stdout, offset)
            offset += len(chunk)
            on_output(decoder.decode(chunk))
            if len(chunk) < CHUNK_BYTES:
                break
        last = info
        if info.ended or not live:
            on_output(decoder.decode(b"", final=True))
            return info
        time.sleep(POLL_S)


def _last_lines_at(session: Session, host: Host, path: str, lines: int
                   ) -> tuple[int, str] | None:
    """Where the file's last `lines` lines begin (measured in one shell, so that a line
    written meanwhile cannot shift it), and the lines before there where the job's
    tasks said their node (the last TASK_LINES of them); None while it cannot be read."""
    quoted = shlex.quote(path)
    try:
        done = session.connection(host).run(
            f"[ -r {quoted} ] || exit 3; size=$(wc -c < {quoted}); "
            f"start=$(( size - $(head -c \"$size\" {quoted} | tail -n {lines} | wc -c) )); "
            f"echo \"$start\"; head -c \"$start\" {quoted} | "
            f"grep -a -E {shlex.quote(TASK_LINE_ERE)} | tail -n {TASK_LINES}",
            POLL_TIMEOUT_S)
    except RemoteError:
        return None
    start, _, tasks = done.stdout.partition("\n")
    return (int(start), tasks) if done.ok and start.strip().isdigit() else None


def _read_from(session: Session, host: Host, path: str, offset: int) -> bytes:
    """The file's bytes from `offset` (at most CHUNK_BYTES); none while it is not there
    yet or the node does not answer (the next poll tries again)."""
    try:
        return file_bytes(session, host, path, f"+{offset + 1}", CHUNK_BYTES)
    except (RemoteError, GpuclusterError):
        return b""


def file_bytes(session: Session, host: Host, path: str, window: str,
               limit: int | None = None) -> bytes:
    """`tail -c WINDOW` of a file on `host` (`+N`: from its byte N; `N`: its last N
    bytes), `limit` bytes at most, byte for byte: base64 on the wire, since a command's
    output comes back as text. RemoteError where the node does not answer;
    GpuclusterError where the file cannot be read."""
    quoted = shlex.quote(path)
    head = f" | head -c {limit}" if limit else ""
    done = session.connection(host).run(
        f"[ -r {quoted} ] || exit 3; tail -c {window} {quoted}{head} | base64 -w0",
        POLL_TIMEOUT_S)
    if not done.ok:
        raise GpuclusterError(f"{host.name}: {path} cannot be read")
    try:
        return base64.b64decode(done.stdout.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise GpuclusterError(f"{host.name}: {path} arrived damaged") from None
