"""The torchrun command line every node runs, and where nodes keep image files.

Shared by launch, the smoke test and provision's image step (and so kept outside all
three packages, which import it and never each other for it): the smoke test proves the
exact rendezvous path jobs use."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpucluster.inventory import Host, Inventory
from gpucluster.remote.connection import shell_path
from gpucluster.templating import render

SOCKET_IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# Every process gpucluster starts on a node for a job or a smoke test carries
# GPUCLUSTER_JOB=<id>@<node>, so jobs, stop and doctor find them all the same way.
JOB_VARIABLE = "GPUCLUSTER_JOB"
SMOKE_PREFIX = "gpucluster-smoke-"  # a smoke test's id, its marker's: it has no job record
SMOKE_ENDS = "it ends within its --timeout (300 s unless given)"  # the fix: let it finish
FILE_IMAGE_SUFFIXES = (".sif", ".sqsh")  # Apptainer, enroot: run from the file itself
# torchrun's per-rank logs (its tee's files), inside the node's job dir, as a word of its
# command line and as the node's shell is to expand it.
TORCHRUN_LOG_DIR = "$GPC_JOB_DIR/torchrun"
TORCHRUN_LOG_DIR_SHELL = '"$GPC_JOB_DIR"/torchrun'


@dataclass(frozen=True)
class TorchrunSpec:
    """What torchrun needs to know beyond the inventory."""

    rendezvous_id: str
    nproc_per_node: int
    script: str
    args: Sequence[str] = ()
    max_restarts: int = 0
    join_timeout_s: int | None = None
    log_dir: str | None = None  # with tee: per-rank logs here, lines prefixed on stdout
    extra: Sequence[str] = field(default_factory=tuple)
    module: bool = False  # script is a module name: torchrun -m, as python -m
    # This node's cluster address: the rank-0 agent gives it to the workers for their
    # store (else its hostname, which peers may not resolve: the job then hangs)
    local_addr: str | None = None


def command_line(argv: Sequence[str], as_is: Mapping[str, str] | None = None) -> str:
    """`torchrun_argv`'s words as one shell line, each quoted: the program's with its
    leading ~/ left for the node's shell to expand (cluster.torchrun may start so), and a
    word in `as_is` replaced by its given shell form (a variable the node expands)."""
    shown = as_is or {}
    return " ".join(shown[word] if word in shown else
                    shell_path(word) if index == 0 else shlex.quote(word)
                    for index, word in enumerate(argv))


def torchrun_argv(inventory: Inventory, spec: TorchrunSpec) -> list[str]:
    """torchrun with c10d rendezvous at the head's cluster address and rendezvous port."""
    cluster = inventory.cluster
    argv = [cluster.torchrun, "--nnodes", str(len(inventory.hosts)),
            "--nproc-per-node", str(spec.nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{inventory.head.address}:{cluster.rendezvous_port}",
            "--rdzv-id", spec.rendezvous_id, "--max-restarts", str(spec.max_restarts)]
    if spec.join_timeout_s is not None:
        argv += ["--rdzv-conf", f"join_timeout={spec.join_timeout_s}"]
    if spec.log_dir is not None:
        argv += ["--log-dir", spec.log_dir, "--tee", "3"]
    if spec.local_addr is not None:
        argv += ["--local_addr", spec.local_addr]  # torch 2.0 on; `--local-addr` is 2.4's
    return [*argv, *spec.extra, *(["-m"] if spec.module else []), spec.script, *spec.args]


def interface_exports(host: Host, env: Mapping[str, str]) -> str:
    """Shell that points NCCL and gloo at the interface holding the node's cluster
    address, unless the job's environment already names one. Ends with '; ' or is ''."""
    missing = [name for name in SOCKET_IFNAME_VARIABLES if name not in env]
    if not missing:
        return ""
    return render("launch/interface_exports.sh.j2", address=host.address,
                  names=missing).strip() + " "


def is_image_file(name: str) -> bool:
    """An Apptainer (.sif) or enroot (.sqsh) image, which nodes keep as a file."""
    return name.endswith(FILE_IMAGE_SUFFIXES)


def node_images_dir(work_dir: str) -> str:
    """Where nodes keep image files: <work_dir>/images, shell-quoted."""
    return shell_path(f"{work_dir}/images")
