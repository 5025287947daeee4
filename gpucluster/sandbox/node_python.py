"""A python with torch that every node user can run.

Sandbox nodes share the host's filesystem, so a root node can use the controller's own
interpreter. An ordinary node user often cannot: a pyenv build under /root (mode 0700)
is out of its reach. This venv, made from the system's /usr/bin/python3 in /opt, holds
the node extra's pinned requirements (torch's CPU wheel: no multi-GB CUDA download).
`scripts/setup` makes it (`python -m gpucluster.sandbox.node_python`); `sandbox up
--user` makes it when it is missing.
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from gpucluster.errors import SandboxError

NODE_PYTHON = Path("/opt/gpucluster/node-python")
SYSTEM_PYTHON = Path("/usr/bin/python3")
_NODE_EXTRA = re.compile(r"""extra\s*==\s*['"]node['"]""")
_STAMP = "gpucluster-requirements.txt"  # what was installed, to redo it when pins change
INSTALL_TIMEOUT_S = 1800


def interpreter() -> Path:
    return NODE_PYTHON / "bin" / "python"


def torchrun() -> Path:
    return NODE_PYTHON / "bin" / "torchrun"


def requirements() -> list[str]:
    """The node extra of gpucluster's own metadata: the pins live in pyproject only."""
    try:
        declared = metadata.requires("gpucluster") or []
    except metadata.PackageNotFoundError:
        raise SandboxError("gpucluster's metadata is missing (install it with pip, as "
                           "scripts/setup does)") from None
    wanted = sorted(entry.split(";")[0].strip() for entry in declared
                    if _NODE_EXTRA.search(entry.partition(";")[2]))
    if not wanted:
        raise SandboxError("gpucluster's metadata names no 'node' extra (reinstall it)")
    return wanted


def usable_by_everyone(path: Path) -> bool:
    """Every directory on the way searchable by others, and the file itself readable
    and executable by them: what a non-root node user needs to run it."""
    try:
        target = path.resolve(strict=True)
    except OSError:
        return False
    if not target.stat().st_mode & stat.S_IXOTH or not target.stat().st_mode & stat.S_IROTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in target.parents)


def is_ready() -> bool:
    stamp = NODE_PYTHON / _STAMP
    return (interpreter().exists() and stamp.exists()
            and stamp.read_text().splitlines() == requirements())


def ensure(say: Callable[[str], None]) -> Path:
    """Make (or bring up to date) the venv; returns its interpreter."""
    if is_ready():
        return interpreter()
    if not usable_by_everyone(SYSTEM_PYTHON):
        raise SandboxError(f"{SYSTEM_PYTHON} is missing or not usable by every user: "
                           f"install it with apt-get install -y python3 python3-venv")
    wanted = requirements()
    say(f"making {NODE_PYTHON} with {' '.join(wanted)} for node users (once)")
    NODE_PYTHON.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _run([str(SYSTEM_PYTHON), "-m", "venv", str(NODE_PYTHON)])
    _run([str(interpreter()), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          *wanted])
    (NODE_PYTHON / _STAMP).write_text("\n".join(wanted) + "\n")
    return interpreter()


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(argv)}` did not finish in {INSTALL_TIMEOUT_S}s"
                           ) from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise SandboxError(f"`{' '.join(argv)}` failed: {lines[-1] if lines else 'no output'}")


if __name__ == "__main__":
    try:
        print(f"node python: {ensure(lambda line: print(line, flush=True))}")
    except SandboxError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
