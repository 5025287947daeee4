"""GPU health: memory errors, modes that surprise jobs, fabric, Xid, busy GPUs."""

from __future__ import annotations

from collections.abc import Callable

from gpucluster import clock_events
from gpucluster.doctor import nvidia_smi
from gpucluster.doctor.checks.gpu import gpu_hosts
from gpucluster.doctor.model import CheckResult, Context, Status, check
from gpucluster.hostrange import spans
from gpucluster.torchrun import SMOKE_ENDS, SMOKE_PREFIX
from gpucluster.wording import counted


def _per_gpu(context: Context, name: str,
             judge: Callable[[nvidia_smi.Gpu], tuple[Status, str] | None],
             ok_message: str, remedy: str) -> list[CheckResult]:
    """Judge every GPU of every node; a node gets its worst GPU's status."""
    results = []
    order = [Status.OK, Status.SKIP, Status.WARN, Status.FAIL]
    for host, facts in gpu_hosts(context):
        judged = facts.gpus if context.gpus is None else context.gpus.chosen(facts.gpus)
        findings = [(g.index, verdict) for g in judged if (verdict := judge(g))]
        if not findings:
            results.append(CheckResult(name, host.name, Status.OK, ok_message))
            continue
        worst = max((v[0] for _, v in findings), key=order.index)
        # GPUs that say the same are said once: `GPU 0-7: clocks held down: hw_thermal`
        alike: dict[str, list[int]] = {}
        for index, (status, message) in findings:
            if status is worst:
                alike.setdefault(message, []).append(index)
        listed = "; ".join(f"GPU {spans(sorted(gpus))}: {message}"
                           for message, gpus in alike.items())
        results.append(CheckResult(name, host.name, worst, listed,
                                   "" if worst is Status.SKIP else remedy,
                                   {"gpus": {str(i): v[1] for i, v in findings}}))
    return results


@check("ecc", "gpu-health", "no uncorrected ECC errors")
def ecc(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        volatile, aggregate = gpu.ecc_uncorrected_volatile, gpu.ecc_uncorrected_aggregate
        if volatile:
            return Status.FAIL, f"{volatile} uncorrected ECC errors since the last reboot"
        if aggregate:
            return Status.WARN, f"{aggregate} uncorrected ECC errors over its lifetime"
        if gpu.ecc_enabled is None:
            return Status.SKIP, "ECC not reported (consumer GPU?)"
        return None

    return _per_gpu(context, "ecc", judge, "no uncorrected ECC errors",
                    "drain the node: reset the GPU (nvidia-smi -r -i N) or reboot; if errors "
                    "return, the GPU needs an RMA")


@check("row-remapping", "gpu-health", "no pending or failed row remapping")
def row_remapping(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        if gpu.remapped_rows_failure:
            return Status.FAIL, "row remapping failed"
        if gpu.remapped_rows_pending:
            return Status.FAIL, "row remapping pending (takes effect at the next GPU reset)"
        return None

    return _per_gpu(context, "row-remapping", judge, "no pending or failed row remapping",
                    "reset the GPU (nvidia-smi -r -i N) or reboot to apply pending remaps; a "
                    "failed remap means the GPU needs an RMA")


@check("retired-pages", "gpu-health", "no retired pages pending (older GPUs)")
def retired_pages(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        if gpu.retired_pages_pending:
            return Status.FAIL, "retired pages pending"
        return None

    return _per_gpu(context, "retired-pages", judge, "no retired pages pending",
                    "reboot (or reset the GPU) so the pending page retirements take effect")


@check("persistence", "gpu-health", "persistence mode on (avoids slow, flaky GPU start-up)")
def persistence(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        if gpu.persistence is False:
            return Status.WARN, "persistence mode off"
        return None

    return _per_gpu(context, "persistence", judge, "persistence mode on",
                    "enable it: sudo systemctl enable --now nvidia-persistenced "
                    "(or nvidia-smi -pm 1)")


@check("mig", "gpu-health", "MIG off (a MIG GPU is not one whole GPU per rank)")
def mig(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        if gpu.mig_enabled:
            return Status.WARN, "MIG mode enabled"
        return None

    return _per_gpu(context, "mig", judge, "MIG off",
                    "for training on whole GPUs: sudo nvidia-smi -i N -mig 0, then reset the "
                    "GPU; with MIG on, CUDA gives a process one MIG device, so launch and "
                    "smoke refuse more than one process a node there")


@check("fabric", "gpu-health", "NVLink fabric manager state (where GPUs report one)")
def fabric(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        if gpu.fabric_state is None:
            return Status.SKIP, "no fabric reported (no NVSwitch)"
        if gpu.fabric_state != "Completed" or (gpu.fabric_status or "Success") != "Success":
            return Status.FAIL, f"fabric {gpu.fabric_state}/{gpu.fabric_status}"
        return None

    return _per_gpu(context, "fabric", judge, "fabric registration completed",
                    "start the fabric manager: sudo systemctl enable --now "
                    "nvidia-fabricmanager (its version must match the driver's)")


@check("clocks", "gpu-health", "no GPU's clocks held down by heat, power brake or a "
       "hardware slowdown")
def clocks(context: Context) -> list[CheckResult]:
    def judge(gpu: nvidia_smi.Gpu) -> tuple[Status, str] | None:
        reasons = clock_events.slowdowns(gpu.clock_events)
        if not reasons:
            return None
        # Software thermal slowing may pass with the heat; the hardware's halves the clocks
        worst = Status.FAIL if any(r.startswith("hw_") for r in reasons) else Status.WARN
        return worst, f"clocks held down: {'+'.join(reasons)}"

    return _per_gpu(context, "clocks", judge, "no clocks held down",
                    "its rank would set the whole job's pace: drain the node until fixed; "
                    "`nvidia-smi -q -d PERFORMANCE` there names the cause (thermal: check "
                    "cooling and airflow; power brake: check the PSUs)")


@check("xid", "gpu-health", "no NVIDIA Xid errors in the kernel log (when readable)")
def xid(context: Context) -> list[CheckResult]:
    results = []
    for host, facts in gpu_hosts(context):
        lines = (facts.text("xid") or "").splitlines()
        if "@unreadable" in lines:
            results.append(CheckResult("xid", host.name, Status.SKIP,
                                       "kernel log not readable by this user, nor "
                                       "through sudo",
                                       "doctor --ask-sudo-pass where sudo asks a password; "
                                       "else run doctor as root, allow this user sudo, or "
                                       "sysctl kernel.dmesg_restrict=0"))
            continue
        errors = [line for line in lines if "Xid" in line]
        if errors:
            results.append(CheckResult(
                "xid", host.name, Status.WARN, f"{len(errors)} Xid errors in the kernel log; "
                f"last: {errors[-1].strip()[-120:]}",
                "look the Xid code up in NVIDIA's Xid catalogue; 48/63/64/74/79/92/94/95 "
                "mean hardware trouble: drain the node", {"xid": errors}))
        else:
            results.append(CheckResult("xid", host.name, Status.OK, "no Xid errors"))
    return results


SLURM_JOB = "slurm:"  # the probe's prefix for a Slurm job's id


@check("gpu-processes", "gpu-health", "no compute process already holding a GPU",
       sections=("nvidia_smi_path", "gpus", "apps", "app_jobs"))
def gpu_processes(context: Context) -> list[CheckResult]:
    results = []
    for host, facts in gpu_hosts(context):
        every = nvidia_smi.parse_processes(facts.text("apps") or "")
        processes = every if context.gpus is None else context.gpus.on_chosen(every,
                                                                                facts.gpus)
        if not processes:
            others = (f" on {context.gpus} ({counted(len(every), 'process', 'processes')} "
                      f"on the others)" if context.gpus is not None and every else "")
            results.append(CheckResult("gpu-processes", host.name, Status.OK,
                                       f"no compute processes{others}"))
            continue
        owners = _app_jobs(facts.text("app_jobs") or "")
        by_owner: dict[tuple[str, str], list[nvidia_smi.GpuProcess]] = {}
        for process in processes:
            by_owner.setdefault(owners.get(process.pid, ("", "")), []).append(process)
        said, fixes = [], []
        for (job, state), held in sorted(by_owner.items()):
            listed = ", ".join(f"pid {p.pid} {p.name} ({p.used_mib} MiB)" for p in held)
            if job.startswith(SLURM_JOB):
                what, fix = _slurm_holder(job.removeprefix(SLURM_JOB), state, held, listed,
                                          _reap_fix(context))
                said.append(what)
                fixes.append(fix)
            elif state == "running" and job.startswith(SMOKE_PREFIX):  # no record to stop
                said.append(f"GPUs held by a smoke test ({job}, "
                            f"{counted(len(held), 'process', 'processes')})")
                fixes.append(f"let it finish: {SMOKE_ENDS}")
            elif state == "running":  # a job's ranks: no pids, never advise killing a rank
                said.append(f"GPUs held by running job {job} "
                            f"({counted(len(held), 'process', 'processes')})")
                fixes.append(f"let job {job} finish, or end it: gpucluster stop {job}")
            elif job:
                said.append(f"GPUs held by leftovers of job {job} (its torchrun ended): "
                            f"{listed}")
                fixes.append(_reap_fix(context))
            else:
                said.append(f"GPUs held by: {listed}")
                fixes.append(f"see whose they are (gpucluster reap lists them with their "
                             f"user) and end them if they are leftovers: kill "
                             f"{' '.join(str(p.pid) for p in held)}")
        free = [] if context.gpus is not None else _free_gpus(facts.gpus, processes)
        results.append(CheckResult(
            "gpu-processes", host.name, Status.FAIL, "; ".join(said),
            "; ".join(fixes) + "; a new job would run out of memory or hang" + (
                f"; or start it on the GPUs free here: launch --gpus {spans(free)}"
                if free else ""),
            {"processes": [_process_data(p, *owners.get(p.pid, ("", ""))) for p in processes]}))
    return results


def _free_gpus(gpus: list[nvidia_smi.Gpu], processes: list[nvidia_smi.GpuProcess]
               ) -> list[int]:
    """The GPUs no process is on, where nvidia-smi names every process's GPU."""
    if not all(p.bus_id for p in processes) or not all(g.bus_id for g in gpus):
        return []
    held = {(p.bus_id or "").upper() for p in processes}
    return [g.index for g in gpus if (g.bus_id or "").upper() not in held]


def _process_data(process: nvidia_smi.GpuProcess, job: str, state: str) -> dict[str, object]:
    return {"pid": process.pid, "name": process.name, "used_mib": process.used_mib,
            "bus_id": process.bus_id, "job": job or None, "job_state": state or None}


def _reap_fix(context: Context) -> str:
    """Ending the leftovers, on the GPUs judged only (launch --gpus: those of the job)."""
    only = context.gpus.option if context.gpus is not None else ""
    return f"end them: gpucluster reap {only}--yes (gpucluster reap {only}lists them)"


def _slurm_holder(job: str, state: str, held: list[nvidia_smi.GpuProcess],
                  listed: str, reap_fix: str) -> tuple[str, str]:
    """What a Slurm job's processes are, and the fix: never killing them while Slurm has
    the job."""
    if state == "ended":
        return (f"GPUs held by leftovers of Slurm job {job} (Slurm has ended it): {listed}",
                reap_fix)
    unsure = " (squeue could not say whether it still runs)" if state == "unknown" else ""
    return (f"GPUs held by Slurm job {job} ({counted(len(held), 'process', 'processes')})"
            f"{unsure}", f"let Slurm job {job} finish, or end it: gpucluster stop slurm-{job} "
                         f"(or scancel {job} on a node); or launch on other nodes (-w)")


def _app_jobs(text: str) -> dict[int, tuple[str, str]]:
    """The probe's `PID JOB running|ended` lines (`PID slurm:ID running|ended|unknown`
    for a Slurm job's process, `PID - -` for no job)."""
    owners = {}
    for line in text.splitlines():
        pid, _, rest = line.strip().partition(" ")
        job, _, state = rest.rpartition(" ")
        if pid.isdigit() and job not in ("", "-") and state in ("running", "ended", "unknown"):
            owners[int(pid)] = (job, state)
    return owners
