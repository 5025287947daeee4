"""examples/prometheus/ passes Prometheus's own checker, and its alerts ask only for
metrics the exporter serves (test_observe runs them in a real Prometheus)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "prometheus"


def test_promtool_accepts_the_configuration_and_its_alerts() -> None:
    done = subprocess.run(["promtool", "check", "config", str(EXAMPLES / "prometheus.yml")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout, done.stdout


def test_every_alert_asks_for_metrics_the_exporter_serves() -> None:
    served = set(re.findall(r'"((?:DCGM_FI_DEV|gpucluster)_\w+)"',
                            (ROOT / "gpucluster" / "observe" / "exporter.py").read_text()))
    rules = yaml.safe_load((EXAMPLES / "alerts.yml").read_text())["groups"][0]["rules"]
    asked = {name for rule in rules
             for name in re.findall(r"\b(?:DCGM_FI_DEV|gpucluster)_\w+", rule["expr"])}
    assert asked and asked <= served, asked - served
