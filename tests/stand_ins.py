"""Commands that stand in for a node's tools (ssh, squeue...) in unit tests: a shell
script put first on a PATH, so that the real scripts under test call it."""

from __future__ import annotations

from pathlib import Path


def stand_in(bin_dir: Path, name: str, body: str) -> Path:
    """`bin_dir/name`, an executable sh script running `body`; `bin_dir` is made."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path
