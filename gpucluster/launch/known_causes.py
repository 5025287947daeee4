"""The usual causes of a failed distributed job, known by the words torch, NCCL, gloo and
CUDA print for them, each with what to do: a failed job's first failure names one when
the failing rank's last lines (or its node's, where no rank failed) say it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# How far back from the end of a rank's output its fatal error may stand: past a C++
# backtrace (NCCL's watchdog prints 20-30 frames after its message), not as far back as
# an error the script caught and lived on after.
LINES_SEARCHED = 80
EVIDENCE_CHARS = 200
# An exception's line, without torch's "[rankN]: " prefix: what a rank died of.
_ERROR_LINE = re.compile(r"(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)")
# torchrun's own exception once a worker failed: it says only that one did, and why is
# above it.
_TORCHRUN_FAILED = "ChildFailedError"


@dataclass(frozen=True)
class KnownCause:
    name: str  # stable, for --json
    what: str  # the cause, in a few words
    fix: str
    evidence: str = ""  # the line that says it, as printed


@dataclass(frozen=True)
class _Signature:
    pattern: re.Pattern[str]
    name: str
    what: str
    fix: str


def _signature(pattern: str, name: str, what: str, fix: str) -> _Signature:
    return _Signature(re.compile(pattern), name, what, fix)


_HOST_OUT_OF_MEMORY_FIX = (
    "`gpucluster run -w <node> --sudo 'dmesg | grep -i -E \"out of memory|killed "
    "process\"'`; fewer DataLoader workers or less data held in host memory")

_DISK_FULL_FIX = (
    "free space where the job writes (checkpoints, data, /tmp): `gpucluster doctor -w "
    "<node> --only disk` shows the work dir's; `gpucluster prune --checkpoints` removes "
    "the checkpoints of jobs that ended")

# Most specific and most often the root first: an out-of-memory rank makes its peers
# report a lost connection, never the other way round.
SIGNATURES = (
    _signature(
        r"\b(CUDA|HIP) out of memory\b|OutOfMemoryError|CUDA error: out of memory|"
        r"Cuda failure (\d+ )?'out of memory'",
        "gpu-out-of-memory",
        "the GPU ran out of memory",
        "lower the batch size per GPU, or use gradient accumulation or activation "
        "checkpointing; with much memory reserved but unallocated, "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; `gpucluster top` shows any "
        "other process holding memory on that GPU, `gpucluster reap` ends leftovers"),
    _signature(
        r"ModuleNotFoundError: No module named '(?P<module>[^']+)'", "module-missing",
        "the nodes' python has no module '{module}'",
        "install the package that provides it on every node, into the job's python: "
        "`gpucluster run '<cluster.python> -m pip install <package>'`; or run the job in "
        "an image that has it: --image"),
    _signature(
        r"no kernel image is available for execution on the device", "no-kernel-image",
        "this torch build has no kernels for the GPU's architecture",
        "install a torch build for that GPU, a wheel of a newer CUDA; `gpucluster doctor "
        "--only torch-cuda,gpu-model` shows the build and the GPUs"),
    _signature(
        r"Found no NVIDIA driver on your system|ProcessGroupNCCL is only supported with "
        r"GPUs, no GPUs found|Torch not compiled with CUDA enabled|module 'torch\._C' has no "
        r"attribute '_cuda_\w+'", "no-gpu-for-torch",
        "torch found no GPU it could use on the node",
        "`gpucluster doctor -w <node> --only nvidia-smi,torch-build,container-toolkit` "
        "says which: no driver, a CPU build of torch, or a container the GPUs were not "
        "passed into; a node meant to run jobs on its CPU says "
        "`torch_device: cpu` in the inventory"),
    _signature(
        r"NVIDIA driver on your system is too old|CUDA driver version is insufficient for "
        r"CUDA runtime version", "driver-too-old",
        "this torch build needs a newer NVIDIA driver than the node has",
        "install the torch wheel built for the CUDA the driver supports, or update the "
        "driver: `gpucluster doctor -w <node> --only torch-cuda` shows both; one torch "
        "build on every node"),
    _signature(
        r"CUDA error: system not yet initialized|cudaErrorSystemNotReady", "fabric-not-ready",
        "CUDA could not start on the node's GPUs (system not yet initialized)",
        "on an NVSwitch system (HGX A100, H100, H200) the fabric manager must run, of the "
        "driver's version: sudo systemctl enable --now nvidia-fabricmanager; `gpucluster "
        "doctor -w <node> --only fabric` shows its state"),
    _signature(
        r"uncorrectable ECC error encountered", "gpu-ecc-error",
        "the GPU hit an uncorrectable ECC error (hardware)",
        "`gpucluster doctor -w <node> --only ecc,row-remapping,xid`; drain the node: a "
        "GPU reset or a reboot, an RMA if the errors return"),
    _signature(
        r"an illegal memory access was encountered", "illegal-memory-access",
        "a CUDA kernel accessed memory out of bounds",
        "a bug in the job or a library, where CUDA_LAUNCH_BLOCKING=1 names the kernel; or "
        "a failing GPU, where `gpucluster doctor -w <node> --only xid` shows Xid 13, 31 "
        "or 43"),
    _signature(
        r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device|Multiple "
        r"Ranks are using the same GPU/Partition", "gpu-shared-by-ranks",
        "two ranks of a node used the same GPU, which NCCL refuses",
        "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
        "init_process_group (or pass it device_id=torch.device('cuda', local_rank)): "
        "without it every rank of a node takes GPU 0; or --nproc-per-node is more than "
        "the GPUs CUDA_VISIBLE_DEVICES leaves (`gpucluster doctor -w <node> --only "
        "gpu-count,mig`)"),
    _signature(
        r"CUDA error: invalid device ordinal", "gpu-index-missing",
        "a rank asked for a GPU its node does not have",
        "choose the GPU by LOCAL_RANK, not RANK, which counts across every node: "
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); or CUDA_VISIBLE_DEVICES "
        "(cluster.env, --env) hides GPUs, or they are in MIG mode, where a process sees "
        "one MIG device: `gpucluster doctor -w <node> --only gpu-count,mig`"),
    _signature(
        r"Attempting to deserialize object on CUDA device (?P<device>\d+) but "
        r"torch\.cuda\.device_count\(\) is (?P<count>\d+)", "checkpoint-device-missing",
        "a checkpoint saved from cuda:{device} was loaded where a process sees "
        "{count} GPU(s)",
        "torch.load(path, map_location=f'cuda:{local_rank}') (or 'cpu'): without it, "
        "each tensor goes back to the GPU it was saved from"),
    _signature(
        r"Error while creating shared memory segment|unable to (allocate|write to) shared "
        r"memory|No space left on device.*/dev/shm|Unexpected bus error encountered in "
        r"worker|killed by signal: Bus error", "shared-memory-full",
        "shared memory (/dev/shm) ran out",
        "a larger /dev/shm: `gpucluster doctor --only shm`, a container's --ipc=host or "
        "--shm-size; or fewer DataLoader workers"),
    _signature(
        r"DataLoader worker \(pid \d+\) is killed by signal: Killed", "dataloader-killed",
        "a DataLoader worker was killed by SIGKILL: most often the kernel's out-of-memory "
        "killer, for host memory", _HOST_OUT_OF_MEMORY_FIX),
    # A full disk, in Python's words (with the file, where it names one), else torch.save's,
    # which never says so.
    _signature(r"No space left on device: '(?P<path>[^']+)'", "disk-full",
               "the disk holding {path} was full (No space left on device)", _DISK_FULL_FIX),
    _signature(r"No space left on device", "disk-full",
               "a disk the job wrote to was full (No space left on device)", _DISK_FULL_FIX),
    _signature(
        r"\[enforce fail at inline_container\.cc:\d+\] \. "
        r"(unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing file)", "disk-full",
        "a disk the job wrote to was full (torch.save says 'unexpected pos')", _DISK_FULL_FIX),
    _signature(
        r"Detected mismatch between collectives on ranks", "collective-mismatch",
        "the ranks called different collectives",
        "a code path only some ranks take, such as a condition on the rank or unequal "
        "data per rank: every rank must call the same collectives in the same order"),
    _signature(
        r"Expected to have finished reduction in the prior iteration.*static_graph",
        "ddp-static-graph", "DDP with static_graph=True saw the parameters used change "
        "from one step to the next", "drop static_graph=True, or use the same parameters "
        "in every step"),
    _signature(
        r"Expected to have finished reduction in the prior iteration",
        "ddp-unused-parameters", "DDP found parameters that took no part in the loss",
        "DistributedDataParallel(..., find_unused_parameters=True), or make every "
        "parameter take part in each step's loss"),
    _signature(
        r"Watchdog caught collective operation timeout|Timed out waiting \d+ms for "
        r"(recv|send) operation", "collective-timeout",
        "a collective waited past its timeout: a hang",
        "a rank stopped calling collectives, on a branch the others skip or stuck in "
        "I/O, or lost its peer, or the network drops the nodes' full-size packets "
        "(`gpucluster doctor --only path-mtu`): rerun with --debug for NCCL's log and "
        "the flight recorder, which `gpucluster bundle` collects; `launch --recover "
        "--hang-timeout` restarts a hung job by itself"),
    _signature(
        r"EADDRINUSE|[Aa]ddress already in use", "port-in-use",
        "a port the job listens on was taken",
        "another job or a leftover holds it: `gpucluster jobs`, `gpucluster doctor "
        "--only rendezvous-port` names the holder of the rendezvous port; or set "
        "cluster.rendezvous_port"),
    _signature(
        r"client socket has timed out after .* while trying to connect to "
        r"\((?P<host>[^,]+), (?P<port>\d+)\)", "rendezvous-unreachable",
        "a node could not reach the rendezvous at {host}:{port}",
        "`gpucluster doctor --only rendezvous-port,name-resolution`; `gpucluster "
        "provision --only firewall,hosts` opens the port to the cluster's nodes"),
    _signature(
        r"Call to ibv_(reg_mr|create_qp|create_cq)\w* failed", "memlock-too-low",
        "NCCL could not register pinned memory for InfiniBand/RoCE",
        "raise the locked-memory limit to unlimited (`gpucluster doctor -w <node> --only "
        "memlock` shows it): `* soft memlock unlimited` and `* hard memlock unlimited` in "
        "/etc/security/limits.conf, a container's --ulimit memlock=-1, a service's "
        "LimitMEMLOCK=infinity; where it is unlimited already, GPUDirect RDMA "
        "(nvidia-peermem) or the NIC refused the registration"),
    _signature(
        r"NET/IB ?: Got completion from peer .*?with (error |status=)(IBV_WC_\w+\()?"
        r"(?P<status>\d+)", "infiniband-transfer-failed",
        "an InfiniBand/RoCE transfer between the nodes failed (status {status})",
        "status 12, retries exhausted: the peer's rank died first (its node's log says "
        "why), or the link between them is down or flapping; 4 or 10, a protection or "
        "access error: GPU memory could not be registered for GPUDirect RDMA (load the "
        "nvidia-peermem module; NCCL_NET_GDR_LEVEL=LOC tries without it). `gpucluster "
        "doctor -w <node> --only infiniband` shows the ports' state"),
    _signature(
        r"(Read|Write) error \[[^\]]+\]:\d+: Connection timed out", "connection-timed-out",
        "a connection between ranks stopped carrying data",
        "the other node went away, or the network between them drops packets: the "
        "full-size ones where the nodes' MTU is larger than the path's; `gpucluster "
        "doctor --only ssh,peer-ports,path-mtu` says which"),
    _signature(
        r"remote process exited or there was a network error|unhandled system error|"
        r"socketStartConnect|NCCL WARN .*[Cc]onnect.* failed|Gloo connectFullMesh failed|"
        r"Connection (closed|reset) by peer \[|Connection closed by remote peer",
        "connection-lost",
        "a rank lost (or never made) its connection to another",
        "another rank died first, and its node's log says why; or ports between the "
        "nodes are closed, or NCCL picked the wrong interface: `gpucluster doctor --only "
        "rendezvous-port,peer-ports,interface`, `gpucluster provision --only firewall`; "
        "--debug logs the interface NCCL picks"),
)

# Causes that a start on the same nodes meets again: the script's own code, or what every
# node's python lacks or cannot do (the health checks between attempts look at GPUs and
# ports, not these). `launch --recover` gives up on the first of them.
NOT_MENDED_BY_RESTART = frozenset({
    "module-missing", "no-kernel-image", "no-gpu-for-torch", "driver-too-old",
    "gpu-shared-by-ranks", "gpu-index-missing", "checkpoint-device-missing",
    "collective-mismatch", "ddp-static-graph", "ddp-unused-parameters", "memlock-too-low"})

# A worker killed by a signal prints nothing of its own: the signal is the evidence.
def killed_by_sigkill(node: str, who: str = "the worker") -> KnownCause:
    return _named("killed", f"{who} was killed by SIGKILL: most often the kernel's "
                  "out-of-memory killer, for host memory", _HOST_OUT_OF_MEMORY_FIX, node)


def mended_by_restart(cause: KnownCause) -> bool:
    return cause.name not in NOT_MENDED_BY_RESTART


def _named(name: str, what: str, fix: str, node: str, fields: dict[str, str] | None = None,
           evidence: str = "") -> KnownCause:
    """A cause's words for this failure: its fields filled in, `<node>` in its fix the
    node."""
    return KnownCause(name, what.format(**(fields or {})),
                      fix.replace("<node>", node or "<node>"), evidence)


def error_lines(lines: Sequence[str]) -> list[str]:
    """The exception lines among `lines`, without torch's rank prefix, and without
    torchrun's own, which only says that a worker failed."""
    return [found.group(1) for line in lines
            if (found := _ERROR_LINE.fullmatch(line.strip()))
            and _TORCHRUN_FAILED not in found.group(1)]


def known_cause(lines: Sequence[str], node: str = "") -> KnownCause | None:
    """The first signature, in SIGNATURES' order, that one of the last lines matches;
    `<node>` in its fix becomes the node."""
    searched = lines[-LINES_SEARCHED:]
    for signature in SIGNATURES:
        for line in reversed(searched):
            found = signature.pattern.search(line)
            if found:
                fields = {k: v for k, v in found.groupdict().items() if v is not None}
                return _named(signature.name, signature.what, signature.fix, node, fields,
                              line.strip()[:EVIDENCE_CHARS])
    return None
