"""`gpucluster stacks`: where each rank of a running job is, for people and as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from gpucluster.launch import hang_stacks, live_stacks
from gpucluster.launch.hang_stacks import StackGroup
from gpucluster.launch.live_stacks import NodeStacks


def print_stacks(out: Console, err: Console, job_id: str, looked: Mapping[str, NodeStacks],
                 groups: tuple[StackGroup, ...], kept: Path) -> None:
    """The ranks by place on stdout; each node not read, or without a rank, on stderr."""
    for line in hang_stacks.said(groups, kept, f"where each rank of job {job_id} is now",
                                 live_stacks.NO_STACK):
        out.print(line, markup=False, highlight=False)
    for node, result in sorted(looked.items()):
        if result.error:
            err.print(f"{node}: not read: {result.error}", markup=False, highlight=False)
        elif not result.workers:
            err.print(f"{node}: no rank of the job runs there", markup=False, highlight=False)


def stacks_payload(job_id: str, looked: Mapping[str, NodeStacks],
                   groups: tuple[StackGroup, ...], kept: Path) -> dict[str, Any]:
    return {"job": job_id, "stacks": hang_stacks.payload(groups), "kept": str(kept),
            "nodes": {node: {"ranks": result.workers, "error": result.error or None}
                      for node, result in sorted(looked.items())}}
