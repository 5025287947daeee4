"""The shell scripts a job's life runs on each node, rendered from templates/launch/."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpucluster import hostrange
from gpucluster.launch.jobs import JobRecord
from gpucluster.templating import render
from gpucluster.torchrun import JOB_VARIABLE, is_image_file

HEARTBEAT_S = 2
# A run's checkpoints copied node to node (to a spare, to a requeued Slurm job's new node):
# large, but bounded.
CHECKPOINT_COPY_S = 3600.0
SUDO_RUNTIME = "sudo:"  # how start reports an engine it runs through sudo
# What templates/launch/_rank_lines sets for torchrun: output that streams live, each
# rank's line behind its global rank, a crashed rank's Python stack (launch's and export
# sbatch's alike).
RANK_LINE_ENV_NAMES = ("PYTHONUNBUFFERED", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
                       "PYTHONFAULTHANDLER")
# What start sets for a job, passed into its container: those, the job's dirs,
# torchrun's one-thread default...
JOB_ENV_NAMES = (JOB_VARIABLE, *RANK_LINE_ENV_NAMES, "GPUCLUSTER_CHECKPOINT_DIR",
                 "GPUCLUSTER_HEARTBEAT_FILE", "GPUCLUSTER_ATTEMPT", "OMP_NUM_THREADS")
# launch --debug: set on every rank unless the job's env sets them (templates/launch/start).
DEBUG_ENV_NAMES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
                   "TORCH_DISTRIBUTED_DEBUG", "TORCH_FR_BUFFER_SIZE",
                   "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                   "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEBUG_DIRS = ("nccl", "flight-recorder")  # in the node's job dir


@dataclass(frozen=True)
class Container:
    """Run torchrun inside this image: host network and IPC, GPUs, work dir mounted."""

    image: str
    name: str
    gpus: bool
    env_names: Sequence[str]
    name_expands: bool = False  # the name holds our own node-side variables ($SLURM_JOB_ID)


def ere_escape(text: str) -> str:
    """`text` as a literal in a POSIX extended regex (grep -E). Python's re.escape also
    escapes '-', which grep 3.8+ warns about."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def _marker_pattern(record: JobRecord, node: str) -> str:
    return ere_escape(f"{JOB_VARIABLE}={record.marker(node)}")


def any_job_pattern(node: str) -> str:
    return f"{JOB_VARIABLE}=[^@]+@{ere_escape(node)}"


def sif_path(image: str, images_dir: str) -> str:
    """Where provision keeps an Apptainer image on a node (a shell word)."""
    return f"{images_dir}/{shlex.quote(image.rsplit('/', 1)[-1])}"


def image_check(container: Container, images_dir: str) -> str:
    """A shell test that the image is on this node, where provision put it. launch never
    pulls: a pull per node at start can give nodes different images (a moved tag), and
    a large one outlasts the rendezvous without a word of progress."""
    if container.image.endswith(".sif"):
        return f"[ -f {sif_path(container.image, images_dir)} ]"
    return (f'${{GPC_SUDO:+sudo -n}} "$GPC_RT" image inspect {shlex.quote(container.image)} '
            f'>/dev/null 2>&1')


def container_command(container: Container, torchrun: str, images_dir: str) -> str:
    """The image's torchrun: a .sif under apptainer (or singularity), from the node's
    images directory; anything else under podman or docker. Whichever the node has
    is $GPC_RT."""
    if container.image.endswith(".sif"):
        # Apptainer passes the host's environment in: the job's variables and marker.
        path = sif_path(container.image, images_dir)
        return (f'"$GPC_RT" exec{" --nv" if container.gpus else ""} --bind "$PWD" '
                f'--bind "$GPC_JOB_DIR" --bind "$GPUCLUSTER_CHECKPOINT_DIR" --pwd "$PWD" {path} '
                f'{torchrun}')
    env_flags = " ".join(f"-e {name}" for name in container.env_names)
    gpus = ' $(case "$GPC_RT" in *docker) echo --gpus all;; ' \
           '*) echo --device nvidia.com/gpu=all;; esac)' if container.gpus else ""
    # A node user that is not root runs the engine through sudo, where provision loaded
    # the image (sudo -n podman load), keeping the job's variables, and is that user
    # inside, so what the job writes in the work dir stays the user's.
    sudo = (f'${{GPC_SUDO:+sudo -n --preserve-env={",".join(container.env_names)}}} '
            if container.env_names else "${GPC_SUDO:+sudo -n} ")
    as_user = ' ${GPC_SUDO:+--user "$(id -u):$(id -g)"}'
    name = f'"{container.name}"' if container.name_expands else shlex.quote(container.name)
    return (f'{sudo}"$GPC_RT" run --rm --name {name} --network host '
            f'--ipc host{gpus}{as_user} -v "$PWD:$PWD" -v "$GPC_JOB_DIR:$GPC_JOB_DIR" '
            f'-v "$GPUCLUSTER_CHECKPOINT_DIR:$GPUCLUSTER_CHECKPOINT_DIR" -w "$PWD" '
            f"{env_flags} {shlex.quote(container.image)} {torchrun}")


def engine_command(runtime: str) -> str:
    """The engine as start recorded it: `sudo:PATH` when it ran through sudo."""
    if runtime.startswith(SUDO_RUNTIME):
        return f"sudo -n {shlex.quote(runtime.removeprefix(SUDO_RUNTIME))}"
    return shlex.quote(runtime)


def start_script(record: JobRecord, node: str, command: str, interface_exports: str,
                 container: bool, rendezvous_port: int | None, on_cpu: bool = False,
                 sync_apply: str = "", image_check: str = "", python: str = "python3",
                 peer_stop: PeerStop | None = None, gpus: str = "") -> str:
    """`rendezvous_port` on the head only: wait for it to be free, else refuse. With more
    than one of the record's workers on the node, torchrun's own default of one OpenMP
    thread each is set ahead of it, which spares its 4-line banner about it. `on_cpu`:
    the node's jobs run on CPU (gloo), where torch 2.13's DistributedDataParallel dies of
    SIGSEGV under TORCH_DISTRIBUTED_DEBUG=DETAIL (seen on the sandbox; see
    pytorch/pytorch#148976): --debug sets INFO there. `sync_apply`: the sync's unpack,
    run once the node is known free, before the job starts (its tar on stdin).
    `image_check`: a shell test that the container's image is on the node. `python`: the
    job's, which --debug asks for torch's version (the flight recorder's variables).
    `peer_stop`: launch -d's, kept in the job dir (see PeerStop). `gpus`: the job's GPU
    indices (GpuSelection.indices, launch --gpus): a job of ours on none of them does
    not refuse the start."""
    runtimes = (("apptainer", "singularity") if record.image and record.image.endswith(".sif")
                else ("podman", "docker"))
    return render("launch/start.sh.j2", job_id=record.id, node=node,
                  rendezvous_port=rendezvous_port, runtimes=runtimes,
                  jobs_dir=record.jobs_dir, code_dir=record.code_dir, command=command,
                  interface_exports=interface_exports, marker=record.marker(node),
                  checkpoint_dir=record.checkpoints_on_node(),
                  attempt=record.attempt, debug=record.debug, sync_apply=sync_apply,
                  distributed_debug="INFO" if on_cpu else "DETAIL",
                  torch_python=None if container else python,
                  any_job_pattern=any_job_pattern(node), container=container,
                  image=record.image, image_check=image_check, stamper=stamper_script(),
                  one_thread_default=record.nproc_per_node.get(node, 1) > 1,
                  peer_stop=peer_stop, gpus=gpus)


def stamper_script() -> str:
    """The line stamper start.sh runs beside the job: bash -c SCRIPT stamp LEADER JOB."""
    return render("launch/stamper.sh.j2")


def follow_script(record: JobRecord, node: str, follow: bool,
                  last_lines: int | None = None, from_byte: int = 0) -> str:
    """`last_lines` (not with `follow`): only the log's last lines and their stamps, and
    the offset a follow of the lines after them starts at. `from_byte` past 0: the log
    from that offset on, without stamps."""
    return render("launch/follow.sh.j2", job_id=record.id, node=node,
                  jobs_dir=record.jobs_dir, follow=follow, heartbeat_s=HEARTBEAT_S,
                  last_lines=last_lines, from_byte=from_byte,
                  marker_pattern=_marker_pattern(record, node),
                  marker_variable=f"{JOB_VARIABLE}={record.marker(node)}")


def stop_script(record: JobRecord, node: str, grace_s: float,
                runtime: str | None = None, dump_stacks: bool = False) -> str:
    """`dump_stacks`: a hang's stop, which aborts the workers first so that each writes
    its Python stack into its rank's log (hang_stacks); where stacks_reachable."""
    engine = engine_command(runtime) if runtime else None
    return _stop_script(record, node, grace_s, engine,
                        dump_stacks and stacks_reachable(record, engine))


# A hang's stop reads each held worker with py-spy first, where the node has it: this long
# at most (the stop's own limit is its grace + 30 s)
HANG_SPY_TIMEOUT_S = 5


def stacks_reachable(record: JobRecord, engine: str | None) -> bool:
    """Whether a hang's stop can find the job's workers on a node to abort them: the
    leader's grandchildren; a podman or docker container's first process's children
    (`engine`: the one start found there; unknown for a job an older gpucluster started);
    under apptainer, the job's processes with a RANK their parent lacks."""
    return not record.image or is_image_file(record.image) or engine is not None


def _workers(record: JobRecord, engine: str | None) -> dict[str, Any]:
    """How the node scripts find the job's workers (_job_workers.sh): a podman or docker
    container's, by its name; apptainer's, by their environment; else the leader's
    grandchildren."""
    return {"container": _container(record, engine),
            "ranks_by_env": record.image is not None and is_image_file(record.image)}


def _stop_script(record: JobRecord, node: str, grace_s: float, engine: str | None,
                 dump_stacks: bool = False) -> str:
    return render("launch/stop.sh.j2", job_id=record.id, node=node,
                  jobs_dir=record.jobs_dir, grace_s=grace_s, **_workers(record, engine),
                  grace_whole_s=math.ceil(grace_s), dump_stacks=dump_stacks,
                  spy_timeout_s=HANG_SPY_TIMEOUT_S, marker_pattern=_marker_pattern(record, node))


def _container(record: JobRecord, engine: str | None) -> dict[str, str] | None:
    """podman/docker containers are stopped by name; apptainer's processes are the
    job's own, found by their marker like any other."""
    return ({"runtime": engine, "name": record.container_name()}
            if record.image and engine and not is_image_file(record.image) else None)


def freeze_script(record: JobRecord, node: str, runtime: str | None = None) -> str:
    """A hang's stop, first round on every node: each worker and its torchrun stopped
    where they are, so that none leaves the hung collective before it is aborted
    (stop.sh, dump_stacks). `runtime`: a container's engine, as start recorded it."""
    engine = engine_command(runtime) if runtime else None
    return render("launch/freeze.sh.j2", job_id=record.id, node=node,
                  jobs_dir=record.jobs_dir, **_workers(record, engine),
                  marker_pattern=_marker_pattern(record, node))


def stacks_script(record: JobRecord, node: str, runtime: str | None, native: bool,
                  timeout_s: float) -> str:
    """Where each worker is now, read by py-spy without stopping the job (live_stacks);
    where stacks_reachable. `timeout_s`: each read's."""
    engine = engine_command(runtime) if runtime else None
    return render("launch/stacks.sh.j2", job_id=record.id, node=node,
                  jobs_dir=record.jobs_dir, **_workers(record, engine),
                  native=native, timeout_s=math.ceil(timeout_s), slurm_job=None,
                  marker_pattern=_marker_pattern(record, node))


def slurm_stacks_script(slurm_id: str, node: str, native: bool, timeout_s: float) -> str:
    """The same for a Slurm job's ranks on `node`, found by its id in their environment."""
    return render("launch/stacks.sh.j2", job_id=f"slurm-{slurm_id}", node=node,
                  container=None, ranks_by_env=True, native=native,
                  timeout_s=math.ceil(timeout_s), slurm_job=slurm_id)


@dataclass(frozen=True)
class PeerStop:
    """What a node keeps in its job dir at start so that, if its torchrun fails, it
    stops the job on the others itself (templates/launch/stop_peers): at once under
    launch -d, else where its launcher's stop did not come."""

    own_stop: str  # this node's stop, which a failing peer runs over SSH
    stop_peers: str  # the stop of the others, which this node's leader starts


# The engine a node's kept stop runs a container's stop with: the one start found there
# (start writes GPC_RT and GPC_SUDO at the top of the kept stop).
_KEPT_ENGINE = '${GPC_SUDO:+sudo -n} "$GPC_RT"'
PEER_STOP_CONNECT_S = 10


def peer_stop(record: JobRecord, node: str, peers: Sequence[str], grace_s: float,
              after_s: int = 0) -> PeerStop:
    """`peers`: the job's other nodes, by their inventory names (as the cluster's SSH
    mesh config names them on every node). `after_s`: a launcher watches the job; the
    node stops the others only where no stop of the launcher's came in that long."""
    own = _stop_script(record, node, grace_s, _KEPT_ENGINE)
    commands = [{"name": peer, "command": f"sh {record.dir_on_node(peer)}/stop.sh"}
                for peer in peers]
    # A peer's stop: its connection, then TERM, the grace, KILL and a last look.
    timeout_s = PEER_STOP_CONNECT_S + math.ceil(grace_s) + 30
    stop_peers = render("launch/stop_peers.sh.j2", job_id=record.id, node=node,
                        peers=commands, peers_folded=hostrange.fold(list(peers)),
                        timeout_s=timeout_s, connect_timeout_s=PEER_STOP_CONNECT_S,
                        after_s=after_s)
    return PeerStop(own, stop_peers)


def state_script(records: Sequence[JobRecord], node: str, jobs_dir: str) -> str:
    return render("launch/state.sh.j2", job_ids=[r.id for r in records], node=node,
                  jobs_dir=jobs_dir, any_job_pattern=any_job_pattern(node))
