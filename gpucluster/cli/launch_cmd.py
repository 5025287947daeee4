"""`gpucluster launch`, `jobs` and `stop`: a torchrun job's whole life (`logs`:
logs_cmd)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.cli.attach import attach
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    ContainerOption,
    DebugOption,
    GpusOption,
    GroupOption,
    HostsOption,
    ImageOption,
    InventoryOption,
    JsonOption,
    ModuleOption,
    chosen_image,
    finite,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.cli.views import common
from gpucluster.cli.views import launch as view
from gpucluster.env_names import is_env_name
from gpucluster.errors import EXIT_FAILED, GpuclusterError
from gpucluster.inventory import Inventory

if TYPE_CHECKING:
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.logsearch import LogFilter
    from gpucluster.launch.model import NodeState

GraceOption = Annotated[float, typer.Option(
    "--grace", min=0, metavar="SECONDS", callback=finite,
    help="After TERM, how long processes get to exit before KILL.")]
JobArgument = Annotated[str | None, typer.Argument(
    metavar="JOB", help="Job id, a unique part of it, or 'last' (the default: the newest "
                        "job); slurm-ID for a Slurm job.")]


def launch(
    script: Annotated[str, typer.Argument(
        metavar="SCRIPT", help="The training script, inside the work dir (with -m: a "
                               "module name).")],
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="Arguments for the script, after --.")] = None,
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", "-C", metavar="DIR",
        help="Directory synced to every node (default: the current one).")] = None,
    module: ModuleOption = False,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1, metavar="N",
        help="Processes per node (default: one per GPU, the inventory's gpus or else the "
             "GPUs found there; 1 on CPU nodes).")
    ] = None,
    gpus: GpusOption = None,
    max_restarts: Annotated[int, typer.Option(
        "--max-restarts", min=0, metavar="N",
        help="Passed to torchrun: restarts after a failure.")] = 0,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="K=V", help="Extra environment for the job (repeatable).")
    ] = None,
    secret_env: Annotated[list[str] | None, typer.Option(
        "--secret-env", metavar="NAME",
        help="Pass $NAME from this shell to the job; its value is never on a command line, "
             "written down or shown (job.json, bundle). Names with TOKEN, KEY, SECRET or "
             "PASSWORD are masked anyway.")
    ] = None,
    debug: DebugOption = False,
    image: ImageOption = None,
    container: ContainerOption = False,
    detach: Annotated[bool, typer.Option(
        "--detach", "-d", help="Start the job and return; follow it with gpucluster logs. "
        "A node that fails stops it on the others (over the cluster's SSH mesh).")
    ] = False,
    grace: GraceOption = 10.0,
    recover: Annotated[bool, typer.Option(
        "--recover", help="On a lost node, a hang or a worker error: re-check the nodes, "
                          "quarantine the sick ones and relaunch on the healthy ones.")
    ] = False,
    min_nodes: Annotated[int | None, typer.Option(
        "--min-nodes", min=1, metavar="N",
        help="With --recover: relaunch only while this many nodes are healthy (default 1).")
    ] = None,
    max_recoveries: Annotated[int | None, typer.Option(
        "--max-recoveries", min=0, metavar="K",
        help="With --recover: at most K relaunches (default 3).")] = None,
    hang_timeout: Annotated[float | None, typer.Option(
        "--hang-timeout", min=1, metavar="SECONDS", callback=finite,
        help="With --recover: no progress (heartbeat file or output) this long is a hang "
             "(default 300).")] = None,
    node_timeout: Annotated[float | None, typer.Option(
        "--node-timeout", min=1, metavar="SECONDS", callback=finite,
        help="With --recover: a node silent this long (not even its heartbeat, sent every "
             "2 s) is lost (default 10).")] = None,
    show_ranks: Annotated[str | None, typer.Option(
        "--show-ranks", metavar="RANKS",
        help="Stream only these global ranks' lines, e.g. 0 or 0,8-15 (every rank's are "
             "kept: gpucluster logs JOB); a failure is reported whatever its rank.")
    ] = None,
    json_output: Annotated[bool, typer.Option(
        "--json", help="The outcome as JSON on stdout (schema 1); the job's lines go to "
                       "stderr.")] = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Sync the work dir and run SCRIPT under torchrun on every node; stream the logs.

    The first node to fail stops the job everywhere (its nodes do it themselves, over the
    cluster's SSH mesh, where this process has not 30 s later: stopped, or away); Ctrl-C
    does too. The exit code is the job's."""
    from gpucluster.launch.attempt import Attempt
    from gpucluster.launch.model import LAUNCHER_STOP_WAIT_S, LaunchRefused, LaunchRequest

    loaded = load_inventory(inventory, hosts, group)
    image = chosen_image(loaded, image, container)
    secrets = _secret_env(secret_env or [])
    job_env = {**parse_env(env or [], from_shell=True), **secrets, **_chosen_gpus(gpus, env)}
    request = LaunchRequest(script, tuple(script_args or ()), (workdir or Path.cwd()).absolute(),
                            nproc_per_node, max_restarts, job_env,
                            image, debug=debug, secret_env=frozenset(secrets),
                            module=module, stop_peers_grace_s=grace,
                            stop_peers_after_s=0 if detach else LAUNCHER_STOP_WAIT_S)
    err = stderr_console()
    store = job_store(loaded)
    shown = _shown_ranks(show_ranks, detach)
    from gpucluster.cli import recovery_flow

    policy = recovery_flow.policy(loaded, recover, grace, min_nodes=min_nodes,
                                  max_recoveries=max_recoveries, hang_timeout_s=hang_timeout,
                                  node_timeout_s=node_timeout)
    if policy is not None:
        if detach:
            recovery_flow.supervise(store, err, json_output)
            return
        with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
            recovery_flow.run(session, loaded, store, request, policy, err, json_output,
                              shown)
        return
    # Spares wait for launch --recover to need them.
    loaded = loaded.restricted_to([h for h in loaded.hosts if not h.spare])
    if not loaded.hosts:
        raise GpuclusterError(f"{loaded.path}: every selected host is a spare (fix: select "
                              f"other hosts, or set spare: false)")
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        try:
            record = Attempt(session, loaded, store, request).start(
                on_phase=common.phase_printer(err))
        except LaunchRefused as refused:
            view.print_refusal(err, refused, stdout_console() if json_output else None)
            raise typer.Exit(EXIT_FAILED) from None
        if detach:
            if json_output:
                common.print_json(stdout_console(), {"job": record.id, "detached": True,
                                                     "hosts": record.hosts})
            else:
                stdout_console().print(record.id)
            err.print(f"job {record.id} started on {hostrange.fold(record.hosts)}; follow it "
                      f"with: gpucluster logs -f {record.id}; end it with: gpucluster stop "
                      f"{record.id}")
            return
        err.print(f"[dim]gpucluster: job {record.id}: streaming logs (Ctrl-C stops the job "
                  f"on every node)[/]")
        world = sum(record.nproc_per_node.values())
        if shown is not None and shown.ranks is not None and min(shown.ranks) >= world:
            err.print(f"gpucluster: --show-ranks {show_ranks}: job {record.id} has ranks "
                      f"0-{world - 1}: none of its lines will show (gpucluster logs "
                      f"{record.id} has them)")
        attach(session, loaded, store, record, err, live=True, fail_fast=True, grace=grace,
               json_output=json_output, keep=shown)


def _chosen_gpus(gpus: str | None, env: list[str] | None) -> dict[str, str]:
    """--gpus as the job's CUDA_VISIBLE_DEVICES; -e giving it too is one choice too many."""
    from gpucluster.doctor.gpu_selection import VISIBLE_DEVICES, parse_option

    if gpus is None:
        return {}
    if any(e.partition("=")[0] == VISIBLE_DEVICES for e in env or []):
        raise GpuclusterError(f"--gpus {gpus} and -e {VISIBLE_DEVICES}: both choose the "
                              f"job's GPUs (fix: keep one of them)")
    return {VISIBLE_DEVICES: parse_option(gpus)}


def _shown_ranks(text: str | None, detach: bool) -> LogFilter | None:
    """--show-ranks as the filter of the streamed lines."""
    from gpucluster.launch.logsearch import LogFilter, parse_ranks

    if text is None:
        return None
    if detach:
        raise GpuclusterError(f"--show-ranks {text}: a detached launch streams no lines "
                              f"(fix: gpucluster logs -f --rank {text} JOB)")
    return LogFilter(ranks=parse_ranks(text, "--show-ranks"))


def jobs(
    inventory: InventoryOption = None,
    limit: Annotated[int, typer.Option("--last", "-n", min=1, metavar="N",
                                       help="Show this many of the newest jobs (and any older "
                                            "one still running).")] = 10,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """List jobs started from beside this inventory, with their state on each node; where
    Slurm is set up (provision --with slurm), Slurm's queue after them."""
    from concurrent.futures import ThreadPoolExecutor

    from gpucluster.cli import slurm_jobs
    from gpucluster.launch.control import listing
    from gpucluster.launch.supervisor import supervisor_of
    from gpucluster.launch.unread_failures import note_unread
    from gpucluster.slurm.queue import QueuedJob, queue, set_up_from_here

    loaded = load_inventory(inventory)
    store = job_store(loaded)
    records: list[JobRecord] = []
    supervisors: dict[str, int | None] = {}
    ask_slurm = set_up_from_here(loaded)
    table: dict[str, dict[str, NodeState]] = {}
    queued: list[QueuedJob] | None = None
    slurm_failed = ""
    if store.ids() or ask_slurm:
        # squeue runs while the nodes are asked about our jobs. The session closes first,
        # so Ctrl-C ends a running squeue rather than waiting for it.
        with ThreadPoolExecutor(1) as beside, open_session(
                loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
            asked = beside.submit(queue, session, loaded, True) if ask_slurm else None
            records, table = listing(session, loaded, store, limit)
            supervisors = {r.id: supervisor_of(store, r.id) for r in records}
            # a supervised job's attempts note their own
            note_unread(session, loaded, store, [r for r in records if not supervisors[r.id]],
                        table)
            try:
                queued = asked.result() if asked else None
            except GpuclusterError as error:
                slurm_failed = str(error)
    failures = {r.id: noted for r in records if (noted := store.noted_failure(r.id))}
    if json_output:
        common.print_json(stdout_console(), {
            **view.jobs_payload(records, table, supervisors, failures),
            "slurm": slurm_jobs.queue_payload(queued)})
    elif records:
        view.print_jobs(stdout_console(), records, table, supervisors, failures)
    if not records:
        stderr_console().print(f"no jobs recorded in {store.root}")
    if queued is not None and not json_output:
        slurm_jobs.print_queue(stdout_console(), queued)
    if slurm_failed:
        stderr_console().print(f"gpucluster: Slurm's queue: {escape(slurm_failed)}")
        raise typer.Exit(EXIT_FAILED)


# -- helpers


def job_store(inventory: Inventory) -> JobStore:
    from gpucluster.launch.jobs import JobStore
    from gpucluster.state import state_dir_for

    return JobStore(state_dir_for(inventory))


def _secret_env(names: list[str]) -> dict[str, str]:
    """--secret-env NAME: the value from this process's environment, as docker -e NAME."""
    import os

    env = {}
    for name in names:
        if not is_env_name(name):
            raise GpuclusterError(f"--secret-env {name.partition('=')[0]!r}: expected a "
                                  f"variable NAME, set in this shell (fix: export NAME=..., "
                                  f"then --secret-env NAME)")
        if name not in os.environ:
            raise GpuclusterError(f"--secret-env {name}: ${name} is not set in this shell "
                                  f"(fix: export {name}=...)")
        env[name] = os.environ[name]
    return env


def parse_env(pairs: list[str], from_shell: bool = False) -> dict[str, str]:
    """--env NAME=VALUE pairs; `from_shell`: the command has --secret-env, which a bare
    NAME (docker's -e NAME, the value from this shell) is pointed to."""
    env = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if from_shell and not equals and is_env_name(name):
            raise GpuclusterError(f"--env {name}: expected NAME=VALUE (fix: --secret-env "
                                  f"{name} passes ${name} from this shell, its value never "
                                  f"written down; or --env {name}=VALUE)")
        if not equals or not is_env_name(name):
            raise GpuclusterError(f"--env {pair!r}: expected NAME=VALUE, NAME of ASCII "
                                  f"letters, digits and _ (fix: e.g. --env NCCL_DEBUG=INFO)")
        env[name] = value
    return env
