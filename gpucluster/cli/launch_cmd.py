"""`gpucluster launch`, `jobs`, `logs` and `stop`: a torchrun job's whole life."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange, render
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    InventoryOption,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.env_names import is_env_name
from gpucluster.errors import EXIT_FAILED, GpuclusterError, Interrupted
from gpucluster.inventory import Inventory

if TYPE_CHECKING:
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import (
        FirstFailure,
        JobOutcome,
        NodeState,
        OutputCallback,
        StopResult,
    )
    from gpucluster.remote.session import Session

GraceOption = Annotated[float, typer.Option(
    "--grace", min=0, metavar="SECONDS",
    help="After TERM, how long processes get to exit before KILL.")]
JobArgument = Annotated[str | None, typer.Argument(
    metavar="JOB", help="Job id, or a unique part of it (default: the newest job).")]


def launch(
    script: Annotated[str, typer.Argument(help="The training script, inside the work dir.")],
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="Arguments for the script, after --.")] = None,
    inventory: InventoryOption = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", "-C", help="Directory synced to every node (default: the current one).")
    ] = None,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1,
        help="Processes per node (default: the inventory's GPU count; 1 on CPU nodes).")
    ] = None,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", min=0, help="Passed to torchrun: restarts after a failure.")] = 0,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="K=V", help="Extra environment for the job (repeatable).")
    ] = None,
    image: Annotated[str | None, typer.Option(
        help="Run torchrun inside this container image (host network and IPC, GPUs).")
    ] = None,
    container: Annotated[bool, typer.Option(
        "--container", help="Run inside the inventory's cluster.image.")] = False,
    detach: Annotated[bool, typer.Option(
        "--detach", "-d", help="Start the job and return; follow it with gpucluster logs.")
    ] = False,
    grace: GraceOption = 10.0,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Sync the work dir and run SCRIPT under torchrun on every node; stream the logs.

    The first node to fail stops the job everywhere; Ctrl-C does too. The exit code is
    the job's."""
    from gpucluster.launch.attempt import Attempt
    from gpucluster.launch.model import LaunchRefused, LaunchRequest

    loaded = load_inventory(inventory)
    chosen_image = image or (loaded.cluster.image if container else None)
    if container and chosen_image is None:
        raise GpuclusterError(f"{loaded.path}: --container needs cluster.image in the "
                              f"inventory (fix: set it, or give --image NAME)")
    request = LaunchRequest(script, tuple(script_args or ()), (workdir or Path.cwd()).absolute(),
                            nproc_per_node, max_restarts, _parse_env(env or []), chosen_image)
    err = stderr_console()
    store = _store(loaded)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        try:
            record = Attempt(session, loaded, store, request).start(
                on_phase=lambda text: err.print(f"[dim]gpucluster: {text}[/]"))
        except LaunchRefused as refused:
            from gpucluster.doctor.report import print_findings

            print_findings(err, refused.findings, [f.name for f in refused.findings])
            err.print(f"[bold red]launch refused: {escape(str(refused))}; nothing was "
                      f"started[/]")
            raise typer.Exit(EXIT_FAILED) from None
        if detach:
            stdout_console().print(record.id)
            err.print(f"job {record.id} started on {hostrange.fold(record.hosts)}; follow it "
                      f"with: gpucluster logs -f {record.id}; end it with: gpucluster stop "
                      f"{record.id}")
            return
        err.print(f"[dim]gpucluster: job {record.id}: streaming logs (Ctrl-C stops the job "
                  f"on every node)[/]")
        _attach(session, loaded, store, record, err, live=True, fail_fast=True, grace=grace)


def jobs(
    inventory: InventoryOption = None,
    limit: Annotated[int, typer.Option("--last", "-n", min=1,
                                       help="Show this many of the newest jobs.")] = 10,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """List jobs started from beside this inventory, with their state on each node."""
    from gpucluster.launch.control import states

    loaded = load_inventory(inventory)
    store = _store(loaded)
    records = [store.load(i) for i in store.ids()[-limit:]]
    if not records:
        stderr_console().print(f"no jobs recorded in {store.root}")
        return
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        table = states(session, loaded, records)
    rows = []
    for record in records:
        by_state: dict[str, list[str]] = {}
        for node in record.hosts:
            state = table[record.id].get(node)
            by_state.setdefault("?" if state is None else _label(state), []).append(node)
        summary = ", ".join(f"{label}: {hostrange.fold(nodes)}"
                            for label, nodes in by_state.items())
        rows.append((record.id, " ".join([record.script, *record.args]),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started_at)),
                     summary))
    render.print_table(stdout_console(), "jobs", ("job", "command", "started", "state"), rows)


def logs(
    job: JobArgument = None,
    inventory: InventoryOption = None,
    follow_live: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep following until the job ends (Ctrl-C only detaches).")
    ] = False,
    node: Annotated[str | None, typer.Option(
        "--node", metavar="RANGE", help="Only these nodes, e.g. node2 or node[1-2].")] = None,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Show a job's output from every node (prefixed [node/rank]); -f follows it live.
    Also saved, one file per node, under .gpucluster/jobs/JOB/."""
    loaded = load_inventory(inventory)
    store = _store(loaded)
    record = store.load(job)
    nodes = hostrange.expand(node) if node else None
    if nodes is not None and (unknown := [n for n in nodes if n not in record.hosts]):
        raise GpuclusterError(f"job {record.id} did not run on {', '.join(unknown)} "
                              f"(fix: --node with one of {hostrange.fold(record.hosts)})")
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        _attach(session, loaded, store, record, stderr_console(), live=follow_live,
                fail_fast=False, grace=0, nodes=nodes)


def stop(
    job: JobArgument = None,
    inventory: InventoryOption = None,
    grace: GraceOption = 10.0,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """End a job on every node: TERM, then KILL after the grace period; confirms that
    nothing of it is left."""
    from gpucluster.launch.control import stop as stop_job

    loaded = load_inventory(inventory)
    record = _store(loaded).load(job)
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        results = stop_job(session, loaded, record, grace)
    if not _print_stopped(stdout_console(), record, results):
        raise typer.Exit(EXIT_FAILED)


# -- helpers


def _store(inventory: Inventory) -> JobStore:
    from gpucluster.launch.jobs import JobStore
    from gpucluster.state import state_dir_for

    return JobStore(state_dir_for(inventory))


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not is_env_name(name):
            raise GpuclusterError(f"--env {pair!r}: expected NAME=VALUE (fix: e.g. --env "
                                  f"NCCL_DEBUG=INFO)")
        env[name] = value
    return env


def _printer() -> OutputCallback:
    """Lines from all nodes, each whole, prefixed [node/rank] (or [node] for torchrun)."""
    lock = threading.Lock()

    def write(node: str, rank: str | None, text: str) -> None:
        prefix = f"[{node}/{rank}]" if rank is not None else f"[{node}]"
        with lock:
            sys.stdout.write(f"{prefix} {text}\n")
            sys.stdout.flush()
    return write


def _attach(session: Session, inventory: Inventory, store: JobStore, record: JobRecord,
            err: Console, live: bool, fail_fast: bool, grace: float,
            nodes: list[str] | None = None) -> None:
    from gpucluster.launch.follow import follow

    try:
        outcome = follow(session, inventory, record, store, _printer(), live=live,
                         fail_fast=fail_fast, stop_on_interrupt=fail_fast, grace_s=grace,
                         nodes=nodes,
                         on_stopping=lambda why: err.print(f"[bold yellow]gpucluster: {why}[/]"))
    except KeyboardInterrupt:  # only when the job is not ours to stop (logs -f)
        raise Interrupted(f"detached from the logs; job {record.id} goes on") from None
    _print_outcome(err, outcome, store)
    if live:
        raise typer.Exit(outcome.exit_code)  # followed to the end: the job's exit code
    if any(s.state in ("unreachable", "missing") for s in outcome.states.values()):
        raise typer.Exit(EXIT_FAILED)


def _print_outcome(err: Console, outcome: JobOutcome, store: JobStore) -> None:
    record = outcome.record
    failure = outcome.first_failure
    if failure is not None:
        where = f"rank {failure.rank} on {failure.node}" if failure.rank is not None \
            else failure.node
        err.print(f"[bold red]first failure: {where}, {escape(_failure_cause(failure))}[/]")
        if failure.rank_tail:
            err.print(f"last lines of rank {failure.rank}:")
            for line in failure.rank_tail:
                err.print(f"  {escape(line)}", style="dim")
        err.print(f"last lines of {failure.node}'s log "
                  f"({store.node_log(record.id, failure.node)}):")
        for line in failure.tail:
            err.print(f"  {escape(line)}", style="dim")
    by_state: dict[str, list[str]] = {}
    for node, state in outcome.states.items():
        by_state.setdefault(_label(state), []).append(node)
    err.print(f"job {record.id}: " + ", ".join(f"{label} on {hostrange.fold(nodes)}"
                                               for label, nodes in by_state.items())
              + f"; logs in {store.directory(record.id)}")
    if outcome.stopped:
        _print_stopped(err, record, outcome.stopped)


def _label(state: NodeState) -> str:
    """running, stopped, lost...; exited with its code."""
    if state.state == "exited":
        return f"exited {state.exit_code}"
    return state.state


def _failure_cause(failure: FirstFailure) -> str:
    worker = failure.worker_exit
    if worker is not None and worker < 0:
        try:
            name = f" ({signal.Signals(-worker).name})"
        except ValueError:
            name = ""
        cause = f"worker killed by signal {-worker}{name}"
    elif worker is not None:
        cause = f"worker exit code {worker}"
    else:
        cause = failure.state.state + (f" ({failure.state.detail})"
                                       if failure.state.detail else "")
    if failure.exit_code is not None:
        cause += f"; torchrun exit code {failure.exit_code}"
    return cause


def _print_stopped(console: Console, record: JobRecord,
                   results: dict[str, StopResult]) -> bool:
    """One line per kind of result; True when nothing of the job is left anywhere."""
    clean = True
    for node, result in sorted(results.items()):
        if result.how in ("unreachable", "error") or result.left:
            clean = False
            left = f" {len(result.left)} processes left: {result.left}" if result.left else ""
            console.print(f"[bold red]{node}: could not confirm the job ended: "
                          f"{escape(result.detail)}{left}[/]")
    counts = {n: r.found for n, r in results.items() if r.how not in ("unreachable", "error")}
    killed = [n for n, r in results.items() if r.how == "kill"]
    if clean:
        console.print(f"job {record.id} stopped: nothing of it is left on "
                      f"{hostrange.fold(results)} ({sum(counts.values())} processes ended"
                      + (f"; KILL needed on {hostrange.fold(killed)}" if killed else "") + ")")
    return clean



