"""`gpucluster bundle [JOB]`: every node's diagnostics, and the job's, in one archive."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpucluster.cli.launch_cmd import job_store
from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    AskSudoPassOption,
    ConnectTimeoutOption,
    GroupOption,
    HostsOption,
    InventoryOption,
    load_inventory,
    open_session,
    stderr_console,
    stdout_console,
)
from gpucluster.errors import EXIT_FAILED
from gpucluster.launch.jobs import JobStore
from gpucluster.wording import counted, size


def bundle(
    job: Annotated[str | None, typer.Argument(
        metavar="[JOB]", help="Also the job's logs, command and debug files: an id, a "
                              "unique part of it, or 'last' for the newest; slurm-ID for "
                              "a Slurm job (its record and output).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="PATH",
        help="The archive, or a directory for it (default: "
             "./gpucluster-bundle-[JOB-]TIME.tar.gz).")] = None,
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
) -> None:
    """Collect, from every node at once, what a bug report needs into one .tar.gz with
    SUMMARY.md on top: doctor's view, nvidia-smi -q, the kernel's GPU lines (Xid, NVRM),
    network, the firewall rules provision manages, disk and memory, the journal of sshd,
    the container runtime and the fabric manager; with JOB, its record (secrets masked),
    every node's and rank's logs, NCCL debug files and flight-recorder dumps.

    A dead or hanging node gives a partial bundle that says so. Exit 1 then."""
    from gpucluster.bundle import slurm_job as slurm_part
    from gpucluster.bundle.archive import target as archive_target
    from gpucluster.bundle.archive import write
    from gpucluster.bundle.collect import NodeBundle, collect
    from gpucluster.launch.workdir import BUNDLE_PREFIX
    from gpucluster.slurm.queue import slurm_job

    loaded = load_inventory(inventory, hosts, group)
    store = job_store(loaded)
    slurm_id = slurm_job(job)
    record = store.load(job) if job is not None and slurm_id is None else None
    if record is not None:  # never another cluster's machine of the same name
        from gpucluster.launch.control import hosts_of

        selected = {h.name for h in loaded.hosts}
        hosts_of(loaded, record, [n for n in record.hosts if n in selected])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    named = record.id if record else (f"slurm-{slurm_id}" if slurm_id else "")
    target = archive_target(output, f"{BUNDLE_PREFIX}{named + '-' if named else ''}{stamp}"
                                    f".tar.gz")
    err = stderr_console()

    def progress(node: NodeBundle) -> None:
        collected_bytes = sum(len(d) for d in node.files.values())
        state = f"[bold red]partial: {escape(node.error)}[/]" if node.error else "done"
        err.print(f"{escape(node.host)}: {counted(len(node.files), 'file')}, "
                  f"{size(collected_bytes)} in {node.duration_s:.1f}s, {state}")

    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session:
        from gpucluster.remote.sudo_check import require_sudo_password

        # A wrong password fails here, once per node, not once in each part that reads
        # through it (the doctor part, the collection): those get it only once it is right.
        require_sudo_password(session, loaded.hosts, "bundle", "bundle collected nothing")
        slurm = slurm_part.read(session, loaded, slurm_id) if slurm_id else None
        collected = collect(session, loaded, store, record, progress, slurm)
    archive_bytes = write(collected, store, loaded.path, target.absolute())
    stdout_console().print(str(target))
    lost = [h for h, b in collected.nodes.items() if b.error]
    partial = f"; partial for {', '.join(lost)}" if lost else ""
    err.print(f"bundle {target}: {size(archive_bytes)} from "
              f"{counted(len(collected.nodes), 'node')} in {collected.duration_s:.1f}s"
              f"{partial}; start with its SUMMARY.md")
    hint = None if job is not None else newest_job_hint(store)
    if hint is not None:
        err.print(escape(hint), highlight=False)
    if lost:
        raise typer.Exit(EXIT_FAILED)


def newest_job_hint(store: JobStore) -> str | None:
    """Without JOB the archive has no job's logs, which a bug report about the job that
    just failed needs most: say so, and how to add the newest's."""
    ids = store.ids()
    if not ids:
        return None
    failure = store.noted_failure(ids[-1])
    return (f"no job's logs in it; gpucluster bundle last adds those of the newest job, "
            f"{ids[-1]}{f' (failed: {failure})' if failure else ''}")
