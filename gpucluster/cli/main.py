"""The `gpucluster` application: sub-commands, --version, and the one place that turns
errors into exit codes and one-line messages."""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from gpucluster import __version__, interrupts, ssh_config
from gpucluster.cli import (
    bundle_cmd,
    demo_cmd,
    doctor_cmd,
    export_cmd,
    inventory_cmd,
    launch_cmd,
    logs_cmd,
    provision_cmd,
    prune_cmd,
    reap_cmd,
    run_cmd,
    sandbox_cmd,
    smoke_cmd,
    stacks_cmd,
    stop_cmd,
    top_cmd,
)
from gpucluster.cli.options import CommandWords, ScriptCommand
from gpucluster.cli.views.common import discard_writes
from gpucluster.errors import GpuclusterError
from gpucluster.lossy_output import take_unwatched_streams
from gpucluster.os_errors import file_error

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer a pipe ended


class OutputClosed(Exception):
    """The reader of our output went away (`gpucluster run hostname | head -1`)."""


class _Commands(TyperGroup):
    def invoke(self, ctx: Any) -> Any:  # click.Context, vendored by typer
        """Click ends a command whose output's reader went away with exit 1, which reads
        as "a host failed" or "a check failed": passed to main() instead, as an error
        click does not catch, so that every command ends alike, with 141."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise OutputClosed from None


app = typer.Typer(
    cls=_Commands,
    name="gpucluster",
    help="Turn a handful of GPU servers into a working multi-node PyTorch cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(inventory_cmd.app, name="inventory")
app.add_typer(sandbox_cmd.app, name="sandbox")
app.add_typer(export_cmd.app, name="export")
app.command("run", cls=CommandWords, context_settings=run_cmd.RUN_CONTEXT)(run_cmd.run)
app.command("doctor")(doctor_cmd.doctor)
app.command("provision")(provision_cmd.provision)
app.command("smoke")(smoke_cmd.smoke)
app.command("launch", cls=ScriptCommand)(launch_cmd.launch)
app.command("jobs")(launch_cmd.jobs)
app.command("logs")(logs_cmd.logs)
app.command("stop")(stop_cmd.stop)
app.command("stacks")(stacks_cmd.stacks)
app.command("prune")(prune_cmd.prune)
app.command("top")(top_cmd.top)
app.command("exporter")(top_cmd.exporter)
app.command("reap")(reap_cmd.reap)
app.command("bundle")(bundle_cmd.bundle)
app.command("demo")(demo_cmd.demo)


def reflowed_help(typer_app: typer.Typer) -> None:
    """Give every command its docstring with each paragraph on one line, as its help, and
    the first paragraph as its short help.

    Typer's rich help keeps a docstring's line breaks: in command lists, which cut
    a summary mid-sentence ("image (and | Slurm, --with | slurm)"), and in every
    paragraph of a command's page but the first ("is marked | stale with its age")."""
    for command in typer_app.registered_commands:
        doc = inspect.getdoc(command.callback) if command.callback else None
        if not doc:
            continue
        paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
        if command.short_help is None:
            command.short_help = paragraphs[0]
        if command.help is None:
            command.help = "\n\n".join(paragraphs)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            reflowed_help(group.typer_instance)


reflowed_help(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpucluster {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """gpucluster: doctor, provision and launch on plain SSH servers."""


def main() -> None:
    """Console-script entry point: the one place errors become messages and exit codes."""
    interrupts.terminations_interrupt()
    ssh_config.leave_out_invoke()
    take_unwatched_streams()
    try:
        app(prog_name="gpucluster")
    except GpuclusterError as error:
        _fail(error)
    except (BrokenPipeError, OutputClosed):  # `... | head`: the reader has what it wanted
        for stream in (sys.stdout, sys.stderr):
            discard_writes(stream)
        sys.exit(EXIT_CLOSED_PIPE)
    except OSError as error:  # a user's path the command met: too long, a disk full...
        said = file_error(error)
        if said is None:
            raise
        _fail(said)


def _fail(error: GpuclusterError) -> NoReturn:
    with contextlib.suppress(OSError):  # stderr on the full disk too: the exit code says it
        for line in str(error).splitlines():
            print(f"gpucluster: error: {line}", file=sys.stderr, flush=True)
    sys.exit(error.exit_code)
