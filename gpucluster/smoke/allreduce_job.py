"""Run by torchrun on every node (never imported by the CLI: it needs torch).

All-reduce sweep over message sizes with warm-up, time, algbw and busbw as nccl-tests
define them (busbw = algbw * 2(n-1)/n), a correctness check of every result, and
per-node measurements to name a slow node: an all-reduce inside each node, a timed
compute kernel, and each node's link to the head (send/recv with global rank 0).
Rank 0 prints one line: `GPUCLUSTER_SMOKE <json>`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

LINK_TRIES = 3  # per-node measurements keep the best of this many tries


def timed_allreduce(tensor: torch.Tensor, iterations: int, group: object = None) -> float:
    """Seconds per all-reduce, averaged over `iterations` after a barrier."""
    dist.barrier(group=group)
    sync(tensor)
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor, group=group)
    sync(tensor)
    return (time.perf_counter() - started) / iterations


def sync(tensor: torch.Tensor) -> None:
    if tensor.is_cuda:
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="auto", help="bytes, comma-separated")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--link-bytes", type=int, default=1 << 20)
    parser.add_argument("--device", choices=("auto", "cuda"), default="auto",
                        help="cuda: the inventory says jobs here use the GPUs")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not use_cuda:
        # gloo on the CPU would pass for a cluster whose jobs cannot reach their GPUs
        torch.cuda.init()  # raises torch's own words: a CPU build, no driver...
        raise RuntimeError("CUDA is not available to torch here, where the inventory says "
                           "jobs use the GPUs")
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    hosts = gather_strings(socket.gethostname(), world, device)
    nodes = sorted(set(hosts), key=hosts.index)

    if args.sizes == "auto":  # GPUs: 1 MiB to 1 GiB; CPUs (gloo): 64 KiB to 4 MiB
        low, high = (1 << 20, 1 << 30) if use_cuda else (1 << 16, 1 << 22)
        args.sizes = ",".join(str(low << (2 * i)) for i in range(6) if low << (2 * i) <= high)
    sweep = run_sweep(args, device, rank, world)
    intra, compute = node_measures(args, device, rank, hosts, nodes)
    payload = torch.ones(max(1, args.link_bytes // 4), device=device)
    # intra busbw (NaN: a single rank on the node), compute seconds; from every rank.
    measures = gather_floats([float("nan") if intra is None else intra, compute], world,
                             device)
    links = timed_links(hosts, nodes, payload, rank)
    if rank == 0:
        per_node: dict[str, dict] = {}
        for host, (intra_busbw, compute_s) in zip(hosts, measures, strict=True):
            entry = per_node.setdefault(host, {"compute_s": [], "intra": []})
            entry["compute_s"].append(compute_s)
            if not math.isnan(intra_busbw):
                entry["intra"].append(intra_busbw)
        summary = {node: {"compute_s": max(values["compute_s"]),
                          "intra_busbw_gbps": statistics.median(values["intra"])
                          if values["intra"] else None,
                          "link_gbps": links.get(node)}
                   for node, values in per_node.items()}
        print("GPUCLUSTER_SMOKE " + json.dumps({
            "backend": backend, "world_size": world, "nodes": nodes,
            "ranks_per_node": {n: hosts.count(n) for n in nodes},
            "sweep": sweep, "per_node": summary}), flush=True)
    dist.destroy_process_group()


def gather_strings(text: str, world: int, device: torch.device) -> list[str]:
    """all_gather of a short string without object collectives (they need numpy)."""
    data = torch.zeros(256, dtype=torch.uint8, device=device)
    raw = text.encode()[:256]
    data[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    gathered = [torch.zeros_like(data) for _ in range(world)]
    dist.all_gather(gathered, data)
    return [bytes(t.cpu().tolist()).rstrip(b"\0").decode() for t in gathered]


def gather_floats(values: list[float], world: int, device: torch.device) -> list[list[float]]:
    data = torch.tensor(values, dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(data) for _ in range(world)]
    dist.all_gather(gathered, data)
    return [t.cpu().tolist() for t in gathered]


def run_sweep(args: argparse.Namespace, device: torch.device, rank: int, world: int
              ) -> list[dict]:
    """The all-reduce sweep: per size, a checked reduction, warm-up, then timing."""
    sweep = []
    expected = float(world * (world + 1) // 2)
    for size in (int(s) for s in args.sizes.split(",")):
        elements = max(1, size // 4)
        tensor = torch.full((elements,), float(rank + 1), device=device)
        dist.all_reduce(tensor)  # one reduction whose result every rank can check
        flags = torch.tensor([1 if bool(torch.all(tensor == expected).item()) else 0],
                             device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        seconds = timed_allreduce(tensor, args.iterations)
        algbw = elements * 4 * 8 / seconds / 1e9
        sweep.append({"bytes": elements * 4, "time_s": seconds, "algbw_gbps": algbw,
                      "busbw_gbps": algbw * 2 * (world - 1) / world,
                      "correct": bool(flags.item())})

    return sweep


def node_measures(args: argparse.Namespace, device: torch.device, rank: int,
                  hosts: list[str], nodes: list[str]) -> tuple[float | None, float]:
    """This rank's view of its node: all-reduce among the node's ranks, and a timed
    compute kernel. Nodes take turns, so that they do not slow each other down (on
    shared cores, or a shared switch) and a slow one stands out."""
    groups = {node: dist.new_group([r for r, h in enumerate(hosts) if h == node])
              for node in nodes}  # every rank must join the creation of every group
    mine = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == mine]
    intra: float | None = None
    compute = 0.0
    for node in nodes:
        dist.barrier()
        if node != mine:
            continue
        if len(local) > 1:
            tensor = torch.ones(1 << 18, device=device)
            seconds = min(timed_allreduce(tensor, args.iterations, groups[mine])
                          for _ in range(LINK_TRIES))  # best of: scheduling noise
            intra = tensor.numel() * 32 / seconds / 1e9 * 2 * (len(local) - 1) / len(local)
        compute = min(time_kernel(device) for _ in range(LINK_TRIES))
    dist.barrier()
    return intra, compute


def time_kernel(device: torch.device) -> float:
    """Seconds for a fixed compute kernel (matrix products)."""
    matrix = torch.rand(256, 256, device=device)
    sync(matrix)
    started = time.perf_counter()
    for _ in range(20):
        matrix = torch.tanh(matrix @ matrix)
    sync(matrix)
    return time.perf_counter() - started


def timed_links(hosts: list[str], nodes: list[str], payload: torch.Tensor,
                rank: int) -> dict[str, float]:
    """Gbit/s from the head's rank 0 to each other node's first rank, one node at a
    time, best of LINK_TRIES (a single short transfer is at the mercy of scheduling)."""
    results: dict[str, float] = {}
    for node in nodes[1:]:
        first = hosts.index(node)
        for _ in range(LINK_TRIES):
            dist.barrier()
            if rank == 0:
                started = time.perf_counter()
                dist.send(payload, dst=first)
                dist.recv(payload[:1], src=first)
                seconds = time.perf_counter() - started
                speed = payload.numel() * 4 * 8 / seconds / 1e9
                results[node] = max(results.get(node, 0.0), speed)
            elif rank == first:
                dist.recv(payload, src=0)
                dist.send(payload[:1], dst=0)
    dist.barrier()
    return results


if __name__ == "__main__":
    main()
