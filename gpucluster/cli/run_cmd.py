"""`gpucluster run 'CMD'`: one shell command on all or some hosts."""

from __future__ import annotations

from typing import Annotated

import typer

from gpucluster.cli.options import (
    AcceptNewOption,
    AskPassOption,
    AskSudoPassOption,
    ConnectTimeoutOption,
    FanoutOption,
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
from gpucluster.cli.views import common
from gpucluster.cli.views import run as run_view
from gpucluster.errors import EXIT_FAILED, GpuclusterError

# Everything from the first word that is no option of ours is the command's, as with ssh
# and pdsh: `gpucluster run nvidia-smi -L` runs `nvidia-smi -L` (it was "No such option").
RUN_CONTEXT = {"allow_interspersed_args": False}


def run(
    words: Annotated[list[str], typer.Argument(
        metavar="COMMAND...", help="Shell command, run by /bin/sh on each host: one quoted "
                                   "word, or its words, joined with spaces as ssh joins "
                                   "them; the options go before it.")],
    inventory: InventoryOption = None,
    hosts: HostsOption = None,
    group: GroupOption = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", "-t", min=0.1, metavar="SECONDS", callback=finite,
        help="Per-host command time limit (inventory default: 120).")] = None,
    sudo: Annotated[bool, typer.Option(
        "--sudo", help="Run through sudo for non-root users: non-interactive (sudo -n), "
                       "or with --ask-sudo-pass's password.")
    ] = False,
    json_output: JsonOption = False,
    accept_new_host_keys: AcceptNewOption = False,
    ask_pass: AskPassOption = False,
    ask_sudo_pass: AskSudoPassOption = False,
    connect_timeout: ConnectTimeoutOption = None,
    fanout: FanoutOption = None,
) -> None:
    """Run COMMAND on every host (or a selection); identical outputs are folded.

    The inventory's `cluster.env` is exported first, as it is for jobs."""
    command = " ".join(words)
    if not command.strip():
        raise GpuclusterError("COMMAND is empty: nothing would run (fix: quote the whole "
                              "command, e.g. gpucluster run 'nvidia-smi -L')")
    if ask_sudo_pass and not sudo:
        raise GpuclusterError("--ask-sudo-pass is for --sudo: without it nothing runs under "
                              "sudo (fix: add --sudo)")
    loaded = load_inventory(inventory)
    if fanout is not None:
        from dataclasses import replace

        loaded = replace(loaded, cluster=replace(loaded.cluster, fanout=fanout))
    selected = loaded.select(hosts, group)
    limit = timeout if timeout is not None else loaded.cluster.command_timeout
    with open_session(loaded, accept_new_host_keys, ask_pass, connect_timeout,
                      ask_sudo_pass) as session:
        from gpucluster.remote.sudo_check import require_sudo_password

        require_sudo_password(session, selected, "run --sudo", "nothing ran")
        with common.host_progress(stderr_console(), len(selected), "hosts done") as advance:
            # The command's stdin is empty, as with `ssh -n`: a command that reads it ends
            # rather than waiting out its time limit for input that never comes.
            result = session.run(selected, command, timeout=limit, sudo=sudo, stdin=b"",
                                 env=loaded.cluster.env,
                                 on_done=lambda _host, _outcome: advance())
    console = stdout_console()
    if json_output:
        common.print_json(console, run_view.run_payload(command, result))
    else:
        run_view.print_run(console, result)
    summary = run_view.failure_summary(result)
    if summary is not None:
        if not json_output:
            asked = sudo and session.options.sudo_password is None
            fix = run_view.timeout_fix(result, limit) or (
                run_view.sudo_password_fix(result) if asked else "")
            stderr_console().print(f"[bold red]{summary}[/]{fix}")
        raise typer.Exit(EXIT_FAILED)

