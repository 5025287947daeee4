"""A small DDP training job: gloo on CPUs, NCCL on GPUs; the loss falls as it learns.

It fits a linear model to a fixed random target, so the loss must fall. After every
epoch, local rank 0 of every node saves a checkpoint into the node's own
$GPUCLUSTER_CHECKPOINT_DIR (the weights are the same on every rank under DDP), so any
node that survives a failure can resume the job (`gpucluster launch --recover`), which
costs at most one epoch. Each step touches $GPUCLUSTER_HEARTBEAT_FILE: how recovery
tells a hung job from a slow one.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29500 examples/train.py --epochs 5
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def say(text: str) -> None:
    """One line in one write: torchrun's --tee copies each rank's output a readline() at
    a time, so a print() under PYTHONUNBUFFERED (text, then newline: two writes) can
    share a console line with another rank's."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--checkpoint-dir", default=os.environ.get(
        "GPUCLUSTER_CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument("--fail-at-epoch", type=int, default=None,
                        help="raise at this epoch, every attempt (a script's own bug)")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="sleep per step (to watch a run, or stop it halfway)")
    return parser.parse_args()


def saved_epochs(directory: Path) -> list[int]:
    names = directory.glob("epoch-*.pt") if directory.is_dir() else []
    return [int(p.stem.split("-")[1]) for p in names if p.stem.split("-")[1].isdigit()]


def save(directory: Path, epoch: int, state: dict[str, object], keep: int = 2) -> None:
    """Written beside and renamed (a node killed mid-save leaves the last whole one);
    the two newest are kept, so the ranks can agree on one every node has."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".epoch-{epoch}.pt.{os.getpid()}"
    torch.save(state, temporary)
    temporary.replace(directory / f"epoch-{epoch}.pt")
    for old in sorted(saved_epochs(directory))[:-keep]:
        (directory / f"epoch-{old}.pt").unlink(missing_ok=True)


def finish(device: torch.device) -> None:
    """Leave once every rank is done with its collectives."""
    use_cuda = device.type == "cuda"
    # On a GPU, named: else torch warns "barrier(): using the device under current
    # context" (seen on an H200), though set_device already chose this one.
    dist.barrier(device_ids=[device.index] if use_cuda else None)
    if use_cuda:
        dist.destroy_process_group()
        return
    # gloo's teardown (DDP's reducer, then the group) aborts a rank now and then
    # ("terminate called without an active exception", about 1 run in 10 here), which
    # fails a finished job: with nothing left to do, skip the destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    # Under `launch --recover`, a collective blocked on a dead peer ends in bounded time.
    timeout = os.environ.get("GPUCLUSTER_COLLECTIVE_TIMEOUT_S")
    dist.init_process_group("nccl" if use_cuda else "gloo",
                            timeout=timedelta(seconds=float(timeout)) if timeout else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same data and start on every rank
    inputs = torch.randn(512, 16)
    targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    model = torch.nn.Linear(16, 1).to(device)
    # Every rank reads its own node's checkpoints (the nodes need not share a
    # filesystem); all agree on the newest epoch every node has, and load that one.
    checkpoints = Path(args.checkpoint_dir)
    newest = torch.tensor([max(saved_epochs(checkpoints), default=-1)], device=device)
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    state = None
    if newest.item() >= 0:
        state = torch.load(checkpoints / f"epoch-{int(newest.item())}.pt", map_location=device)
        model.load_state_dict(state["model"])
        if rank == 0:
            say(f"resumed from epoch {state['epoch']} (attempt "
                f"{os.environ.get('GPUCLUSTER_ATTEMPT', '1')})")
    start_epoch = int(newest.item()) + 1
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    shard = torch.arange(rank, len(inputs), world)  # each rank its own slice of the data
    x, y = inputs[shard].to(device), targets[shard].to(device)
    say(f"rank {rank}/{world} on {socket.gethostname()} ready")
    heartbeat = os.environ.get("GPUCLUSTER_HEARTBEAT_FILE")
    for epoch in range(start_epoch, args.epochs):
        if epoch == args.fail_at_epoch:
            raise RuntimeError(f"staged failure at epoch {epoch}")
        for step in range(epoch * args.steps + 1, (epoch + 1) * args.steps + 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            if heartbeat:  # progress, and the step reached (recovery's report shows it)
                Path(heartbeat).write_text(f"{step}\n")
            time.sleep(args.step_delay)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            say(f"epoch {epoch} loss {total.item() / world:.4f}")
        if local_rank == 0:
            save(checkpoints, epoch, {"model": model.state_dict(),
                                      "optimizer": optimizer.state_dict(), "epoch": epoch})
    if rank == 0:
        say("done")
    finish(device)


if __name__ == "__main__":
    main()
