"""`gpucluster export sbatch`: the job `launch` would run, as an sbatch script: one srun
task per node, each running torchrun with c10d rendezvous on the allocation's first
node, the inventory's env, NCCL/gloo on the cluster interface, the image when asked."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucluster.inventory import Inventory
from gpucluster.launch.node_scripts import (
    CHECKPOINT_COPY_S,
    DEBUG_ENV_NAMES,
    RANK_LINE_ENV_NAMES,
    Container,
    container_command,
)
from gpucluster.nproc import nproc_for
from gpucluster.remote.connection import shell_path
from gpucluster.templating import render
from gpucluster.torchrun import (
    SOCKET_IFNAME_VARIABLES,
    TORCHRUN_LOG_DIR,
    TORCHRUN_LOG_DIR_SHELL,
    TorchrunSpec,
    command_line,
    node_images_dir,
    torchrun_argv,
)

HEAD_ADDRESS = "$GPC_HEAD_ADDR"  # set by the batch script from Slurm's NodeAddr
NODE_ADDRESS = "$addr"  # set by each node's task from its own NodeAddr


@dataclass(frozen=True)
class SbatchRequest:
    script: str  # inside the work dir
    args: Sequence[str]
    code_dir: str  # the nodes' copy of the work dir, shell-quoted
    synced: bool
    nodes: int | None = None  # default: every host that is not a spare
    nproc_per_node: int | None = None
    env: Mapping[str, str] | None = None
    image: str | None = None
    output_name: str = "job.sbatch"
    module: bool = False  # script is a module name: torchrun -m
    debug: bool = False  # launch --debug's diagnostics, into GPC_JOB_DIR


def job_name(script: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", script.rsplit("/", 1)[-1].removesuffix(".py"))


def sbatch_script(inventory: Inventory, request: SbatchRequest) -> str:
    hosts = [h for h in inventory.hosts if not h.spare] or list(inventory.hosts)
    head = hosts[0]
    nodes = request.nodes or len(hosts)
    nproc = nproc_for(head, request.nproc_per_node)
    cluster = inventory.cluster
    # Each torchrun gets its node's cluster address, as launch's does: else the rank-0
    # agent hands the workers its hostname, and ranks where it does not resolve hang.
    # Its tee puts each rank's line behind its rank, and srun's label behind its task
    # (slurm/output_lines), so that logs shows the job's lines as launch's.
    spec = TorchrunSpec("slurm-$SLURM_JOB_ID", nproc, request.script, tuple(request.args),
                        module=request.module, local_addr=NODE_ADDRESS,
                        log_dir=TORCHRUN_LOG_DIR)
    argv = torchrun_argv(inventory, spec)
    if request.image:
        argv[0] = "torchrun"  # the image's own, not the host's
    argv[argv.index("--nnodes") + 1] = "$SLURM_NNODES"
    endpoint = argv.index("--rdzv-endpoint") + 1
    argv[endpoint] = f"{HEAD_ADDRESS}:{cluster.rendezvous_port}"
    expanded = {"$SLURM_NNODES", argv[endpoint], spec.rendezvous_id, NODE_ADDRESS}
    # Slurm's variables expand on the node; every other word is quoted.
    command = command_line(argv, {**{word: f'"{word}"' for word in expanded},
                                  TORCHRUN_LOG_DIR: TORCHRUN_LOG_DIR_SHELL})
    env = {**cluster.env, **(request.env or {})}
    container = None
    if request.image:
        debug_env = DEBUG_ENV_NAMES if request.debug else ()
        container = Container(request.image, "gpucluster-slurm-$SLURM_JOB_ID",
                              head.jobs_use_gpus, sorted({*env, *SOCKET_IFNAME_VARIABLES,
                                                          "GPUCLUSTER_CHECKPOINT_DIR",
                                                          "GPUCLUSTER_ATTEMPT", "OMP_NUM_THREADS",
                                                          *RANK_LINE_ENV_NAMES, *debug_env}),
                              name_expands=True)
        command = container_command(container, command, node_images_dir(cluster.work_dir))
    work_dir = shell_path(cluster.work_dir)
    sif = bool(request.image and request.image.endswith(".sif"))
    node_command = render(
        "slurm/sbatch_node.sh.j2", code_dir=request.code_dir, command=command,
        ifname_variables=[n for n in SOCKET_IFNAME_VARIABLES if n not in env],
        jobs_dir=f"{work_dir}/jobs", checkpoints_dir=f"{work_dir}/checkpoints",
        peers=[h.name for h in inventory.hosts], fetch_timeout=int(CHECKPOINT_COPY_S),
        container=container is not None, debug=request.debug, one_thread_default=nproc > 1,
        # As launch: DETAIL kills DDP on CPU (gloo) under torch 2.13, INFO there.
        distributed_debug="DETAIL" if head.jobs_use_gpus else "INFO",
        torch_python=None if container else cluster.python,
        runtimes=("apptainer", "singularity") if sif else ("podman", "docker"))
    gpus = head.gpus if head.jobs_use_gpus else None
    return render("slurm/sbatch.sh.j2", inventory=inventory.path, script=request.script,
                  output_name=request.output_name, synced=request.synced,
                  code_dir_shown=request.code_dir, job_name=job_name(request.script),
                  nodes=nodes, gpus=gpus,
                  partition=inventory.slurm.partition if inventory.slurm else None,
                  env=sorted(env.items()), nproc=nproc, node_command=node_command)
