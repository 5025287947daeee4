"""`gpucluster logs`: a job's output from every node, live or as it is; searched and
merged in time order across nodes (and jobs), as text or as ECS JSON lines."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from gpucluster import hostrange
from gpucluster.cli import slurm_jobs
from gpucluster.cli.attach import attach
from gpucluster.cli.launch_cmd import JobArgument, job_store
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    load_inventory,
    open_session,
    stderr_console,
)
from gpucluster.errors import GpuclusterError

if TYPE_CHECKING:
    from gpucluster.inventory import Inventory
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.logsearch import LogFilter, LogLine


def logs(
    job: JobArgument = None,
    inventory: InventoryOption = None,
    follow_live: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep following until the job ends (Ctrl-C only detaches).")
    ] = False,
    node: Annotated[str | None, typer.Option(
        "--hosts", "-w", "--node", metavar="RANGE",
        help="Only these of the job's nodes, e.g. node2 or node[1-2].")] = None,
    rank: Annotated[str | None, typer.Option(
        "--rank", metavar="RANKS", help="Only these global ranks, e.g. 3 or 0,4-7.")] = None,
    grep: Annotated[str | None, typer.Option(
        "--grep", metavar="PATTERN", help="Only lines matching this regular expression.")
    ] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN", help="Only lines from then on: 10m, 2h, 13:05, "
                                        "2026-11-30T13:05.")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", metavar="WHEN", help="Only lines until then (same forms).")] = None,
    tail: Annotated[int | None, typer.Option(
        "--tail", "-n", min=0, metavar="N",
        help="Only the last N lines across the nodes, in time order (of those the other "
             "options keep); with -f, then the lines that come.")] = None,
    all_jobs: Annotated[bool, typer.Option(
        "--all-jobs", help="Every job the controller has logs of, merged in time order "
                           "(from its copies: nothing is fetched).")] = False,
    json_output: Annotated[bool, typer.Option(
        "--json", help="One JSON object per line in Elastic Common Schema names "
                       "(@timestamp, host.name, job.id, rank, stream, message).")] = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Show a job's output from every node (prefixed \\[node/rank]); -f follows it live.
    Also saved, one file per node, under .gpucluster/jobs/JOB/.

    With --grep, --rank, --since, --until, --all-jobs or --json, the lines are fetched,
    filtered and merged in time order across nodes, each with its time (and --tail keeps
    the last of them); with -f, --grep and --rank keep the lines as they come.

    JOB slurm-ID is a Slurm job: its output file (slurm-ID.out), read from its batch node;
    -w, --rank and --grep search it."""
    from gpucluster.launch import logsearch
    from gpucluster.slurm.queue import slurm_job

    loaded = load_inventory(inventory)
    keep = logsearch.LogFilter(
        logsearch.parse_pattern(grep) if grep is not None else None,
        *logsearch.time_window(since, until),
        frozenset(hostrange.hosts_option(node)) if node is not None else None,
        logsearch.parse_ranks(rank) if rank is not None else None)
    slurm_id = slurm_job(job)
    if slurm_id is not None:
        _slurm_logs(loaded, slurm_id, keep, follow_live, tail, all_jobs or json_output,
                    (accept_new_host_keys, ask_pass, connect_timeout))
        return
    store = job_store(loaded)
    if all_jobs:
        if job is not None or follow_live:
            raise GpuclusterError("--all-jobs reads every job the controller has: not with "
                                  "a JOB or -f (fix: drop one)")
        records = store.records()
        _print(logsearch.merged(store, records, keep, last=tail), json_output,
               across_jobs=True)
        return
    record = store.load(job)
    world = sum(record.nproc_per_node.values())
    if keep.ranks is not None and world and min(keep.ranks) >= world:
        raise GpuclusterError(f"--rank {rank}: job {record.id} had ranks 0-{world - 1} "
                              f"(fix: --rank within them)")
    if keep.nodes and (unknown := sorted(keep.nodes - set(record.hosts))):
        raise GpuclusterError(f"job {record.id} did not run on {hostrange.fold(unknown)} "
                              f"(fix: --hosts with one of {hostrange.fold(record.hosts)})")
    nodes = sorted(keep.nodes, key=record.hosts.index) if keep.nodes else None
    _check_askable(loaded, store, record, nodes or record.hosts)
    if follow_live and (since is not None or until is not None or json_output):
        raise GpuclusterError("-f shows the lines as they come, which have no time yet: not "
                              "with --since, --until or --json (fix: drop -f; a search "
                              "fetches the job's logs as they are now)")
    searching = any(x is not None for x in (grep, since, until, rank)) or json_output
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        if follow_live or not searching:
            attach(session, loaded, store, record, stderr_console(), live=follow_live,
                   fail_fast=False, grace=0, nodes=nodes, tail=tail,
                   keep=keep if searching else None)
            return
        from gpucluster.launch.follow import follow

        # Fetched into the copies here (a node's final copy is not fetched again).
        follow(session, loaded, record, store, live=False, fail_fast=False,
               stop_on_interrupt=False, nodes=nodes)
    found = logsearch.merged(store, [record], keep, last=tail)
    _print(found, json_output)
    if not found:
        print(_nothing_matched(store, record, keep), file=sys.stderr)


def _slurm_logs(inventory: Inventory, slurm_id: str, keep: LogFilter, live: bool,
                tail: int | None, timeless: bool,
                connecting: tuple[bool, bool, float | None]) -> None:
    """A Slurm job's output (slurm_jobs.output): its lines carry no time of their own;
    -w, --rank and --grep search it, live too."""
    from gpucluster.launch import logsearch

    job = f"slurm-{slurm_id}"
    if keep.since is not None or keep.until is not None or timeless:
        raise GpuclusterError(f"{job}: a Slurm job's lines carry no time of their own: "
                              f"--since, --until, --all-jobs and --json do not apply (fix: "
                              f"-w, --rank or --grep, or gpucluster logs {job} | grep ...)")
    searching = keep != logsearch.LogFilter()
    with open_session(inventory, *connecting) as session:
        slurm_jobs.output(session, inventory, slurm_id, live=live, tail=tail,
                          keep=keep if searching else None)


def _check_askable(inventory: Inventory, store: JobStore, record: JobRecord,
                   nodes: list[str]) -> None:
    """A node this inventory cannot ask about the job (the cluster shrank, or another
    cluster's inventory beside this one): say why, and how to read the others and that
    node's copy here."""
    from gpucluster.launch.control import elsewhere

    away = elsewhere(inventory, record, nodes)
    if not away:
        return
    others = [n for n in nodes if n not in away]
    copies = [str(store.node_log(record.id, n)) for n in away
              if store.node_log(record.id, n).exists()]
    raise GpuclusterError(
        f"job {record.id} cannot be read through this inventory: {'; '.join(away.values())} "
        f"(fix: {record.started_with()}"
        + (f", or -w {hostrange.fold(others)} for the others" if others else "")
        + (f"; the copy kept here: {', '.join(copies)}" if copies else "") + ")")


def _nothing_matched(store: JobStore, record: JobRecord, keep: LogFilter) -> str:
    """A search that found nothing says so, and where the ranks asked for ran when -w
    picked other nodes (a rank's node is only known from its lines)."""
    from gpucluster.launch import logsearch

    note = f"no line of job {record.id} matches"
    if keep.ranks is None or keep.nodes is None:
        return note
    homes = sorted({line.node for line in logsearch.merged(
        store, [record], logsearch.LogFilter(ranks=keep.ranks))}, key=record.hosts.index)
    if not homes or set(homes) & keep.nodes:
        return note
    ranks = hostrange.fold(str(r) for r in sorted(keep.ranks)).strip("[]")  # as --rank
    where = hostrange.fold(homes)
    return (f"{note}: rank{'s' if len(keep.ranks) > 1 else ''} {ranks} ran on {where} "
            f"(fix: -w {where}, or no -w)")


def _print(lines: list[LogLine], json_output: bool, across_jobs: bool = False) -> None:
    from gpucluster.launch import logsearch

    out = sys.stdout
    for line in lines:
        out.write((json.dumps(logsearch.ecs(line)) if json_output
                   else logsearch.text(line, across_jobs)) + "\n")
    out.flush()
