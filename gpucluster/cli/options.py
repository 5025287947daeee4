"""Options shared by several commands, and the helpers that turn them into core values."""

from __future__ import annotations

import getpass
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand

from gpucluster import inventory as inventory_module
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.whole_file import written_whole

if TYPE_CHECKING:
    from gpucluster.remote.session import Session
    from gpucluster.remote.ssh import SshOptions

def finite(value: float | None) -> float | None:
    """Every float option's callback: float() reads `nan` and `inf`, and a range lets
    them through (nan compares false, inf is no maximum short of one), where they ended
    in a traceback (--hang-timeout inf) or a grace that never came (--grace nan)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


InventoryOption = Annotated[
    str | None,
    typer.Option("--inventory", "-i", metavar="PATH",
                 help="Inventory YAML (default: $GPUCLUSTER_INVENTORY, then ./inventory.yaml)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output (schema 1).")]
AcceptNewOption = Annotated[
    bool,
    typer.Option("--accept-new-host-keys",
                 help="Trust and record keys of hosts not yet in known_hosts (like OpenSSH "
                      "accept-new). A changed key is refused regardless."),
]
AskPassOption = Annotated[
    bool, typer.Option("--ask-pass", help="Prompt once for an SSH password (never shown).")]
AskSudoPassOption = Annotated[
    bool, typer.Option("--ask-sudo-pass",
                       help="Prompt once for the nodes' sudo password (never shown), for "
                            "users whose sudo asks one; tried once per node first.")]
ConnectTimeoutOption = Annotated[
    float | None,
    typer.Option("--connect-timeout", metavar="SECONDS", min=0.1, callback=finite,
                 help="Give up connecting to a host after this long (inventory default: 10)."),
]
DebugOption = Annotated[bool, typer.Option(
    "--debug", help="NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL and the NCCL flight "
                    "recorder on every rank, their files in the job dir (gpucluster "
                    "bundle takes them).")]
ModuleOption = Annotated[
    bool,
    typer.Option("--module", "-m",
                 help="SCRIPT is a module name (pkg.train), run as python -m runs it, from "
                      "the work dir (torchrun -m)."),
]
GpusOption = Annotated[str | None, typer.Option(
    "--gpus", metavar="LIST",
    help="Only these GPUs of each node, e.g. 4-7 or 0,2, as a job's CUDA_VISIBLE_DEVICES: "
         "one process per GPU listed, on the rendezvous port such a job takes; the GPU "
         "checks judge these alone.")]
ImageOption = Annotated[
    str | None,
    typer.Option("--image", metavar="IMAGE",
                 help="Run torchrun inside this container image (host network and IPC, GPUs)."),
]
ContainerOption = Annotated[
    bool, typer.Option("--container", help="Run inside the inventory's cluster.image.")]
HostsOption = Annotated[
    str | None,
    typer.Option("--hosts", "-w", metavar="RANGE",
                 help="Only these hosts, e.g. gpu[01-04],login1."),
]
GroupOption = Annotated[
    str | None,
    typer.Option("--group", "-g", metavar="NAME", help="Only the hosts of this inventory group."),
]
FanoutOption = Annotated[
    int | None,
    typer.Option("--fanout", "-f", min=1, max=1024,
                 help="Hosts worked on at once (inventory default: 64)."),
]


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """`gpucluster doctor | head`: rich's own answer is exit 1, which reads as "a check
        failed"; raised instead, so that main() ends every command alike, with 141."""
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    return _Console(highlight=False, soft_wrap=True)


def stderr_console() -> Console:
    return _Console(stderr=True, highlight=False, soft_wrap=True)


def load_inventory(path: str | None, hosts: str | None = None,
                   group: str | None = None) -> Inventory:
    """The inventory; with -w/--hosts or -g/--group, only the hosts selected (the first
    of them is then the head)."""
    loaded = inventory_module.load(inventory_module.find_inventory(path))
    if hosts is None and group is None:
        return loaded
    return loaded.restricted_to(loaded.select(hosts, group))


def ask_password(ask: bool, what: str = "SSH") -> str | None:
    """Prompt without echo on a terminal; read one line when stdin is piped (scripts)."""
    if not ask:
        return None
    if sys.stdin.isatty():
        return getpass.getpass(f"{what} password: ")
    return sys.stdin.readline().rstrip("\n")


def ssh_options(inventory: Inventory, accept_new_host_keys: bool, ask_pass: bool,
                connect_timeout: float | None, ask_sudo_pass: bool = False) -> SshOptions:
    """The connection settings of one invocation, from its flags and the inventory.
    Piped, the SSH password is the first line and the sudo password the next."""
    from gpucluster.remote.ssh import SshOptions

    return SshOptions(
        known_hosts=Path(inventory.cluster.known_hosts).expanduser(),
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=connect_timeout or inventory.cluster.connect_timeout,
        password=ask_password(ask_pass),
        sudo_password=ask_password(ask_sudo_pass, "sudo"),
    )


def open_session(inventory: Inventory, accept_new_host_keys: bool, ask_pass: bool,
                 connect_timeout: float | None, ask_sudo_pass: bool = False) -> Session:
    """One connection per host for this invocation, with its SSH settings."""
    from gpucluster.remote.session import Session

    return Session(inventory, ssh_options(inventory, accept_new_host_keys, ask_pass,
                                          connect_timeout, ask_sudo_pass))


def write_output(output: Path | None, text: str, mode: int = 0o644) -> None:
    """`text` to stdout, or to `output` whole (never half a file where a tool reads it)."""
    if output is None:
        sys.stdout.write(text)
        return
    with written_whole(output, mode) as partial:
        partial.write_text(text, encoding="utf-8")


def chosen_image(inventory: Inventory, image: str | None, container: bool) -> str | None:
    """--image, else with --container the inventory's cluster.image; None: on the host."""
    if image is not None and not image.strip():  # `--image "$IMAGE"` with it unset
        raise GpuclusterError("--image '': no image named (fix: give --image NAME, or leave "
                              "it out to run on the hosts)")
    chosen = image or (inventory.cluster.image if container else None)
    if container and chosen is None:
        raise GpuclusterError(f"{inventory.path}: --container needs cluster.image in the "
                              f"inventory (fix: set it, or give --image NAME)")
    return chosen


class ScriptCommand(TyperCommand):
    """A command taking SCRIPT and the script's own arguments after `--` (launch, export
    sbatch). An option it does not know, given after the script without `--`, was the
    script's (`launch train.py --epochs 5`): the error says where such options go, where
    click suggested one of ours (`--detach`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is handed
        try:
            return super().parse_args(ctx, args)
        except Exception as error:  # click's NoSuchOption, from whichever click typer has
            option = getattr(error, "option_name", None)
            script = first_word(self, given)
            if option and script is not None and option in given[script + 1:]:
                error.message = (  # type: ignore[attr-defined]
                    f"No such option: {option} (fix: the script's own options go after --: "
                    f"{ctx.command_path} [OPTIONS] {given[script]} -- {option} ...)")
                error.possibilities = None  # type: ignore[attr-defined]
            raise



class CommandWords(TyperCommand):
    """`run`'s COMMAND...: the words from the first that is no option of ours are the
    command's (click told not to read options among them), as with ssh and pdsh. One of
    our options among them was meant as ours by someone who puts options last, as
    `run 'rm -rf /tmp/x' -w node1` was read before: run everywhere, it would do what was
    asked of node1 on every node. Refused, in one line; after `--` they are the command's."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        start = first_word(self, args)
        if start is not None:
            ours = option_names(self)
            clash = next((word for word in args[start + 1:]
                          if word in ours or word.partition("=")[0] in ours), None)
            if clash is not None:
                import shlex

                from gpucluster.errors import GpuclusterError

                path = ctx.command_path
                raise GpuclusterError(
                    f"{path}: {clash} after the command would be the command's, yet it is "
                    f"one of our options (fix: ours go before the command, {path} {clash} "
                    f"... {shlex.quote(args[start])} ...; for the command's own {clash}, "
                    f"put -- before the command or quote it whole)")
        return super().parse_args(ctx, args)


def option_names(command: Any) -> set[str]:
    """Every spelling of a click command's options: --hosts, -w..."""
    return {name for param in command.params if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)}


def first_word(command: Any, args: list[str]) -> int | None:
    """Where the first word among a click command's `args` is that is no option nor an
    option's value (launch's SCRIPT, run's COMMAND); None before a `--`."""
    valued = {name for param in command.params if param.param_type_name == "option"
              and not (getattr(param, "is_flag", False) or getattr(param, "count", False))
              for name in (*param.opts, *param.secondary_opts)}
    at = 0
    while at < len(args) and args[at] != "--":
        if not args[at].startswith("-"):
            return at
        at += 2 if args[at] in valued else 1
    return None
