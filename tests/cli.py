"""Run the real `gpucluster` CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def gpucluster(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
               cwd: str | None = None, stdin: str | None = None) -> CliResult:
    """`python -m gpucluster ARGS`; a hang fails the test instead of blocking the suite."""
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-m", "gpucluster", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd, check=False,
                          input=stdin)
    return CliResult(done.returncode, done.stdout, done.stderr)
