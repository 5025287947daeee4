"""Fault: every node floods its output. The controller keeps a bounded tail per host and
says what it cut, instead of growing until the machine runs out of memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.sandbox import Sandbox

pytestmark = pytest.mark.sandbox

PER_NODE_MB = 400

# The CLI runs as the only child of a fresh interpreter, whose RUSAGE_CHILDREN then
# holds the CLI's own peak memory and nothing else's.
_MEASURE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"code": done.returncode, "peak_kib": peak_kib, "stdout": done.stdout,
                  "stderr": done.stderr[-2000:]}))
"""


def test_a_flood_from_every_node_costs_the_controller_bounded_memory(sandbox: Sandbox) -> None:
    flood = f"head -c {PER_NODE_MB * 1000 * 1000} /dev/zero | tr '\\0' x; echo; echo END"
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "gpucluster", "run", "-i",
         str(sandbox.inventory), "--json", flood], capture_output=True, text=True,
        timeout=600, check=True)
    outcome = json.loads(measured.stdout)
    assert outcome["code"] == 0, outcome["stderr"]
    hosts = json.loads(outcome["stdout"])["hosts"]
    assert len(hosts) == len(sandbox.nodes)
    for host in hosts:
        assert host["stdout"].startswith("[gpucluster: the first ")
        assert host["stdout"].endswith("xxx\nEND\n")  # the tail is kept, whole
    total_mib = PER_NODE_MB * len(hosts) * 1000 * 1000 / 2**20
    peak_mib = outcome["peak_kib"] / 1024
    # Keeping everything held the whole flood (about 1.5 GiB here) and more; the tail
    # is 16 MiB per host, plus the interpreter, paramiko and the JSON being printed.
    assert peak_mib < 500 < total_mib, (peak_mib, total_mib)
