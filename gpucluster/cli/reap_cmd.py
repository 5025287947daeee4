"""`gpucluster reap`: stray GPU processes on every node; a dry run unless --yes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    AskSudoPassOption,
    ConnectTimeoutOption,
    GroupOption,
    HostsOption,
    InventoryOption,
    JsonOption,
    finite,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.errors import EXIT_FAILED, GpuclusterError
from gpucluster.wording import counted

if TYPE_CHECKING:
    from gpucluster.observe.model import GpuProcess
    from gpucluster.observe.reap import Ended, NodeProcesses

_OWNER_TEXT = {"running": "running (never touched)", "leftover": "ended: a leftover",
               "slurm": "running (never touched)",
               "foreign": "foreign (not gpucluster's)"}


def reap(
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="End the leftovers (TERM, grace, KILL); without it, only list.")
    ] = False,
    foreign: Annotated[bool, typer.Option(
        "--foreign", help="With --yes, end processes that are not gpucluster's too.")] = False,
    grace: Annotated[float, typer.Option(
        "--grace", min=0, max=600, metavar="SECONDS", callback=finite,
        help="Between TERM and KILL.")] = 10.0,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", metavar="LIST",
        help="Only the processes on these GPUs of each node, e.g. 4-7 or 0,2 (those a "
             "launch --gpus would use): listed and ended; the others' left alone.")
    ] = None,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """List every process holding a GPU on every node: whether it belongs to a running
    gpucluster job (never touched), an ended one (a leftover) or nothing of ours
    (foreign). --yes ends the leftovers and confirms their GPU memory is freed;
    --foreign adds the foreign ones."""
    from gpucluster.doctor.gpu_selection import from_option
    from gpucluster.observe import reap as core

    chosen = from_option(gpus) if gpus is not None else None
    if ask_sudo_pass and not yes:
        raise GpuclusterError("--ask-sudo-pass is for --yes: a dry run ends nothing and "
                              "needs no sudo (fix: add --yes, or leave the option out)")
    loaded = load_inventory(inventory)
    selected = loaded.select(hosts, group)
    out, err = stdout_console(), stderr_console()
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session:
        listed = core.list_processes(session, loaded, selected, chosen)
        ended = {}
        if yes:
            from gpucluster.remote.sudo_check import require_sudo_password

            require_sudo_password(session, core.needing_sudo(loaded, listed, foreign),
                                  "reap --yes", "reap ended nothing")
            ended = core.end(session, loaded, listed, foreign, grace)
    failed = False
    payload: dict[str, Any] = {"schema": 1, "dry_run": not yes,
                               "gpus": ",".join(chosen.entries) if chosen else None,
                               "nodes": []}
    quiet = [host for host, node in listed.items()
             if not node.processes and not node.error and not node.no_gpus]
    gpu_less = [host for host, node in listed.items() if node.no_gpus]
    for host, node in listed.items():
        done = ended.get(host)
        left = {p.pid: why for p, why in done.left} if done else {}
        mine = {p.pid for p in done.targets} if done else set()
        failed = failed or bool(node.error) or bool(left) or bool(done and done.error)
        payload["nodes"].append({
            "host": host, "error": node.error or (done.error if done else "") or None,
            "no_gpus": node.no_gpus, "on_other_gpus": node.elsewhere,
            "freed_mib": done.freed_mib if done else 0,
            "processes": [{**_process_json(p), "ended": p.pid in mine and p.pid not in left,
                           "left": left.get(p.pid)} for p in node.processes]})
        if not json_output and host not in quiet and host not in gpu_less:
            _print_node(err, host, node, done, left, mine, yes, foreign)
    if quiet and not json_output:  # one line for all of them, not one per node
        err.print(f"{escape(hostrange.fold(quiet))}: no GPU processes"
                  + (f" on {chosen}" if chosen else ""))
    elsewhere = {host: node.elsewhere for host, node in listed.items() if node.elsewhere}
    if elsewhere and chosen and not json_output:
        for count, hosts_alike in hostrange.hosts_by((n, h) for h, n in elsewhere.items()
                                                     ).items():
            err.print(f"{escape(hostrange.fold(hosts_alike))}: "
                      f"{counted(count, 'process', 'processes')} on GPUs other than "
                      f"{chosen}: left alone")
    if gpu_less and not json_output:
        err.print(f"{escape(hostrange.fold(gpu_less))}: no GPUs (no nvidia-smi there)")
    if json_output:
        out.file.write(json.dumps(payload, indent=2) + "\n")
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _process_json(process: GpuProcess) -> dict[str, Any]:
    return {"pid": process.pid, "user": process.user, "gpu_uuid": process.gpu_uuid,
            "gpu_index": process.gpu_index,
            "used_mib": process.used_mib, "state": process.state, "job": process.job,
            "rank": process.rank, "slurm_job": process.slurm_job, "owner": process.owner}


def _print_node(err: Console, host: str, node: NodeProcesses, done: Ended | None,
                left: dict[int, str], mine: set[int], yes: bool, foreign: bool) -> None:
    if node.error:
        err.print(f"[bold red]{escape(host)}[/]: {escape(node.error)}")
    if not node.processes:
        return
    for p in node.processes:
        # The index, as nvidia-smi and CUDA_VISIBLE_DEVICES say; else the uuid's end
        gpu = str(p.gpu_index) if p.gpu_index is not None else f"…{p.gpu_uuid[-12:]}"
        job = f"job {p.job} rank {p.rank}, " if p.job else (
            f"Slurm job {p.slurm_job}, " if p.slurm_job else "")
        action = ""
        if p.pid in left:
            action = f" [bold red]LEFT: {escape(left[p.pid])}[/]"
        elif p.pid in mine:
            action = " [green]ended[/]"
        elif not yes and (p.owner == "leftover" or (p.owner == "foreign" and foreign)):
            action = " (would end with --yes)"
        elif p.owner == "foreign" and not foreign:
            action = " (left alone: --foreign to end it)"
        err.print(f"{escape(host)} pid {p.pid} {escape(p.user)} GPU {gpu} "
                  f"{p.used_mib or 0} MiB state {p.state}: {job}{_OWNER_TEXT[p.owner]}"
                  f"{action}")
    if done is not None and done.freed_mib:
        err.print(f"{escape(host)}: freed {done.freed_mib} MiB of GPU memory (confirmed by "
                  f"nvidia-smi)")
    if done is not None and done.error:
        err.print(f"[bold red]{escape(host)}[/]: {escape(done.error)}")
