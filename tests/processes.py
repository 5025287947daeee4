"""Waiting for this machine's processes, as tests see them."""

from __future__ import annotations

import subprocess
import time


def all_ended(command_line: str, within_s: float = 10.0) -> bool:
    """Whether, within `within_s`, no process's command line holds `command_line`."""
    deadline = time.monotonic() + within_s
    while True:
        found = subprocess.run(["pgrep", "-f", command_line], capture_output=True,
                               check=False)
        if found.returncode != 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
