"""Files the wheel ships inside the package (templates/, examples/train.py, the example
inventory) and a source checkout keeps beside it: one lookup for both layouts."""

from __future__ import annotations

from pathlib import Path

from gpucluster.errors import GpuclusterError

PACKAGE = Path(__file__).resolve().parent


def packaged_path(relative: str) -> Path:
    """Inside the installed package, else at the top of the source checkout."""
    for candidate in (PACKAGE / relative, PACKAGE.parent / relative):
        if candidate.exists():
            return candidate
    raise GpuclusterError(f"{relative} is missing from this installation (fix: reinstall "
                          f"gpucluster)")


EXAMPLE_INVENTORY = "inventory.example.yaml"
