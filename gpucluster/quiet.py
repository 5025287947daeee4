"""A running job's quiet: how long since its newest output or heartbeat. A hang is quiet
(NCCL keeps the GPUs busy while every rank waits), so `jobs`, `top` and the exporter say
it: each node measures it by its own clock from the job's node.log and heartbeat file
(the script's touch of $GPUCLUSTER_HEARTBEAT_FILE each step)."""

from __future__ import annotations

from gpucluster.wording import ago

QUIET_SAID_S = 60  # a job quiet this long is said to be


def quiet_words(seconds: float) -> str:
    return f"quiet for {ago(seconds)}: no output or heartbeat on any node"
