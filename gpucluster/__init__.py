"""gpucluster: turn a handful of GPU servers into a multi-node PyTorch cluster."""

from __future__ import annotations

__version__ = "0.1.0"
