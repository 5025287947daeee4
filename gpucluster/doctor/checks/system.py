"""System limits and services jobs depend on: shared memory, locked memory, disk,
clock, container runtime and NVIDIA's container toolkit."""

from __future__ import annotations

from gpucluster.doctor import node_tools
from gpucluster.doctor.checks.gpu import gpu_hosts, runs_on_cpu
from gpucluster.doctor.model import CheckResult, Context, Status, check, parity
from gpucluster.torchrun import SMOKE_ENDS, SMOKE_PREFIX

GIB = 1024**3
SHM_MIN_BYTES = 1 * GIB
DISK_WARN_BYTES = 10 * GIB
DISK_FAIL_BYTES = 1 * GIB
CLOCK_WARN_S = 1.0


@check("shm", "system", "/dev/shm is at least 1 GiB (dataloader workers and NCCL use it)")
def shm(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        size = context.facts[host.name].df_size_bytes("shm")
        if size is None:
            results.append(CheckResult("shm", host.name, Status.WARN, "no /dev/shm mounted",
                                       "mount it: sudo mount -t tmpfs -o size=16G shm /dev/shm"))
        elif size < SHM_MIN_BYTES:
            results.append(CheckResult(
                "shm", host.name, Status.WARN, f"/dev/shm is {size / GIB:.2f} GiB",
                "grow it: sudo mount -o remount,size=16G /dev/shm (in containers: "
                "--shm-size=16g or --ipc=host)"))
        else:
            results.append(CheckResult("shm", host.name, Status.OK,
                                       f"/dev/shm is {size / GIB:.1f} GiB"))
    return results


@check("memlock", "system", "`ulimit -l` over SSH is unlimited where InfiniBand needs it")
def memlock(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        facts = context.facts[host.name]
        limit = (facts.ok_text("memlock") or "?").strip()
        if limit == "unlimited":
            results.append(CheckResult("memlock", host.name, Status.OK, "unlimited"))
        elif facts.infiniband:
            results.append(CheckResult(
                "memlock", host.name, Status.WARN,
                f"locked memory limited to {limit} KiB in SSH sessions; RDMA needs unlimited",
                "add '* soft memlock unlimited' and '* hard memlock unlimited' to "
                "/etc/security/limits.d/99-memlock.conf (and LimitMEMLOCK=infinity for "
                "sshd), then log in again"))
        else:
            results.append(CheckResult("memlock", host.name, Status.OK,
                                       f"{limit} KiB (no InfiniBand, so it does not matter)"))
    return results


@check("disk", "system", "free space in the work directory")
def disk(context: Context) -> list[CheckResult]:
    work_dir = context.inventory.cluster.work_dir
    results = []
    for host in context.answering():
        free = context.facts[host.name].df_available_bytes("disk")
        if free is None:
            results.append(CheckResult("disk", host.name, Status.WARN,
                                       f"could not read free space for {work_dir}"))
            continue
        message = f"{free / GIB:.1f} GiB free for {work_dir}"
        if free < DISK_FAIL_BYTES:
            results.append(CheckResult("disk", host.name, Status.FAIL, message,
                                       "free space (checkpoints and logs need room: "
                                       "gpucluster prune --older-than 7d --checkpoints "
                                       "lists old jobs' files), or set cluster.work_dir "
                                       "on a larger disk"))
        elif free < DISK_WARN_BYTES:
            results.append(CheckResult("disk", host.name, Status.WARN, message,
                                       "checkpoints fill disks fast: free some space "
                                       "(gpucluster prune lists old jobs' files)"))
        else:
            results.append(CheckResult("disk", host.name, Status.OK, message))
    return results


@check("clock", "system", "clock within 1 s of the controller's")
def clock(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        offset = context.facts[host.name].clock_offset_s
        if offset is None:
            results.append(CheckResult("clock", host.name, Status.WARN, "could not read the clock"))
        elif abs(offset) > CLOCK_WARN_S:
            results.append(CheckResult(
                "clock", host.name, Status.WARN, f"clock is {offset:+.2f} s off the controller",
                "enable time sync on every node: sudo timedatectl set-ntp true (chrony or "
                "systemd-timesyncd); skewed clocks garble logs and break TLS and Kerberos"))
        else:
            results.append(CheckResult("clock", host.name, Status.OK, f"{offset:+.3f} s"))
    return results


@check("node-tools", "system", "the commands launch runs on a node (tar, gzip, GNU find, "
       "setsid...) are installed", sections=("tools", "path"))
def tools(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        facts = context.facts[host.name]
        text = facts.text("tools")
        if text is None:
            results.append(CheckResult("node-tools", host.name, Status.WARN,
                                       "could not look for the commands launch runs"))
            continue
        lacking = node_tools.parse(text)
        if not lacking:
            every = sorted({*node_tools.COMMANDS, *node_tools.GNU_FORMS})
            results.append(CheckResult("node-tools", host.name, Status.OK,
                                       f"all there: {', '.join(every)}"))
            continue
        packages = " ".join(dict.fromkeys(item.package for item in lacking))
        them = "them" if len(lacking) > 1 else "it"
        results.append(CheckResult(
            "node-tools", host.name, Status.FAIL,
            f"lacks {', '.join(map(str, lacking))}: launch's sync and start run {them} here",
            f"install {them}: sudo apt install {packages} (RHEL: sudo dnf install {packages})",
            {"PATH": facts.text("path") or "?"}))
    return results


@check("container-runtime", "system",
       "a container runtime (docker, podman, apptainer, enroot), same version everywhere")
def container_runtime(context: Context) -> list[CheckResult]:
    needed = context.inventory.cluster.image is not None
    versions: dict[str, str] = {}
    results = []
    for host in context.answering():
        runtimes = context.facts[host.name].runtimes
        if not runtimes:
            if needed:
                results.append(CheckResult(
                    "container-runtime", host.name, Status.FAIL,
                    "no container runtime, but the inventory sets cluster.image",
                    "install one: sudo apt install podman (or docker.io, apptainer)"))
            else:
                results.append(CheckResult("container-runtime", host.name, Status.SKIP,
                                           "no container runtime (not needed: no image set)"))
        else:
            versions[host.name] = "; ".join(f"{n} {v}" for n, v in sorted(runtimes.items()))
    results.extend(parity("container-runtime", versions, Status.WARN, "runtime",
                          "install the same runtime version on every node"))
    return results


@check("container-toolkit", "system",
       "NVIDIA container toolkit where docker/podman runs on GPU nodes")
def container_toolkit(context: Context) -> list[CheckResult]:
    needed = context.inventory.cluster.image is not None
    results = []
    gpu_nodes = {h.name for h, _ in gpu_hosts(context)}
    for host in context.answering():
        facts = context.facts[host.name]
        engines = {"docker", "podman"} & set(facts.runtimes)
        if host.name not in gpu_nodes or not engines:
            results.append(CheckResult("container-toolkit", host.name, Status.SKIP,
                                       "no GPUs or no docker/podman here"))
        elif runs_on_cpu(host):
            results.append(CheckResult("container-toolkit", host.name, Status.SKIP,
                                       "torch_device: cpu: jobs here get no GPUs, in "
                                       "containers or not"))
        elif facts.container_toolkit:
            tool, version = next(iter(sorted(facts.container_toolkit.items())))
            results.append(CheckResult("container-toolkit", host.name, Status.OK,
                                       f"{tool} {version}"))
        else:
            results.append(CheckResult(
                "container-toolkit", host.name, Status.FAIL if needed else Status.WARN,
                f"{'/'.join(sorted(engines))} cannot give containers GPUs without the NVIDIA "
                f"container toolkit",
                "install nvidia-container-toolkit, then: sudo nvidia-ctk runtime configure "
                "(docker) or nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (podman)"))
    return results


@check("jobs", "system", "no gpucluster job still running (a new launch would collide)",
       sections=("jobs",))
def running_jobs(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        found = context.facts[host.name].jobs_here(host.name)
        beside = _jobs_beside(context, host.name)
        found = {job: state for job, state in found.items() if job not in beside}
        if found:
            results.append(_collides(context, host.name, found))
        elif beside:
            results.append(CheckResult("jobs", host.name, Status.OK, "; ".join(
                f"job {job} runs here on GPU {gpus}, none of this job's ({context.gpus})"
                for job, gpus in beside.items())))
        else:
            results.append(CheckResult("jobs", host.name, Status.OK, "no gpucluster job running"))
    return results


def _collides(context: Context, node: str, found: dict[str, str]) -> CheckResult:
    """The WARN for the jobs (job -> running or ended) a new one would collide with.
    A smoke test has no record, so nothing for stop to find: it ends by itself."""
    smokes = [job for job in found if job.startswith(SMOKE_PREFIX)]
    running = [job for job, state in found.items() if state == "running" and job not in smokes]
    left = [job for job, state in found.items() if state == "ended" and job not in smokes]
    said = ([f"job {', '.join(running)} still running"] if running else []) + (
        [f"job {', '.join(left)} left processes behind (its torchrun ended)"] if left else []
    ) + ([f"a smoke test runs here ({', '.join(smokes)})"] if smokes else [])
    fixes = ([f"let it finish, or end it: gpucluster stop {running[0]}"] if running else
             [f"end them: gpucluster stop {left[0]}"] if left else [])
    if fixes:
        fixes[0] += " (gpucluster jobs lists them)"
    if smokes:
        fixes.append(f"let the smoke test finish: {SMOKE_ENDS}")
    if context.gpus is not None and (running or smokes):
        fixes.append("or give this job GPUs none of them uses (--gpus)")
    return CheckResult("jobs", node, Status.WARN, "; ".join(said), "; ".join(fixes),
                       {"jobs": list(found), "ended": left})


def _jobs_beside(context: Context, node: str) -> dict[str, str]:
    """The jobs running on `node` on other GPUs than the job to start (launch --gpus),
    with theirs: it can run beside them."""
    if context.gpus is None:
        return {}
    running = context.facts[node].job_gpus_here(node)
    return {job: gpus for job, gpus in running.items()
            if gpus is not None and context.gpus.apart_from(gpus)}
