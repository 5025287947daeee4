"""examples/prometheus/ passes Prometheus's own checker, and its alerts and the Grafana
dashboard in examples/grafana/ ask only for metrics and labels the exporter serves
(test_observe runs both against a real Prometheus)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "prometheus"
DASHBOARD = ROOT / "examples" / "grafana" / "gpucluster.json"
EXPORTER = (ROOT / "gpucluster" / "observe" / "exporter.py").read_text()
SERVED = set(re.findall(r'"((?:DCGM_FI_DEV|gpucluster)_\w+)"', EXPORTER))


def test_promtool_accepts_the_configuration_and_its_alerts() -> None:
    done = subprocess.run(["promtool", "check", "config", str(EXAMPLES / "prometheus.yml")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rules = yaml.safe_load((EXAMPLES / "alerts.yml").read_text())["groups"][0]["rules"]
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout, done.stdout  # every one read


def test_every_alert_asks_for_metrics_the_exporter_serves() -> None:
    rules = yaml.safe_load((EXAMPLES / "alerts.yml").read_text())["groups"][0]["rules"]
    asked = {name for rule in rules
             for name in re.findall(r"\b(?:DCGM_FI_DEV|gpucluster)_\w+", rule["expr"])}
    assert asked and asked <= SERVED, asked - SERVED


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_the_dashboard_asks_only_for_metrics_and_labels_the_exporter_serves() -> None:
    labels = set(re.findall(r'"(\w+)"', " ".join(
        re.findall(r"(?:GPU_LABELS = |labels=)\[([^\]]*)\]", EXPORTER)))) | {"hpc_job"}
    targets = [t for panel in _panels() for t in panel["targets"]]
    asked = {name for t in targets for name in re.findall(r"\b(?:DCGM_\w+|gpucluster_\w+)",
                                                          t["expr"])}
    assert asked and asked <= SERVED, asked - SERVED
    selected = {name for t in targets for name in re.findall(r"(\w+)\s*=~?", t["expr"])}
    grouped = {name.strip() for t in targets for group in re.findall(
        r"(?:by|on|group_left)\s*\(([^)]*)\)", t["expr"]) for name in group.split(",")}
    legends = {name for t in targets for name in re.findall(r"{{(\w+)}}", t["legendFormat"])}
    assert selected | grouped | legends <= labels, (selected | grouped | legends) - labels


def test_the_dashboard_defines_every_variable_its_panels_use() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(dashboard["panels"])))
    assert used == defined == {"datasource", "Hostname", "job_id"}, used ^ defined
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dashboard["panels"])
