"""`gpucluster top` (the cluster's GPUs live) and `gpucluster exporter` (the same samples
as Prometheus metrics)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

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
    from gpucluster.inventory import Host, Inventory
    from gpucluster.observe.slurm_queue import QueuePoller
    from gpucluster.observe.streams import ClusterStreams
    from gpucluster.remote.session import Session

IntervalOption = Annotated[float, typer.Option(
    "--interval", min=0.1, max=60, metavar="SECONDS", callback=finite,
    help="Seconds between samples.")]


def top(
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    interval: IntervalOption = 1.0,
    once: Annotated[bool, typer.Option(
        "--once", help="Print one snapshot (every node's first sample) and exit.")] = False,
    compact: Annotated[bool, typer.Option(
        "--compact", help="A line per node, not per GPU (the live view does so by itself "
        "when a line per GPU would not fit the terminal).")] = False,
    json_output: JsonOption = False,
    job: Annotated[str | None, typer.Option(
        "--job", "-j", metavar="JOB", help="Only the nodes this job runs on: its id, a "
        "unique part of it, last, or slurm-ID for a Slurm job.")] = None,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Every node's GPUs live: utilisation, memory, temperature, power, ECC/Xid errors,
    the job and rank of each GPU process, and the cluster network's rates.

    One SSH connection and one sampler per node; a node that stops answering is marked
    stale with its age. A terminal too small for a line per GPU gets a line per node. In
    the live view, q quits and c switches between a line per GPU and a line per node.
    --json prints one JSON snapshot per interval (one per line), or one with --once."""
    from gpucluster.cli.views.top import render
    from gpucluster.observe.slurm_queue import polled_where_set_up
    from gpucluster.observe.snapshot import take, to_json
    from gpucluster.observe.streams import ClusterStreams
    from gpucluster.slurm.follow import running_nodes
    from gpucluster.slurm.queue import QUERY_TIMEOUT_S, slurm_job

    loaded = load_inventory(inventory)
    selected = loaded.select(hosts, group)
    slurm_id = slurm_job(job)
    if job is not None and slurm_id is None:  # ours: from its record, before any prompt
        selected = _job_nodes(loaded, selected, job, hosts or group)
    out = stdout_console()
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session:
        if slurm_id is not None:
            selected = _on_nodes(f"Slurm job {slurm_id} runs", running_nodes(
                session, slurm_id, "gpucluster top without --job"), loaded, selected,
                hosts or group)
        with _sudo_checked(session, selected, "top"), \
                ClusterStreams(session, loaded, selected, interval) as streams, \
                polled_where_set_up(session, loaded) as slurm:
            streams.wait_first(max(h.connect_timeout or 10.0 for h in selected) + 20.0)
            if once:
                if slurm is not None:
                    slurm.wait_first(QUERY_TIMEOUT_S)
                snapshot = take(streams, slurm)
                if json_output:
                    out.file.write(json.dumps(to_json(snapshot), indent=2) + "\n")
                else:
                    out.print(render(snapshot, out, compact))
                if any(n.sample is None for n in snapshot.nodes):
                    raise typer.Exit(EXIT_FAILED)
                return
            try:
                if json_output:
                    while True:
                        out.file.write(json.dumps(to_json(take(streams, slurm))) + "\n")
                        out.file.flush()
                        time.sleep(interval)
                if not out.is_terminal:
                    _batch(streams, slurm, interval, compact)
                _live(streams, slurm, interval, compact)
            except KeyboardInterrupt:
                return


def _job_nodes(inventory: Inventory, selected: list[Host], job: str,
               narrowed: str | None) -> list[Host]:
    """Of the selected hosts, those a job of ours ran on, from its record."""
    from gpucluster.cli.launch_cmd import job_store

    record = job_store(inventory).load(job)
    return _on_nodes(f"job {record.id} ran", record.hosts, inventory, selected, narrowed)


def _on_nodes(name: str, nodes: list[str], inventory: Inventory, selected: list[Host],
              narrowed: str | None) -> list[Host]:
    """Of the selected hosts, those in `nodes` (in the inventory's order); none is one
    line naming where the job is (`name`: "job ... ran")."""
    chosen = [h for h in selected if h.name in nodes]
    if not chosen:
        where = f"none of them in -w/-g {narrowed}" if narrowed else \
            f"none of them in {inventory.path} now"
        raise GpuclusterError(f"{name} on {hostrange.fold(nodes)}, {where} (fix: "
                              f"gpucluster top without --job, or -w with the job's nodes)")
    return chosen


def _batch(streams: ClusterStreams, slurm: QueuePoller | None, interval: float,
           compact: bool) -> None:
    """Output to a file or a pipe (`top > gpus.log`, `top | tee`): a live view would only
    show its last frame at the end, so each frame is printed whole, under its time, as
    `top -b` does."""
    from gpucluster.cli.views.top import render
    from gpucluster.observe.snapshot import take

    out = stdout_console()
    while True:
        out.print(time.strftime("%Y-%m-%d %H:%M:%S"), highlight=False)
        out.print(render(take(streams, slurm), out, compact))
        out.file.flush()
        time.sleep(interval)


def _live(streams: ClusterStreams, slurm: QueuePoller | None, interval: float,
          compact: bool) -> None:
    """A frame every `interval`; q ends it, c switches between a line per GPU and a line
    per node, as top and nvtop's users expect of a live view."""
    from rich.live import Live

    from gpucluster.cli.keys import pressed_keys
    from gpucluster.cli.views.top import render
    from gpucluster.observe.snapshot import take

    screen = stdout_console()  # its size is read again at every frame: a resize counts
    with pressed_keys() as wait, \
            Live(render(take(streams, slurm), screen, compact, fit=True), console=screen,
                 auto_refresh=False, screen=False, transient=False) as live:
        due = time.monotonic() + interval
        while True:
            key = wait(due - time.monotonic())
            if key in ("q", "Q"):
                return
            if key in ("c", "C"):
                compact = not compact
            elif key is not None and time.monotonic() < due:
                continue  # another key: the next frame comes when it is due
            else:
                due = time.monotonic() + interval
            live.update(render(take(streams, slurm), screen, compact, fit=True),
                        refresh=True)


DEFAULT_LISTEN = "127.0.0.1:9400"  # this machine only: the metrics name nodes, jobs, users


def exporter(
    listen: Annotated[str, typer.Option(
        "--listen", metavar="ADDRESS:PORT",
        help="Where to serve /metrics (keep it on a trusted network); a bare PORT is "
             "127.0.0.1:PORT.")] = DEFAULT_LISTEN,
    port: Annotated[int | None, typer.Option(
        "--port", "-p", min=1, max=65535, metavar="PORT",
        help="Serve on this port of --listen's address.")] = None,
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    interval: IntervalOption = 1.0,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Serve the whole cluster's GPU metrics for Prometheus, from the controller: DCGM
    exporter's metric names and labels (NVIDIA's Grafana dashboard reads them), plus
    gpucluster_* metrics for jobs and ranks, NIC rates and node staleness;
    examples/grafana/ has a dashboard for all of them. Nothing is installed on the nodes.
    Runs until Ctrl-C."""
    from gpucluster.numerals import is_number
    from gpucluster.observe.exporter import ClusterCollector, listening
    from gpucluster.observe.slurm_queue import polled_where_set_up
    from gpucluster.observe.streams import ClusterStreams
    from gpucluster.wording import endpoint

    if is_number(listen.strip()):  # dcgm-exporter's habit, minus its every-address default
        listen = f"{DEFAULT_LISTEN.rpartition(':')[0]}:{listen.strip()}"
    address, _, given_port = listen.rpartition(":")
    address = address.removeprefix("[").removesuffix("]")
    if not address or not is_number(given_port) or not 1 <= int(given_port) <= 65535:
        raise GpuclusterError(f"--listen {listen!r}: expected ADDRESS:PORT (or a PORT alone, "
                              f"for 127.0.0.1), the port from 1 to 65535, e.g. "
                              f"127.0.0.1:9400")
    port = port if port is not None else int(given_port)
    loaded = load_inventory(inventory)
    selected = loaded.select(hosts, group)
    with listening(address, port) as registry, \
            open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                         ask_sudo_pass) as session, \
            _sudo_checked(session, selected, "exporter"), \
            ClusterStreams(session, loaded, selected, interval) as streams, \
            polled_where_set_up(session, loaded) as slurm:
        registry.register(ClusterCollector(streams, slurm))
        served = counted(len(selected), "node") + (" and Slurm's queue" if slurm else "")
        err = stderr_console()
        err.print(f"serving http://{endpoint(address, port)}/metrics for {served}; "
                  f"Ctrl-C ends")
        if address in ("0.0.0.0", "::"):  # noqa: S104 - said to the user, not bound here
            err.print(f"[yellow]note: {address} serves every network this machine is on, "
                      f"in plain HTTP, and the metrics name your nodes, jobs and users (fix: "
                      f"listen on the address only your Prometheus reaches, or let a "
                      f"firewall keep the port to it)[/]")
        # Timed: the kernel hands a process's SIGTERM to any of its threads, and a main
        # thread blocked on a lock without a timeout hears of one another thread took
        # only when it wakes (a CI run found an exporter still serving an hour after it).
        try:
            while True:
                time.sleep(0.2)
        except KeyboardInterrupt:
            return


@contextlib.contextmanager
def _sudo_checked(session: Session, hosts: list[Host], command: str) -> Iterator[None]:
    """The --ask-sudo-pass password tried once per node before any sampler starts (each
    sampler reads the kernel log's Xids through it where the user cannot)."""
    from gpucluster.remote.sudo_check import require_sudo_password

    require_sudo_password(session, hosts, command, f"{command} started nothing")
    yield
