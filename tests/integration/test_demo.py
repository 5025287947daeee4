"""`gpucluster demo`, the README's one command for the main job, end to end."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cli import gpucluster

pytestmark = pytest.mark.sandbox


def test_demo_runs_the_main_job_and_leaves_nothing() -> None:
    done = gpucluster("demo", timeout=400)
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-3000:] + _kept_logs(done.stderr)
    # doctor first finds the bare nodes' problems, provision fixes them, doctor agrees
    # each said once for the nodes it concerns
    assert "FAIL rendezvous-port node[2-3]: cannot reach node1" in done.stdout
    assert "FAIL name-resolution node[1-3]: no other node's hostname resolves" in done.stdout
    assert "FAIL peer-ports node[1-3]: port " in done.stdout
    assert re.search(r"doctor: [1-9]\d* FAIL", done.stdout)
    # every node alike: one row
    assert re.search(r"│ node\[1-3\] │ changed +│ changed +│ changed +│ skipped +│ passed +│",
                     done.stdout), done.stdout
    assert "doctor: 0 FAIL, 0 WARN" in done.stdout
    ranks = set(re.findall(r"^\[node\d/(\d)\] rank \d/6 on node\d ready$", done.stdout,
                           re.MULTILINE))
    assert ranks == {str(r) for r in range(6)}
    assert re.search(r"job \S+: exited 0 on node\[1-3\]", done.stderr)
    assert "demo: done (the job exited 0)" in done.stderr
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout
    assert "demo-node" not in namespaces


def _kept_logs(stderr: str) -> str:
    """The job logs a failed demo keeps, to see why in the test report."""
    kept = re.search(r"^logs kept: (\S+)$", stderr, re.MULTILINE)
    if not kept:
        return ""
    return "".join(f"\n== {log}\n" + "\n".join(log.read_text().splitlines()[-60:])
                   for log in sorted(Path(kept.group(1)).glob("jobs/*/*.log")))
