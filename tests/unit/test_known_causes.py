"""A failed job's likely cause, from the words torch, NCCL, gloo, CUDA and Python print:
each signature on its real message (torch's own format strings, and gloo's line as the
sandbox printed it), its order against the echoes of a failure on other ranks, and the
first failure reading it from a node's log."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gpucluster.launch.failure import failure_of
from gpucluster.launch.known_causes import known_cause
from gpucluster.launch.model import NodeState

# The sandbox's own (torch 2.13, gloo): rank 3 killed, its peers' next all_reduce.
GLOO_PEER_GONE = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:553] Connection closed by peer [198.18.0.11]:47503. This is typically caused "
    "by a remote worker crashing. Check the logs of the remote worker before reporting an "
    "error. GLHF!")
# The sandbox's, with node2's and node3's full-size packets dropped (sandbox up --mtu):
# node3's rank after about 30 s of an all-reduce with node2.
GLOO_TIMED_OUT = (
    "[rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:537] Read error [198.18.5.12]:62888: Connection timed out. This is typically "
    "caused by a remote worker hanging or bugs in the application. Check the logs of the "
    "remote worker before reporting an error. GLHF!")
CUDA_OOM = (
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
    "has a total capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch "
    "memory, this process has 138.70 GiB memory in use. Of the allocated memory 120.50 GiB "
    "is allocated by PyTorch, and 16.98 GiB is reserved by PyTorch but unallocated.")

MESSAGES = {
    CUDA_OOM: ("gpu-out-of-memory", "the GPU ran out of memory"),
    "ModuleNotFoundError: No module named 'flash_attn'": (
        "module-missing", "the nodes' python has no module 'flash_attn'"),
    "RuntimeError: CUDA error: no kernel image is available for execution on the device": (
        "no-kernel-image", "this torch build has no kernels for the GPU's architecture"),
    "RuntimeError: CUDA error: uncorrectable ECC error encountered": (
        "gpu-ecc-error", "the GPU hit an uncorrectable ECC error (hardware)"),
    "RuntimeError: CUDA error: an illegal memory access was encountered": (
        "illegal-memory-access", "a CUDA kernel accessed memory out of bounds"),
    # NCCL's words (init.cc) for two ranks on one GPU: before 2.28, and since.
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000": (
        "gpu-shared-by-ranks", "two ranks of a node used the same GPU, which NCCL refuses"),
    "node1:81:96 [1] init.cc:1141 NCCL WARN Multiple Ranks are using the same "
    "GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.": (
        "gpu-shared-by-ranks", "two ranks of a node used the same GPU, which NCCL refuses"),
    # NCCL's own allocation, and its InfiniBand completions as three versions word them.
    "node1:81:96 [1] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'": (
        "gpu-out-of-memory", "the GPU ran out of memory"),
    "node2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from "
    "peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)": (
        "infiniband-transfer-failed",
        "an InfiniBand/RoCE transfer between the nodes failed (status 12)"),
    "node1:185303:186751 [1] transport/net_ib.cc:2453 NCCL WARN NET/IB: Got completion from "
    "peer 10.99.91.63<51161> with status=4 opcode=32614 len=32614 vendor err 81 (Send)": (
        "infiniband-transfer-failed",
        "an InfiniBand/RoCE transfer between the nodes failed (status 4)"),
    # NCCL's user guide names both for the locked-memory limit.
    "node1:1:2 [0] misc/ibvwrap.cc:252 NCCL WARN Call to ibv_reg_mr failed with error Cannot "
    "allocate memory": ("memlock-too-low",
                        "NCCL could not register pinned memory for InfiniBand/RoCE"),
    "NCCL WARN Call to ibv_create_qp failed": (
        "memlock-too-low", "NCCL could not register pinned memory for InfiniBand/RoCE"),
    "node2:319733:319761 [1] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion "
    "from peer 10.153.235.13<40554> with status=IBV_WC_RETRY_EXC_ERR(12) "
    "opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 hca mlx5_1": (
        "infiniband-transfer-failed",
        "an InfiniBand/RoCE transfer between the nodes failed (status 12)"),
    "torch.AcceleratorError: CUDA error: out of memory": (
        "gpu-out-of-memory", "the GPU ran out of memory"),
    # torch's own words (CUDAHooks, ProcessGroupNCCL, torch/cuda) for a GPU it cannot use
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
    "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx": (
        "no-gpu-for-torch", "torch found no GPU it could use on the node"),
    "[rank0]: ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!": (
        "no-gpu-for-torch", "torch found no GPU it could use on the node"),
    "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found "
    "version 12080). Please update your GPU driver by downloading and installing a new "
    "version from the URL: http://www.nvidia.com/Download/index.aspx": (
        "driver-too-old", "this torch build needs a newer NVIDIA driver than the node has"),
    "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version": (
        "driver-too-old", "this torch build needs a newer NVIDIA driver than the node has"),
    "RuntimeError: CUDA error: system not yet initialized": (
        "fabric-not-ready",
        "CUDA could not start on the node's GPUs (system not yet initialized)"),
    "OSError: [Errno 28] No space left on device: '/srv/checkpoints/step-1000.pt'": (
        "disk-full",
        "the disk holding /srv/checkpoints/step-1000.pt was full (No space left on device)"),
    "OSError: [Errno 28] No space left on device": (
        "disk-full", "a disk the job wrote to was full (No space left on device)"),
    "RuntimeError: [enforce fail at inline_container.cc:764] . PytorchStreamWriter failed "
    "writing file data/0: file write failed": (
        "disk-full", "a disk the job wrote to was full (torch.save says 'unexpected pos')"),
    "[rank9]: torch.AcceleratorError: CUDA error: invalid device ordinal": (
        "gpu-index-missing", "a rank asked for a GPU its node does not have"),
    "RuntimeError: Attempting to deserialize object on CUDA device 3 but "
    "torch.cuda.device_count() is 1. Please use torch.load with map_location to map your "
    "storages to an existing device.": (
        "checkpoint-device-missing",
        "a checkpoint saved from cuda:3 was loaded where a process sees 1 GPU(s)"),
    "node2:1234:1234 [1] NCCL WARN Error while creating shared memory segment "
    "/dev/shm/nccl-x (size 9637888)": ("shared-memory-full", "shared memory (/dev/shm) ran out"),
    "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
    "collective: CollectiveFingerPrint(OpType=ALLREDUCE": (
        "collective-mismatch", "the ranks called different collectives"),
    "RuntimeError: Expected to have finished reduction in the prior iteration before "
    "starting a new one. This error indicates that your module has parameters that were "
    "not used in producing loss.": (
        "ddp-unused-parameters", "DDP found parameters that took no part in the loss"),
    "RuntimeError: Expected to have finished reduction in the prior iteration before "
    "starting a new one. This error indicates that your training graph has changed in this "
    "iteration, e.g., one parameter is used in first iteration, but then got unused in the "
    "second iteration. this is not compatible with static_graph set to True.": (
        "ddp-static-graph", "DDP with static_graph=True saw the parameters used change "
        "from one step to the next"),
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, "
    "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.": (
        "collective-timeout", "a collective waited past its timeout: a hang"),
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
    "waiting 1800000ms for recv operation to complete": (
        "collective-timeout", "a collective waited past its timeout: a hang"),
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
    "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
    "message: address already in use": ("port-in-use", "a port the job listens on was taken"),
    "torch.distributed.DistNetworkError: The client socket has timed out after 900000ms "
    "while trying to connect to (10.0.0.1, 29500).": (
        "rendezvous-unreachable", "a node could not reach the rendezvous at 10.0.0.1:29500"),
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version "
    "2.21.5": ("connection-lost", "a rank lost (or never made) its connection to another"),
    GLOO_PEER_GONE: ("connection-lost", "a rank lost (or never made) its connection to another"),
    GLOO_TIMED_OUT: ("connection-timed-out", "a connection between ranks stopped carrying data"),
}


@pytest.mark.parametrize("message", list(MESSAGES))
def test_each_known_message_is_named_with_its_fix(message: str) -> None:
    cause = known_cause(["Traceback (most recent call last):", "  ...", message], "node2")
    assert cause is not None
    assert (cause.name, cause.what) == MESSAGES[message]
    assert cause.fix and "<node>" not in cause.fix
    assert cause.evidence == message.strip()[:200]


@pytest.mark.parametrize("line", [
    "ValueError: bad learning rate",
    # Not the distributed layer's words: a download failing is the script's own error.
    "ConnectionResetError: [Errno 104] Connection reset by peer",
    "epoch 3: saved to /srv/checkpoints (address already known)",
])
def test_an_error_of_the_scripts_own_is_not_given_a_cause(line: str) -> None:
    assert known_cause(["Traceback (most recent call last):", line]) is None


def test_the_root_is_named_before_its_echoes_and_only_near_the_end() -> None:
    # An out-of-memory rank makes the others lose their connections: the root wins,
    # wherever the lines stand.
    for lines in ([CUDA_OOM, GLOO_PEER_GONE, "frame #0"], [GLOO_PEER_GONE, CUDA_OOM]):
        found = known_cause(lines)
        assert found is not None and found.name == "gpu-out-of-memory", lines
    # An error the script caught and lived on after, far above the end, is not the cause.
    assert known_cause([CUDA_OOM, *(f"step {i}" for i in range(100)), "ValueError: x"]) is None


def test_ranks_sharing_a_gpu_are_named_from_nccls_last_error_not_its_header() -> None:
    # torch's DistBackendError heads NCCL's error; the why is its "Last error:" line.
    lines = [
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
        "distributed/c10d/ProcessGroupNCCL.cpp:3356, invalid usage (run with "
        "NCCL_DEBUG=WARN for details), NCCL version 2.21.5",
        "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
        "[rank1]: Last error:",
        "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000"]
    found = known_cause(lines, "node2")
    assert found is not None and found.name == "gpu-shared-by-ranks"
    assert "set_device(int(os.environ['LOCAL_RANK']))" in found.fix
    assert "gpucluster doctor -w node2 --only gpu-count,mig" in found.fix


def test_a_checkpoint_saved_to_a_full_disk_is_named_from_torchs_own_words() -> None:
    """torch.save onto a full disk (/dev/full answers every write with ENOSPC) says only
    `unexpected pos N vs M`: torch's real words, from this machine's torch."""
    import subprocess
    import sys

    saved = subprocess.run(
        [sys.executable, "-c", "import torch; torch.save({'w': torch.zeros(100000)}, "
                               "'/dev/full')"],
        capture_output=True, text=True, timeout=120, check=False)
    assert saved.returncode == 1, saved.stderr
    cause = known_cause(saved.stderr.splitlines(), "node2")
    assert cause is not None and cause.name == "disk-full", saved.stderr
    assert "unexpected pos" in cause.evidence or "file write failed" in cause.evidence
    assert "gpucluster doctor -w node2 --only disk" in cause.fix
    # /dev/shm full is shared memory's, not a disk's
    shm = "OSError: [Errno 28] No space left on device: '/dev/shm/torch_123_456'"
    assert getattr(known_cause([shm]), "name", None) == "shared-memory-full"


def test_a_cpu_build_of_torch_asked_for_a_gpu_says_so_in_torchs_own_words() -> None:
    """This machine's torch is a CPU build, as the sandbox nodes' is: asked for a GPU, it
    raises what a GPU node with the wrong wheel would (set_device: an AttributeError that
    names no GPU at all)."""
    import subprocess
    import sys

    for asking in ("torch.cuda.set_device(0)", "torch.zeros(1).cuda()"):
        asked = subprocess.run([sys.executable, "-c", f"import torch; {asking}"],
                               capture_output=True, text=True, timeout=120, check=False)
        assert asked.returncode == 1, asked.stderr
        cause = known_cause(asked.stderr.splitlines(), "node3")
        assert cause is not None and cause.name == "no-gpu-for-torch", asked.stderr
        assert "gpucluster doctor -w node3 --only nvidia-smi,torch-build,container-toolkit" in \
            cause.fix


def test_a_dataloader_worker_killed_is_named_from_torchs_own_words() -> None:
    """A DataLoader worker short of /dev/shm dies of SIGBUS, one the kernel's OOM killer
    chose of SIGKILL; torch's last exception says only that a worker `exited
    unexpectedly`, the lines above it why. The signal is sent here by the worker itself,
    through the real DataLoader."""
    import subprocess
    import sys

    for signal_name, expected in (("SIGBUS", "shared-memory-full"),
                                  ("SIGKILL", "dataloader-killed")):
        script = ("import os, signal\n"
                  "from torch.utils.data import DataLoader, Dataset\n"
                  "class Dies(Dataset):\n"
                  "    def __len__(self): return 4\n"
                  f"    def __getitem__(self, i): os.kill(os.getpid(), signal.{signal_name})\n"
                  "for batch in DataLoader(Dies(), num_workers=1): pass\n")
        died = subprocess.run([sys.executable, "-c", script], capture_output=True,
                              timeout=120, check=False)
        lines = died.stderr.decode(errors="replace").splitlines()
        assert died.returncode == 1 and "exited unexpectedly" in lines[-1], lines
        cause = known_cause(lines, "node2")
        assert cause is not None and cause.name == expected, lines
        assert "fewer DataLoader workers" in cause.fix and "<node>" not in cause.fix


def test_the_first_failure_reads_the_failing_ranks_words_not_another_ranks(
        tmp_path: Path) -> None:
    """Rank 3 failed (torchrun's root cause); rank 2 on the same node printed the echo."""
    log = tmp_path / "node2.log"
    log.write_text("\n".join([
        f"[2]:{GLOO_PEER_GONE}", f"[3]:{CUDA_OOM}",
        "Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-05_01:16:44",
        "  host      : node2", "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 1 (pid: 2028)"]) + "\n")
    state = NodeState("node2", "exited", exit_code=1)
    failure = failure_of("node2", state, log)
    assert failure.rank == 3 and failure.cause is not None
    assert failure.cause.name == "gpu-out-of-memory"
    log.write_text(log.read_text().replace(f"[3]:{CUDA_OOM}", "[3]:ValueError: x"))
    assert failure_of("node2", state, log).cause is None  # rank 2's echo is not rank 3's
    # A worker killed by SIGKILL printed nothing: the signal says it, with the node's fix.
    log.write_text(log.read_text().replace("exitcode  : 1", "exitcode  : -9"))
    killed = failure_of("node2", state, log).cause
    assert killed is not None and killed.name == "killed"
    assert "gpucluster run -w node2 --sudo 'dmesg" in killed.fix


def test_a_rendezvous_the_agent_could_not_reach_is_read_from_its_own_lines(
        tmp_path: Path) -> None:
    """No rank ran: torchrun's own lines (no rank prefix) say why."""
    log = tmp_path / "node3.log"
    log.write_text("torch.distributed.DistNetworkError: The client socket has timed out "
                   "after 60000ms while trying to connect to (node1, 29500).\n")
    failure = failure_of("node3", NodeState("node3", "exited", exit_code=1), log)
    assert failure.rank is None and failure.cause is not None
    assert failure.cause.what == "a node could not reach the rendezvous at node1:29500"


def test_a_ranks_traceback_far_above_its_last_lines_is_still_what_it_died_of(
        tmp_path: Path) -> None:
    """torchrun copies a rank's stdout and stderr into the log apart: a rank that printed
    15 MB left 11000 lines of its stdout after its traceback (seen on the sandbox). Its
    last lines were `step ...`, and neither the summary nor the cause named the error."""
    from gpucluster.cli.views.launch import outcome_payload, print_outcome
    from gpucluster.launch.attempt_report import signature
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import JobOutcome

    traceback = ["[rank3]: Traceback (most recent call last):",
                 '[rank3]:   File "/srv/proj/train.py", line 40, in <module>',
                 "[rank3]:     loss = model(batch)", CUDA_OOM]
    steps = [f"step {i} loss 0.1" for i in range(2000)]
    # Lines of its stdout copied between its traceback's are not part of it; one not yet
    # ended when the traceback came has it glued on (seen on the sandbox).
    rank_lines = [*steps[:4], steps[4] + traceback[0], traceback[1], steps[5],
                  steps[6] + traceback[2], traceback[3], *steps[7:]]
    log = tmp_path / "node2.log"
    log.write_text("\n".join([*(f"[3]:{line}" for line in rank_lines),
                              "Root Cause (first observed failure):", "[0]:",
                              "  host      : node2", "  rank      : 3 (local_rank: 1)",
                              "  exitcode  : 1 (pid: 2028)"]) + "\n")
    state = NodeState("node2", "exited", exit_code=1)
    failure = failure_of("node2", state, log)
    assert failure.rank_error == (
        "Traceback (most recent call last):", '  File "/srv/proj/train.py", line 40, in '
        '<module>', "    loss = model(batch)", CUDA_OOM.removeprefix("[rank3]: "))
    assert failure.error_came_before and failure.rank_tail[-1] == "step 1999 loss 0.1"
    assert failure.cause is not None and failure.cause.name == "gpu-out-of-memory"
    record = JobRecord("20261205-150000-abcd", "train.py", [], ["node2"], "/c", "/j", 0.0,
                       {"node2": 2})
    outcome = JobOutcome(record, states={"node2": state}, first_failure=failure)
    assert signature(outcome) == (3, CUDA_OOM.removeprefix("[rank3]: "))
    store = JobStore(tmp_path / ".gpucluster")
    console = Console(width=400, record=True, file=io.StringIO())
    print_outcome(console, outcome, store)
    shown = console.export_text()
    assert ("last traceback of rank 3 (more of its output came after it):\n"
            "  Traceback (most recent call last):\n") in shown
    assert shown.index("torch.OutOfMemoryError") < shown.index("last lines of rank 3")
    assert outcome_payload(outcome, store)["first_failure"]["rank_error"][-1] == \
        CUDA_OOM.removeprefix("[rank3]: ")
    # At the end of its lines, the traceback is shown once, as its last lines.
    log.write_text("\n".join([*(f"[3]:{line}" for line in [*steps, *traceback]),
                              "Root Cause (first observed failure):",
                              "  rank      : 3 (local_rank: 1)",
                              "  exitcode  : 1 (pid: 2028)"]) + "\n")
    at_end = failure_of("node2", state, log)
    assert at_end.rank_error and not at_end.error_came_before
    console = Console(width=400, record=True, file=io.StringIO())
    print_outcome(console, JobOutcome(record, {"node2": state}, at_end), store)
    assert "last traceback" not in console.export_text()
    # Killed by a signal, it printed no error: a traceback of its is one it lived on after.
    log.write_text(log.read_text().replace("exitcode  : 1", "exitcode  : -9"))
    assert failure_of("node2", state, log).rank_error == ()


def test_the_last_of_several_tracebacks_is_taken_without_its_prefix_or_its_length() -> None:
    from gpucluster.launch.failure import last_traceback

    caught = ["Traceback (most recent call last):", '  File "a.py", line 1', "KeyError: 'x'"]
    chained = ["Traceback (most recent call last):", *(f'  File "b.py", line {i}'
                                                      for i in range(40)),
               "ValueError: the last one"]
    lines = [*caught, "going on", *chained, "step 9"]
    found = last_traceback(lines)
    assert found[0] == chained[0] and found[1] == "  ..." and found[-1] == chained[-1]
    assert len(found) == 12
    assert last_traceback(["step 1", "no traceback here"]) == []


def test_every_cause_no_restart_mends_is_a_signatures_name() -> None:
    """NOT_MENDED_BY_RESTART names signatures by their names: a misspelt one would never
    match, and launch --recover would retry that cause again."""
    from gpucluster.launch.known_causes import NOT_MENDED_BY_RESTART, SIGNATURES

    assert {signature.name for signature in SIGNATURES} >= NOT_MENDED_BY_RESTART


def test_an_exception_line_the_tee_cut_in_two_is_read_whole(tmp_path: Path) -> None:
    """Python writes an exception's type, ': ' and its message apart; torchrun's tee,
    reading the rank's file as it grows, wrote `OSError` as a line of its own and the
    message as the next (a CI run), and the job's failure read `OSError`."""
    from gpucluster.launch.failure import in_a_line
    from gpucluster.launch.tee_lines import rejoined

    log = tmp_path / "node3.log"
    for cut in (["[2]:OSError", "[2]:: [Errno 122] Disk quota exceeded: /data/shard-2"],
                ["[2]:OSError: ", "[2]:[Errno 122] Disk quota exceeded: /data/shard-2"]):
        log.write_text("\n".join([
            "[2]:Traceback (most recent call last):", '[2]:  File "main.py", line 4',
            *cut, "Root Cause (first observed failure):", "[0]:",
            "  host      : node3", "  rank      : 2 (local_rank: 0)",
            "  exitcode  : 1 (pid: 2028)"]) + "\n")
        failure = failure_of("node3", NodeState("node3", "exited", exit_code=1), log)
        assert in_a_line(failure) == \
            "rank 2 on node3: OSError: [Errno 122] Disk quota exceeded: /data/shard-2"
    # Only an exception's type is joined so: a line that merely ends a sentence is not.
    assert rejoined(["done", ": next"]) == ["done", ": next"]
    assert rejoined(["torch.OutOfMemoryError", ": CUDA out of memory"]) == [
        "torch.OutOfMemoryError: CUDA out of memory"]
