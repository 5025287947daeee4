"""Run the real `gpucluster` CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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


def read_to_end(process: subprocess.Popen[str], limit: float) -> CliResult:
    """Wait for `process` (text pipes) and read its stdout and stderr to the end, from
    where a test's readline() left them. Not communicate(), which reads the pipes
    themselves: the lines readline() had read ahead into the buffer were lost (a hang's
    stacks, said right after the line a test waited for)."""
    pipes = {"stdout": process.stdout, "stderr": process.stderr}
    read: dict[str, str] = {}
    readers = [threading.Thread(target=lambda name=name: read.update(
        {name: pipes[name].read() if pipes[name] else ""}), daemon=True) for name in pipes]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    for reader in readers:
        reader.join(10)
    return CliResult(code, read.get("stdout", ""), read.get("stderr", ""))
