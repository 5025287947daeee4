"""`gpucluster bundle`: from every node at once, what a bug report needs: doctor's view,
nvidia-smi -q, the kernel's GPU lines, network, managed firewall rules, disk and memory,
the journal of the units that matter, and with a job its files on each node. A node
that is dead or hangs yields what it could, and says so; nothing waits on it past its
time limits."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpucluster import reports
from gpucluster.bundle.slurm_job import SlurmJob
from gpucluster.doctor.model import REGISTRY, CheckResult
from gpucluster.doctor.runner import DoctorReport, run_doctor
from gpucluster.env_names import MASK
from gpucluster.inventory import Host, Inventory
from gpucluster.launch.failure import failure_of
from gpucluster.launch.follow import follow
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import FirstFailure, JobOutcome
from gpucluster.remote.connection import (
    Connection,
    password_line,
    shell_path,
    typed_sudo_context,
)
from gpucluster.remote.result import HostFailure, RemoteError
from gpucluster.remote.session import Session
from gpucluster.slurm_states import SET_UP_HERE, SINFO
from gpucluster.templating import render

NODE_LIMIT_S = 180.0  # the whole collection on one node; each command has its own
MAX_FILE_BYTES = 8 * 1024 * 1024  # one command's output, or the end of a job's file
SINFO_HEADING = "# sinfo: node|state|reason"  # in slurm.txt, where SUMMARY.md reads it
SKIPPED_CHECKS = ("rendezvous-port",)  # it opens a test listener: not while a job runs
# NAME=value or NAME: value where NAME looks secret, wherever a script printed it,
# matched from the word in the name: `HF_TOKEN=x`, `"wandb_api_key": "x"`, `PASSWD: x`.
_SECRET_VALUE = re.compile(
    rb"(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)[A-Za-z0-9_]*[\"']?\s*[=:]\s*[\"']?"
    rb"([^\s\"',]+)", re.IGNORECASE)
_SECRET_WORDS = (b"token", b"key", b"secret", b"passw", b"credential")


@dataclass
class NodeBundle:
    host: str
    files: dict[str, bytes] = field(default_factory=dict)
    error: str = ""  # why some or all of it is missing
    duration_s: float = 0.0


@dataclass
class Collected:
    nodes: dict[str, NodeBundle]
    doctor: DoctorReport | None
    outcome: JobOutcome | None  # the job's state now, when a job was asked
    record: JobRecord | None
    duration_s: float = 0.0
    first_failure: FirstFailure | None = None
    slurm_job: SlurmJob | None = None  # bundle slurm-ID: Slurm's record and its output


def first_failure(outcome: JobOutcome, store: JobStore) -> FirstFailure | None:
    """The job's first failure, after the fact: a node whose torchrun exited non-zero,
    even if launch then stopped the rest (their stop is no failure: torchrun reported no
    root cause). A node unreachable now says nothing about the job."""
    candidates = []
    for node, state in outcome.states.items():
        if state.state != "leftover" and (state.state not in ("exited", "stopped")
                                          or state.exit_code in (0, None)):
            continue
        failure = failure_of(node, state, store.node_log(outcome.record.id, node))
        if state.state in ("exited", "leftover") or failure.failed_at:
            candidates.append(failure)
    return min(candidates, key=FirstFailure.order, default=None)


def scrub(data: bytes) -> bytes:
    """Secret-looking assignments in any collected text, masked. The words are found
    with bytes.find in an ASCII-lowered copy (the same offsets), and the pattern tried
    only there: a case-blind regex scanning every word of a job's logs took 10 s for
    100 MB."""
    lowered = data.lower()
    hits = sorted({at for word in _SECRET_WORDS for at in _finds(lowered, word)})
    pieces, done = [], 0
    for at in hits:
        found = _SECRET_VALUE.match(data, at) if at >= done else None
        if found is not None:
            pieces += [data[done:found.start(1)], MASK.encode()]
            done = found.end(1)
    return b"".join([*pieces, data[done:]]) if pieces else data


def _finds(data: bytes, word: bytes) -> Iterator[int]:
    at = data.find(word)
    while at != -1:
        yield at
        at = data.find(word, at + 1)


def collect_script(inventory: Inventory, host: Host, job_dir: str, since: float,
                   typed_sudo: bool = False) -> str:
    """`job_dir`: the job's directory on this node, shell-quoted ("" without a job).
    `typed_sudo`: its stdin's first line is the --ask-sudo-pass password."""
    return render("bundle/collect.sh.j2", node=host.name, max_bytes=MAX_FILE_BYTES,
                  **typed_sudo_context(typed_sudo),
                  since=int(since),
                  since_text=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)),
                  tag=inventory.cluster.name, job_dir=job_dir, slurm_set_up=SET_UP_HERE,
                  sinfo=SINFO, sinfo_heading=SINFO_HEADING)


def _collect_on(connection: Connection, script: str, stdin: bytes | None) -> NodeBundle:
    bundle = NodeBundle(connection.host)
    started = time.monotonic()
    current: list[str] = []
    name: str | None = None

    def on_line(stream: str, line: str) -> None:
        nonlocal name
        kind, rest = reports.parse(line) or ("", "")
        if stream != "stdout":
            return
        if kind == "file":
            name, current[:] = rest.strip(), []
        elif kind == "end" and name is not None:
            try:
                bundle.files[name] = scrub(base64.b64decode("".join(current)))
            except (binascii.Error, ValueError):
                bundle.files[name] = b"gpucluster: this file arrived damaged\n"
            name = None
        elif name is not None:
            current.append(line.strip())

    try:
        connection.run(script, timeout=NODE_LIMIT_S, stdin=stdin, on_line=on_line)
    except RemoteError as error:  # what arrived is kept: a partial bundle says why
        bundle.error = error.message
    bundle.duration_s = time.monotonic() - started
    return bundle


def collect(session: Session, inventory: Inventory, store: JobStore,
            record: JobRecord | None, on_node: Callable[[NodeBundle], None],
            slurm_job: SlurmJob | None = None) -> Collected:
    """Doctor, the nodes' files and (with a job, ours or Slurm's) its logs and state, all
    at once; with a job, from its nodes only."""
    started = time.time()
    job_started = record.started_at if record else (slurm_job.started_at if slurm_job
                                                     else None)
    since = job_started - 600 if job_started else started - 3600
    result = Collected({}, None, None, record, slurm_job=slurm_job)
    ran_on = record.hosts if record else (slurm_job.hosts if slurm_job else None)
    hosts = [h for h in inventory.hosts if ran_on is None or h.name in ran_on]
    work_dir = shell_path(inventory.cluster.work_dir)

    def job_dir(host: Host) -> str:
        if record is not None:
            return record.dir_on_node(host.name)
        return f"{work_dir}/{slurm_job.job_dir}" if slurm_job else ""

    def run_doctor_part() -> None:
        checks = [spec for name, spec in REGISTRY.items() if name not in SKIPPED_CHECKS]
        result.doctor = run_doctor(session, inventory.restricted_to(hosts), checks)

    def follow_part() -> None:
        if record is not None:  # refreshes the controller's copies, finds the first failure
            result.outcome = follow(session, inventory, record, store, live=False,
                                    fail_fast=False, stop_on_interrupt=False)

    threads = [threading.Thread(target=part, daemon=True)
               for part in (run_doctor_part, follow_part)]
    for thread in threads:
        thread.start()

    def done(host: str, value: NodeBundle | HostFailure) -> None:
        bundle = value if isinstance(value, NodeBundle) else NodeBundle(host,
                                                                        error=value.message)
        result.nodes[host] = bundle
        on_node(bundle)

    password = session.options.sudo_password
    stdin = None if password is None else password_line(password)
    session.map(hosts, lambda c: _collect_on(
        c, collect_script(inventory, inventory.host(c.host), job_dir(inventory.host(c.host)),
                          since, password is not None), stdin), on_done=done)
    for thread in threads:
        thread.join(NODE_LIMIT_S)
    result.nodes = {h.name: result.nodes.get(h.name, NodeBundle(h.name, error="no answer"))
                    for h in hosts}
    if result.outcome is not None:
        result.first_failure = first_failure(result.outcome, store)
    result.duration_s = time.time() - started
    return result


def doctor_json(report: DoctorReport | None, host: str) -> dict[str, Any]:
    """One node's share of doctor's report: its results and its facts."""
    if report is None:
        return {"error": "doctor did not finish"}
    return {"host": host, "results": [_result(r) for r in report.results if r.host == host],
            "facts": report.facts.get(host)}


def _result(result: CheckResult) -> dict[str, Any]:
    return {**{k: v for k, v in dataclasses.asdict(result).items() if k != "status"},
            "status": result.status.value}
