"""What a launch request must be before any node is asked: a work dir that is a
project's (not a home), a script inside it that the sync sends, and no more processes
per node than its GPUs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpucluster.doctor.gpu_selection import GpuSelection
from gpucluster.doctor.nvidia_smi import Gpu
from gpucluster.doctor.probe import NodeFacts
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch import workdir
from gpucluster.launch.model import LaunchRequest
from gpucluster.nproc import GpuCount
from gpucluster.reports import Section


def _check_not_home(root: Path) -> None:
    """`cd ~ && gpucluster launch train.py` would send ~/.ssh's private keys, ~/.aws and
    every dataset under the home to every node."""
    where = root.resolve()
    what = ("your home directory" if where == Path.home().resolve()
            else "the root directory" if where == Path(where.anchor) else None)
    if what is not None:
        raise GpuclusterError(f"{root} is {what}: launch would copy all of it to every "
                              f"node (fix: run from the project's directory, or give it "
                              f"with --workdir DIR)")


def check_request(request: LaunchRequest) -> tuple[dict[str, workdir.LocalFile], str]:
    """The files to send, and the script's path inside the work dir (it must be one of
    those files), or the module's name (its file, where the work dir has it, too)."""
    if not request.workdir.is_dir():
        raise GpuclusterError(f"{request.workdir}: no such directory (fix: --workdir DIR)")
    _check_not_home(request.workdir)
    files = workdir.local_files(request.workdir)
    if request.module:
        _check_module(request.script, request.workdir, files)
        return files, request.script
    script = Path(request.script)
    given = script if script.is_absolute() else request.workdir / script
    candidate = given.resolve()
    try:
        relative = candidate.relative_to(request.workdir.resolve()).as_posix()
    except ValueError:
        relative = None
    if relative is None and given.is_symlink() and candidate.is_file():
        raise GpuclusterError(f"{request.script} is a link to {candidate}, outside "
                              f"{request.workdir}: the nodes get the link, not the script "
                              f"(fix: copy the script into the work directory)")
    if relative is None and candidate.is_file():
        raise GpuclusterError(f"{request.script} is outside the work directory "
                              f"{request.workdir}, which is what the nodes get (fix: run "
                              f"launch from the script's project, or -C DIR with a "
                              f"directory that holds it)")
    if candidate.is_dir():
        raise GpuclusterError(f"{request.script} is a directory, not a script (fix: name the "
                              f"script in it, e.g. {script / 'train.py'}, or -m PACKAGE to "
                              f"run a package's __main__.py)")
    if relative is None or not candidate.is_file():
        raise GpuclusterError(f"{request.script}: no such file in {request.workdir} "
                              f"(fix: give the script's path inside the work directory)")
    if relative not in files:
        raise GpuclusterError(f"{relative} is excluded from the sync (by {workdir.IGNORE_FILE} "
                              f"or a virtualenv/VCS rule) (fix: move it or change the rule)")
    return files, relative


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _check_module(name: str, root: Path, files: Mapping[str, workdir.LocalFile]) -> None:
    """A dotted name; where the work dir holds it (pkg/train.py, or app/__main__.py),
    that file must be one the sync sends. One it does not hold may be installed on the
    nodes: python -m looks there too."""
    if not _MODULE.fullmatch(name) or name.endswith(".py"):  # pkg.train.py: a file meant
        dotted = name.removesuffix(".py").strip("/").replace("/", ".")
        fix = f"-m {dotted}" if _MODULE.fullmatch(dotted) else (
            "give it dotted, as python -m takes it: pkg.train for pkg/train.py")
        raise GpuclusterError(f"-m {name}: not a Python module name (fix: {fix})")
    base = name.replace(".", "/")
    for relative in (f"{base}.py", f"{base}/__main__.py"):
        if (root / relative).is_file() and relative not in files:
            raise GpuclusterError(f"{relative} is excluded from the sync (by "
                                  f"{workdir.IGNORE_FILE} or a virtualenv/VCS rule) (fix: "
                                  f"move it or change the rule)")


def job_inventory(inventory: Inventory, chosen: GpuSelection | None) -> Inventory:
    """The inventory as a job on `chosen` GPUs sees it: its rendezvous port is
    rendezvous_port + its first GPU's index, where cluster.rendezvous_ports reaches that
    far, so jobs on separate GPUs of one head each have a port of their own."""
    first = chosen.first_index if chosen is not None else None
    cluster = inventory.cluster
    if not first or first >= cluster.rendezvous_ports:
        return inventory
    return dataclasses.replace(inventory, cluster=dataclasses.replace(
        cluster, rendezvous_port=cluster.rendezvous_port + first))


def gpus_found(sections: Mapping[str, Mapping[str, Section]],
               chosen: GpuSelection | None = None) -> dict[str, GpuCount]:
    """Each node's GPUs (or of them the job's, `chosen`), and those in MIG mode, from
    launch's checks (their nvidia-smi answer, in the probe's sections): one process per
    GPU where the inventory gives no `gpus` or the job chose some."""
    def gpus(found: Mapping[str, Section]) -> Sequence[Gpu]:
        every = NodeFacts(dict(found)).gpus
        return every if chosen is None else chosen.chosen(every)
    return {node: _counted(gpus(found)) for node, found in sections.items()}


def _counted(gpus: Sequence[Gpu]) -> GpuCount:
    return GpuCount(len(gpus), sum(bool(gpu.mig_enabled) for gpu in gpus))
