"""What torch on a node is: its versions from an import (slow, cached on the node), and
what it was built for from its version.py (no import)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

# Run by the job's python on the node: torch's versions as JSON; exit 3 when torch
# cannot be imported (so the probe does not cache a failure).
TORCH_SCRIPT = """\
import json, sys
try:
    import torch
except Exception as error:
    print(json.dumps({"torch": None, "error": f"{type(error).__name__}: {error}"}))
    sys.exit(3)
nccl = None
try:
    version = torch.cuda.nccl.version()
    nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
except Exception:
    pass
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}))
"""


@dataclass(frozen=True)
class TorchFacts:
    version: str | None
    cuda: str | None
    nccl: str | None
    error: str | None
    timed_out_s: int | None = None  # the import was stopped after this long


@dataclass(frozen=True)
class TorchBuild:
    """What torch was built for (`torch.version.cuda`, `.hip`: both None in a CPU
    build), read without importing it."""

    version: str | None
    cuda: str | None
    hip: str | None = None  # a ROCm build: AMD's GPUs, never NVIDIA's


# version.py's lines: `cuda: Optional[str] = None`, `__version__ = '2.5.1+cu124'`.
_ASSIGNMENT = re.compile(r"(\w+)\s*(?::[^=]*)?=\s*(.+)")


def _string_or_none(literal: str) -> str | None:
    try:
        value = ast.literal_eval(literal.strip())
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def parse_versions(text: str | None) -> TorchFacts | None:
    """TORCH_SCRIPT's answer (its last JSON line); None when python did not run at all."""
    if text is None:
        return None
    for line in reversed(text.strip().splitlines()):
        try:
            data: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        limit = data.get("timed_out")
        return TorchFacts(data.get("torch"), data.get("cuda"), data.get("nccl"),
                          data.get("error"), limit if isinstance(limit, int) else None)
    return TorchFacts(None, None, None, text.strip()[-300:] or "no output")


def parse_build(text: str | None) -> TorchBuild | None:
    """version.py's lines as the probe's grep gave them; None where no torch was found,
    or the file names no `cuda` (no evidence either way)."""
    found = {}
    for line in (text or "").splitlines():
        if match := _ASSIGNMENT.fullmatch(line.strip()):
            found[match[1]] = _string_or_none(match[2])
    if "cuda" not in found:
        return None
    return TorchBuild(found.get("__version__"), found["cuda"], found.get("hip"))
