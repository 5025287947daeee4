"""A small DDP training job: gloo on CPUs, NCCL on GPUs; the loss falls as it learns.

It fits a linear model to a fixed random target, so the loss must fall. Rank 0 saves
a checkpoint after every epoch and the job resumes from it when restarted (torchrun
--max-restarts), so a node failure costs at most one epoch.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29500 examples/train.py --epochs 5
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="sleep per step (to watch a run, or stop it halfway)")
    return parser.parse_args()


def finish(use_cuda: bool) -> None:
    """Leave once every rank is done with its collectives."""
    dist.barrier()
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
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same data and start on every rank
    inputs = torch.randn(512, 16)
    targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    model = torch.nn.Linear(16, 1).to(device)
    # Only rank 0 reads the checkpoint (the nodes need not share a filesystem): it
    # broadcasts where to resume, and DDP copies rank 0's weights to every rank.
    checkpoint = Path(args.checkpoint)
    state = None
    if rank == 0 and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        print(f"resumed from {checkpoint} at epoch {state['epoch'] + 1}", flush=True)
    start = torch.tensor([state["epoch"] + 1 if state else 0], device=device)
    dist.broadcast(start, src=0)
    start_epoch = int(start.item())
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])

    shard = torch.arange(rank, len(inputs), world)  # each rank its own slice of the data
    x, y = inputs[shard].to(device), targets[shard].to(device)
    print(f"rank {rank}/{world} on {socket.gethostname()} ready", flush=True)
    for epoch in range(start_epoch, args.epochs):
        for _ in range(args.steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            time.sleep(args.step_delay)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total.item() / world:.4f}", flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, checkpoint)
    if rank == 0:
        print("done", flush=True)
    finish(use_cuda)


if __name__ == "__main__":
    main()
