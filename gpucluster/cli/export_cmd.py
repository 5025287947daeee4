"""`gpucluster export sbatch`: the job as a Slurm batch script (the work dir synced to
the nodes as launch does)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli import slurm_jobs
from gpucluster.cli.launch_cmd import parse_env
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    ConnectTimeoutOption,
    ContainerOption,
    DebugOption,
    ImageOption,
    InventoryOption,
    ModuleOption,
    ScriptCommand,
    chosen_image,
    load_inventory,
    open_session,
    stderr_console,
    write_output,
)

app = typer.Typer(help="Write the cluster's jobs for other schedulers.", no_args_is_help=True)


@app.command("sbatch", cls=ScriptCommand)
def sbatch(
    script: Annotated[str, typer.Argument(
        metavar="SCRIPT", help="The training script, inside the work dir (with -m: a "
                               "module name).")],
    script_args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="Arguments for the script, after --.")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Write here (default: stdout).")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", "-C", metavar="DIR",
        help="Directory synced to every node (default: the current one).")] = None,
    module: ModuleOption = False,
    debug: DebugOption = False,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", "-N", min=1, metavar="N",
        help="Nodes to ask Slurm for (default: every host of the inventory).")] = None,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", min=1, metavar="N",
        help="Processes per node (default: the GPU count; 1 on CPU nodes).")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="K=V", help="Extra environment for the job (repeatable).")
    ] = None,
    image: ImageOption = None,
    container: ContainerOption = False,
    submit: Annotated[bool, typer.Option(
        "--submit", help="Submit it too, with sbatch on the Slurm controller host, from "
                         "the work dir; the job ID goes to stdout (the script only to "
                         "-o).")] = False,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Submit it (as --submit) and print its output as it is "
                               "written, until it ends; exit 0 only if it completed.")
    ] = False,
    no_sync: Annotated[bool, typer.Option(
        "--no-sync", help="Do not sync the work dir: it is on a shared filesystem, at the "
                          "path the script names.")] = False,
    inventory: InventoryOption = None,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """An sbatch script that runs SCRIPT as `launch` would: one srun task per node,
    torchrun with c10d rendezvous on the allocation's first node. Written out, or
    submitted (--submit) and followed to its end (--follow)."""
    from gpucluster.launch.start import code_dir_for
    from gpucluster.slurm.export import export_sbatch
    from gpucluster.slurm.submit import submit as submit_job
    from gpucluster.whole_file import check_writable

    loaded = load_inventory(inventory)
    job_image = chosen_image(loaded, image, container)
    root = (workdir or Path.cwd()).absolute()
    err = stderr_console()
    name = output.name if output else "job.sbatch"
    if output is not None:
        check_writable(output)  # before the work dir is synced to every node
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout) as session:
        text, note = export_sbatch(session, loaded, root, script, tuple(script_args or ()),
                                   sync=not no_sync, nodes=nodes,
                                   nproc_per_node=nproc_per_node,
                                   env=parse_env(env or []),
                                   image=job_image,
                                   output_name=name,
                                   module=module, debug=debug)
        err.print(note)
        if output is not None or not (submit or follow):
            write_output(output, text, 0o755)
        if submit or follow:
            job = submit_job(session, loaded, text, code_dir_for(loaded, root),
                             f"{loaded.cluster.work_dir.rstrip('/')}/{root.resolve().name}")
            print(job.job_id, flush=True)
            err.print(f"submitted batch job {job.job_id} on {job.host}; its output: "
                      f"{job.output} on the job's first node (gpucluster logs -f "
                      f"slurm-{job.job_id} follows it; gpucluster jobs lists the queue)")
            if follow:
                slurm_jobs.output(session, loaded, job.job_id, live=True)
        elif output is not None:
            err.print(f"wrote {output}: submit it with `sbatch {output}` on a node of the "
                      f"cluster, or write it with --submit")
