"""GPUs and the software stack on them: driver, CUDA, torch, NCCL, per node and across."""

from __future__ import annotations

from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.doctor.model import CheckResult, Context, Status, check, parity
from gpucluster.doctor.probe import NodeFacts
from gpucluster.inventory import Host
from gpucluster.wording import counted

DRIVER_REMEDY = ("check that the kernel module is loaded (lsmod | grep nvidia; dmesg | grep -i "
                 "nvrm); after a kernel update reinstall the driver (DKMS) or reboot")


def expects_gpus(host: Host, context: Context) -> bool:
    """The inventory says so, or (saying nothing) most other nodes have GPUs."""
    if host.gpus is not None:
        return host.gpus > 0
    with_gpus = sum(1 for f in context.facts.values() if f.has_nvidia_smi)
    return with_gpus * 2 > len(context.facts)


def gpu_hosts(context: Context) -> list[tuple[Host, NodeFacts]]:
    """Nodes whose nvidia-smi answered with at least one GPU."""
    return [(h, context.facts[h.name]) for h in context.answering()
            if context.facts[h.name].gpus]


def runs_on_cpu(host: Host) -> bool:
    """torch_device: cpu: jobs here run torch on the CPU (the sandbox's nodes, whose GPUs
    are simulated, say so), so a CPU build of torch is expected."""
    return host.torch_device == "cpu"


@check("nvidia-smi", "gpu", "nvidia-smi is installed and can talk to the driver",
       sections=("nvidia_smi_path", "gpus"))
def nvidia_smi_present(context: Context) -> list[CheckResult]:
    results = []
    for host in context.answering():
        facts = context.facts[host.name]
        if not facts.has_nvidia_smi:
            if expects_gpus(host, context):
                results.append(CheckResult(
                    "nvidia-smi", host.name, Status.FAIL, "nvidia-smi not found",
                    "install the NVIDIA driver (e.g. apt install nvidia-driver-550-server) "
                    "and reboot; or set `gpus: 0` for this host in the inventory"))
            else:
                results.append(CheckResult("nvidia-smi", host.name, Status.SKIP,
                                           "no nvidia-smi (no GPUs expected here)"))
        elif facts.driver_failure:
            results.append(CheckResult("nvidia-smi", host.name, Status.FAIL,
                                       facts.driver_failure, DRIVER_REMEDY))
        else:
            results.append(CheckResult("nvidia-smi", host.name, Status.OK,
                                       f"{counted(len(facts.gpus), 'GPU')} answer"
                                       if len(facts.gpus) != 1 else "its GPU answers"))
    return results


@check("gpu-count", "gpu", "GPU count matches the inventory's `gpus` and the other nodes",
       sections=("nvidia_smi_path", "gpus"))
def gpu_count(context: Context) -> list[CheckResult]:
    if context.gpus is not None:
        return _chosen_count(context, context.gpus)
    counts: dict[str, int] = {}
    results = []
    for host in context.answering():
        found = len(context.facts[host.name].gpus)
        if host.gpus is not None and found != host.gpus:
            results.append(CheckResult(
                "gpu-count", host.name, Status.FAIL,
                f"{counted(found, 'GPU')} found, inventory expects {host.gpus}",
                "compare nvidia-smi -L with the hardware; a GPU that fell off the bus shows "
                "in dmesg (grep -i 'fallen off'); or fix `gpus:` in the inventory"))
        elif found or expects_gpus(host, context):
            counts[host.name] = found
        else:
            results.append(CheckResult("gpu-count", host.name, Status.SKIP, "no GPUs expected"))
    checked = {r.host for r in results}
    results.extend(r for r in parity(
        "gpu-count", {h: c for h, c in counts.items() if h not in checked}, Status.WARN,
        "GPU count", "nodes with fewer GPUs need their own --nproc-per-node; check the "
        "missing GPUs (nvidia-smi -L, dmesg)"))
    return results


def _chosen_count(context: Context, chosen: GpuSelection) -> list[CheckResult]:
    """A job on some of each node's GPUs (launch --gpus) needs those there, whatever
    the others: the one that fell off the bus may be the one it leaves out."""
    results = []
    for host, facts in gpu_hosts(context):
        if not chosen.entries and not runs_on_cpu(host):
            results.append(CheckResult(
                "gpu-count", host.name, Status.FAIL, "CUDA_VISIBLE_DEVICES is empty: the "
                "job's ranks would see no GPU", "give the job GPUs: --gpus 0-3, or unset "
                "CUDA_VISIBLE_DEVICES (-e, or the inventory's env)"))
            continue
        missing = chosen.missing(facts.gpus)
        listed = f"nvidia-smi lists {counted(len(facts.gpus), 'GPU')}" + (
            f" (inventory: {host.gpus})" if host.gpus not in (None, len(facts.gpus)) else "")
        if missing:
            results.append(CheckResult(
                "gpu-count", host.name, Status.FAIL,
                f"GPU {','.join(missing)} not found (the job's: {chosen}): {listed}",
                "choose GPUs the node has: --gpus with indices nvidia-smi -L lists there"))
        else:
            results.append(CheckResult("gpu-count", host.name, Status.OK,
                                       f"the job's {chosen} found; {listed}"))
    return results


@check("gpu-model", "gpu", "GPU model matches the inventory's `gpu_model` and the other nodes")
def gpu_model(context: Context) -> list[CheckResult]:
    models: dict[str, str] = {}
    results = []
    for host, facts in gpu_hosts(context):
        names = sorted({g.name or "?" for g in facts.gpus})
        model = " + ".join(names)
        if host.gpu_model is not None and names != [host.gpu_model]:
            results.append(CheckResult(
                "gpu-model", host.name, Status.FAIL,
                f"{model} found, inventory expects {host.gpu_model}",
                "fix `gpu_model:` in the inventory, or check the node is the one you meant"))
        elif len(names) > 1:
            results.append(CheckResult("gpu-model", host.name, Status.WARN,
                                       f"mixed GPU models in one node: {model}",
                                       "a job runs at the pace of its slowest GPU"))
        else:
            models[host.name] = model
    results.extend(parity("gpu-model", models, Status.WARN, "model",
                          "a job runs at the pace of its slowest GPU: keep one model per job "
                          "(--hosts) or accept the slowdown"))
    return results


@check("driver", "gpu", "NVIDIA driver version is the same on every node")
def driver(context: Context) -> list[CheckResult]:
    versions = {h.name: f.versions.driver or (f.gpus[0].driver or "?")
                for h, f in gpu_hosts(context)}
    return parity("driver", versions, Status.FAIL, "driver",
                  "install the same driver version on every node (the version the majority "
                  "runs), then reboot or reload the nvidia modules")


@check("cuda-driver", "gpu", "CUDA version the driver supports, the same on every node")
def cuda_driver(context: Context) -> list[CheckResult]:
    versions = {h.name: f.versions.cuda or "?" for h, f in gpu_hosts(context)}
    return parity("cuda-driver", versions, Status.WARN, "driver supports CUDA",
                  "it follows the driver version: align the drivers")


@check("nvcc", "gpu", "CUDA toolkit (nvcc) version, if installed, the same everywhere")
def nvcc(context: Context) -> list[CheckResult]:
    versions: dict[str, str] = {}
    results = []
    for host in context.answering():
        text = context.facts[host.name].ok_text("nvcc")
        if text is None:
            results.append(CheckResult("nvcc", host.name, Status.SKIP,
                                       "no nvcc (PyTorch wheels bring their own CUDA runtime)"))
        else:
            versions[host.name] = text.splitlines()[-1].strip()
    results.extend(parity("nvcc", versions, Status.WARN, "nvcc",
                          "extensions built on one node may not load on another: align the "
                          "CUDA toolkit versions"))
    return results


@check("torch", "gpu", "torch imports in the job's python; same version on every node")
def torch(context: Context) -> list[CheckResult]:
    versions: dict[str, str] = {}
    results = []
    python = context.inventory.cluster.python
    for host in context.answering():
        facts = context.facts[host.name]
        info = facts.torch
        if facts.ok_text("python") is None:
            results.append(CheckResult("torch", host.name, Status.SKIP,
                                       "the job's python was not found (see the python check)"))
        elif info is not None and info.timed_out_s is not None:
            results.append(CheckResult(
                "torch", host.name, Status.FAIL,
                f"importing torch took over {info.timed_out_s} s and was stopped",
                "a first import can be this slow from a cold disk, an NFS venv or on a busy "
                "node: run doctor again (the versions are cached after one import); if it "
                "stays this slow, look at the node's load and the python's storage"))
        elif info is None or info.version is None:
            reason = info.error if info is not None and info.error else "not installed"
            results.append(CheckResult(
                "torch", host.name, Status.FAIL, f"torch does not import: {reason}",
                f"install it for the job's python: {python} -m pip install torch"))
        else:
            versions[host.name] = info.version
    results.extend(parity("torch", versions, Status.FAIL, "torch",
                          "install one torch version everywhere (pin it: pip install "
                          "torch==X.Y.Z); mixed versions hang or fail in collectives"))
    return results


def _major_minor(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


# Read from torch's version.py, without the import that takes seconds: launch asks it too.
@check("torch-build", "gpu", "torch is a CUDA build where jobs use the GPUs (torch_device)",
       sections=("torch_build", "nvidia_smi_path", "gpus"))
def torch_build(context: Context) -> list[CheckResult]:
    results = []
    python = context.inventory.cluster.python
    for host, facts in gpu_hosts(context):
        build = facts.torch_build
        if build is None:
            results.append(CheckResult("torch-build", host.name, Status.SKIP,
                                       "torch's build not read (no torch for cluster.python? "
                                       "see the torch check)"))
        elif build.cuda:
            results.append(CheckResult("torch-build", host.name, Status.OK,
                                       f"torch {build.version}, built for CUDA {build.cuda}"))
        elif runs_on_cpu(host):
            results.append(CheckResult(
                "torch-build", host.name, Status.SKIP,
                "torch_device: cpu: jobs here run on the CPU, torch is a CPU build"))
        else:
            what = (f"a ROCm build (HIP {build.hip}), for AMD GPUs," if build.hip
                    else "a CPU-only build")
            results.append(CheckResult(
                "torch-build", host.name, Status.FAIL,
                f"torch {build.version} is {what} on an NVIDIA GPU node: a job's ranks "
                f"would find no GPU",
                f"install a CUDA build for the job's python: {python} -m pip install torch "
                f"--index-url https://download.pytorch.org/whl/cu124 (pick the CUDA the "
                f"driver supports); or set `torch_device: cpu` for jobs on the CPU"))
    return results


@check("torch-cuda", "gpu", "torch's CUDA build fits the driver (not newer than it supports)")
def torch_cuda(context: Context) -> list[CheckResult]:
    builds: dict[str, str] = {}
    results = []
    for host, facts in gpu_hosts(context):
        info = facts.torch
        if info is None or info.version is None:
            continue
        if info.cuda is None:  # torch-build says whether a CPU build is right here
            results.append(CheckResult("torch-cuda", host.name, Status.SKIP,
                                       f"torch {info.version} is a CPU build"))
            continue
        built, supported = _major_minor(info.cuda), _major_minor(facts.versions.cuda)
        if built and supported and built[0] > supported[0]:
            results.append(CheckResult(
                "torch-cuda", host.name, Status.FAIL,
                f"torch is built for CUDA {info.cuda}, the driver supports only "
                f"{facts.versions.cuda}",
                "upgrade the driver, or install a torch built for the driver's CUDA major "
                f"(e.g. cu{supported[0]}x wheels)"))
            continue
        builds[host.name] = info.cuda
    results.extend(parity("torch-cuda", builds, Status.FAIL, "torch CUDA build",
                          "install the same torch wheel (same CUDA build) everywhere"))
    return results


@check("nccl", "gpu", "NCCL version torch uses, the same on every node")
def nccl(context: Context) -> list[CheckResult]:
    versions: dict[str, str] = {}
    results = []
    for host, facts in gpu_hosts(context):
        info = facts.torch
        if info is None or info.version is None:
            continue
        if info.cuda is None:  # torch-build says whether a CPU build is right here
            results.append(CheckResult("nccl", host.name, Status.SKIP,
                                       f"torch {info.version} is a CPU build: no NCCL in it"))
        elif info.nccl is None:
            status = Status.SKIP if runs_on_cpu(host) else Status.WARN
            results.append(CheckResult("nccl", host.name, status,
                                       f"torch {info.version} (CUDA {info.cuda}) reports "
                                       f"no NCCL: a build without it",
                                       "" if runs_on_cpu(host) else
                                       "install torch's own CUDA wheel (pytorch.org), "
                                       "which bundles NCCL"))
        else:
            versions[host.name] = info.nccl
    results.extend(parity("nccl", versions, Status.FAIL, "NCCL",
                          "use the same torch wheel everywhere (it bundles NCCL), and unset "
                          "LD_LIBRARY_PATH entries that load another libnccl"))
    return results
