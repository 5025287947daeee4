"""The bundle as one .tar.gz, SUMMARY.md first: readable without opening anything else."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from gpucluster import hostrange
from gpucluster.bundle.collect import SINFO_HEADING, Collected, doctor_json, scrub
from gpucluster.bundle.slurm_job import SUMMARY_LINES, SlurmJob
from gpucluster.doctor.model import Status
from gpucluster.launch.failure import first_traceback, root_cause
from gpucluster.launch.hang_stacks import STACKS_FILES
from gpucluster.launch.jobs import JobStore
from gpucluster.launch.logsearch import where
from gpucluster.launch.model import FirstFailure, JobOutcome
from gpucluster.slurm.output_lines import SlurmLines
from gpucluster.slurm_states import is_healthy, parse_sinfo, problem_of
from gpucluster.whole_file import check_writable, written_whole
from gpucluster.wording import counted

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def summary(collected: Collected, inventory_path: Path) -> str:
    lines = [f"# gpucluster bundle: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", "",
             f"Inventory: `{inventory_path.resolve()}`; nodes: "  # as read elsewhere
             f"{hostrange.fold(list(collected.nodes))}; collected in "
             f"{collected.duration_s:.1f}s.", ""]
    record = collected.record
    if record is not None:
        lines += [f"## Job {record.id}", "",
                  f"`{record.command()}` on "
                  f"{hostrange.fold(record.hosts)}, started "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.started_at))}"
                  + (f", attempt {record.attempt} of run {record.run}" if record.run else "")
                  + ".", "", *_job_state(collected.outcome, collected.first_failure), ""]
    if collected.slurm_job is not None:
        lines += _slurm_job(collected.slurm_job)
    lost = {h: b.error for h, b in collected.nodes.items() if b.error}
    lines += ["## Nodes that could not be reached", ""]
    lines += [f"- **{h}**: {why} (its part of the bundle is partial or empty)"
              for h, why in lost.items()] or ["None: every node answered."]
    lines += ["", "## Fields that differ between nodes", ""]
    differing = {label: values for label, values in (collected.doctor.summary.items()
                                                      if collected.doctor else [])
                 if len(values) > 1}
    lines += [f"- **{label}**: " + "; ".join(f"`{v}` on {hostrange.fold(h)}"
                                              for v, h in values.items())
              for label, values in differing.items()] or [
        "None of driver, CUDA, GPU, torch, torch CUDA, NCCL differ between the nodes that "
        "answered."]
    lines += ["", "## GPU errors found", ""]
    lines += _gpu_errors(collected) or [_no_gpu_errors(collected)]
    lines += ["", "## Doctor's other findings", ""]
    found = [r for r in (collected.doctor.results if collected.doctor else [])
             if r.status in (Status.FAIL, Status.WARN)]
    # The bundled job's own processes and state: what a launch would refuse, not a fault.
    own = [r for r in found if record is not None and r.name in ("gpu-processes", "jobs")
           and record.id in r.message]
    findings = hostrange.hosts_by(  # what several nodes share, said once
        ((r.name, r.status.value, r.message), r.host) for r in found if r not in own)
    lines += [f"- {hostrange.fold(hosts)} `{name}` {status}: {message}"
              for (name, status, message), hosts in findings.items()] or ["None."]
    if own and record is not None:
        lines += ["", f"(Left out: {hostrange.fold(sorted({r.host for r in own}))} "
                      f"`gpu-processes`/`jobs`, which name job {record.id} itself.)"]
    lines += _slurm(collected)
    lines += ["", "## What is where", "",
              "- `nodes/NODE/`: `doctor.json`, `nvidia-smi-q.txt`, `nvidia-smi-topo.txt`, "
              "`kernel-gpu.txt`, `network.txt`, `firewall.txt`, `system.txt`, "
              "`journal.txt`, `slurm.txt` (where Slurm is set up)"
              + (", and `job/` (its log, stamps, torchrun's per-rank logs, NCCL debug "
                 "files and flight-recorder dumps; of a file past 8 MiB, its end, and "
                 "`job/CUT.txt` names it)" if record else ""),
              "- `doctor.json`: the whole report, every node's facts"]
    if record is not None:
        lines.append("- `job/job.json`: the job's record (its environment with secret values "
                     "masked); `job/logs/`: the controller's copy of every node's log; "
                     "`job/stacks.txt`, after a hang's stop or `stop --stacks`: where each "
                     "rank was; `job/stacks-TIME.txt`: where each was at each look of "
                     "`gpucluster stacks`")
    if collected.slurm_job is not None:
        lines.append("- `slurm-job/scontrol.txt`: Slurm's record of the job; "
                     "`slurm-job/output.log`: the end of its output file (8 MiB at most)")
    return "\n".join(lines) + "\n"


def _slurm_job(job: SlurmJob) -> list[str]:
    """How Slurm says the job went, where, and the end of its output."""
    info = job.info
    state = info.state.lower() + (f" (exit {info.exit_code})" if info.exit_code else "")
    ran_on = f" on {info.nodes}" if info.nodes not in ("", "(null)") else ""
    lines = [f"## Slurm job {job.id}", "", f"{state}{ran_on}; its output: `{info.stdout}` "
             f"on {info.batch_host or 'no node yet'}.", ""]
    output = job.lines()
    shown: list[str] = []  # as logs shows them: [node/rank] where labelled (output_lines)
    read = SlurmLines(lambda node, rank, text: shown.append(f"{where(node, rank)} {text}"),
                      lambda text: shown.append(text.removesuffix("\n")), live=False)
    read.feed(job.output.decode(errors="replace"))
    read.finish()
    failure = read.first_failure()
    if failure is not None:
        lines += _first_failure(failure)
    else:  # a script of the user's own: torchrun's words searched where they stand
        cause = root_cause(output)
        if cause.get("rank"):
            lines += [f"torchrun's first failure: rank {cause['rank']} on "
                      f"{cause.get('host', '?')}, exit code {cause.get('exitcode', '?')}, "
                      f"at {cause.get('time', '?')}.", ""]
        error = first_traceback(output)
        if error:
            lines += ["Its first error:", "", "```", *error, "```", ""]
    tail = shown[-SUMMARY_LINES:]
    if tail:
        lines += [f"The last {len(tail)} lines of its output:", "", "```", *tail, "```", ""]
    else:
        lines += [f"No output collected: {job.output_note or 'it wrote none'}.", ""]
    return lines


def _slurm(collected: Collected) -> list[str]:
    """Slurm's view (sinfo, from the first node whose slurm.txt has it): the nodes it does
    not call healthy, with its reason. Nothing where Slurm is not set up."""
    for bundle in collected.nodes.values():
        text = bundle.files.get("slurm.txt", b"").decode(errors="replace")
        if SINFO_HEADING not in text:
            continue
        listing = text.split(SINFO_HEADING, 1)[1].split("\n# ", 1)[0].strip()
        states = parse_sinfo(listing)
        if not states:
            said = listing.splitlines()[0] if listing else "nothing"
            return ["", "## Slurm", "", f"sinfo failed: {said}"]
        # doctor's wording, so a trailing `*` reads as a slurmd not responding.
        sick = [f"- **{node}**: {problem_of(state, reason)}"
                for node, (state, reason) in states.items() if not is_healthy(state)]
        return ["", "## Slurm", "", *(sick or [
            f"Every node sinfo lists is healthy ({counted(len(states), 'node')})."])]
    return []


def _job_state(outcome: JobOutcome | None, failure: FirstFailure | None) -> list[str]:
    if outcome is None:
        return ["Its state could not be read."]
    by_state = hostrange.hosts_by((s.label, node) for node, s in outcome.states.items())
    states = ", ".join(f"{state} on {hostrange.fold(hosts)}"
                       for state, hosts in by_state.items())
    if failure is None:
        return [f"No node failed. States: {states}."]
    return [*_first_failure(failure), f"States: {states}."]


def _first_failure(failure: FirstFailure) -> list[str]:
    """Where the job failed first, how, its last traceback or lines, the likely cause."""
    rank = f"rank {failure.rank}" if failure.rank is not None else "a rank"
    last = [line for line in (failure.rank_tail or failure.tail) if line.strip()][-3:]
    shown = ["Its last lines:", "", "```", *last, "```", ""]
    if failure.rank_error:  # its last lines, unless more of its output came after it
        shown = ["Its last traceback" + (" (more of its output came after it):"
                                         if failure.error_came_before else ":"),
                 "", "```", *failure.rank_error, "```", "",
                 *(shown if failure.error_came_before else [])]
    return [f"**First failure: {failure.node}, {rank}** ({failure.state.state}"
            + (f", exit {failure.exit_code}" if failure.exit_code is not None else "")
            + (f", worker exit {failure.worker_exit}" if failure.worker_exit is not None
               else "") + ").", "", *shown,
            *([f"Likely cause: {failure.cause.what} (fix: {failure.cause.fix}).", ""]
              if failure.cause else [])]


def _gpu_errors(collected: Collected) -> list[str]:
    found = []
    for host, bundle in collected.nodes.items():
        text = bundle.files.get("kernel-gpu.txt", b"").decode(errors="replace")
        for bus, code in _XID.findall(text):
            found.append(f"- {host}: Xid {code} on GPU {bus}")
    for result in collected.doctor.results if collected.doctor else []:
        if result.name in ("ecc", "row-remapping", "xid") and result.status in (Status.FAIL,
                                                                                Status.WARN):
            found.append(f"- {result.host}: doctor `{result.name}`: {result.message}")
    return found


def _no_gpu_errors(collected: Collected) -> str:
    """None found: said as such only where the kernel log could be read."""
    unread = hostrange.hosts_by((r.message, r.host) for r in (
        collected.doctor.results if collected.doctor else ())
        if r.name == "xid" and r.status == Status.SKIP)
    if not unread:
        return ("None: no Xid in the kernel lines collected, and doctor's ECC, "
                "row-remapping and Xid checks passed.")
    where = "; ".join(f"{hostrange.fold(hosts)} (doctor `xid`: {why})"
                      for why, hosts in unread.items())
    return f"None found, but the kernel log could not be read on {where}: Xid errors " \
           f"there are unknown."


_SUFFIXES = (".tar.gz", ".tgz")


def _stem(name: str) -> str:
    """The archive's name without its suffix: the top directory inside it."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def target(output: Path | None, default_name: str) -> Path:
    """Where the archive goes: `output` (a directory: the default name inside it),
    ending in .tar.gz (or .tgz, its short form). Checked before anything is collected: a
    bundle is most wanted when nodes are slow, and its minutes should not end in a path
    that cannot be written."""
    path = output / default_name if output is not None and output.is_dir() \
        else output or Path(default_name)
    if not path.name.endswith(_SUFFIXES):
        path = path.with_name(path.name + ".tar.gz")
    check_writable(path)
    return path


def write(collected: Collected, store: JobStore, inventory_path: Path, output: Path) -> int:
    """The archive at `output`, written whole, mode 0600 (logs and rules: the user's eyes
    only); its size in bytes."""
    with written_whole(output, 0o600) as partial:
        _write_tar(collected, store, inventory_path, partial, _stem(output.name))
    return output.stat().st_size


def _write_tar(collected: Collected, store: JobStore, inventory_path: Path, partial: Path,
               top: str) -> None:
    # gzip's own default level: tarfile's 9 took 4.9 s for a bundle of 100 MB of logs,
    # 6 takes 1.2 s for an archive 2% larger.
    with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            archive.addfile(info, io.BytesIO(data))

        add("SUMMARY.md", summary(collected, inventory_path).encode())
        if collected.doctor is not None:
            add("doctor.json", _json({h: doctor_json(collected.doctor, h)
                                      for h in collected.nodes}))
        for host, bundle in collected.nodes.items():
            add(f"nodes/{host}/doctor.json", _json(doctor_json(collected.doctor, host)))
            for name, data in sorted(bundle.files.items()):
                add(f"nodes/{host}/{name}", data)
            if bundle.error:
                add(f"nodes/{host}/UNREACHABLE.txt", (bundle.error + "\n").encode())
        if collected.slurm_job is not None:
            add("slurm-job/scontrol.txt", scrub(collected.slurm_job.shown.encode()))
            add("slurm-job/output.log", scrub(collected.slurm_job.output))
        record = collected.record
        if record is not None:
            add("job/job.json", _json(dataclasses.asdict(record)))
            for path in sorted(store.directory(record.id).glob("*.log*")):
                add(f"job/logs/{path.name}", scrub(path.read_bytes()))
            # a hang's stop's, and each `gpucluster stacks` look's (stacks-TIME.txt)
            for stacks in sorted(store.directory(record.id).glob(STACKS_FILES)):
                add(f"job/{stacks.name}", scrub(stacks.read_bytes()))


def _json(value: Any) -> bytes:
    return scrub(json.dumps(value, indent=2, default=str).encode() + b"\n")
