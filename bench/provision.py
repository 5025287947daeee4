"""bench/provision: `gpucluster provision` on fresh sandbox nodes behind a default-drop
firewall (SSH open, everything else dropped, as a cloud image's security group leaves
them), then re-runs with nothing to change. Measured beside them, on the same nodes:
the smoke test alone (the part of a fresh run that provisions nothing) and `gpucluster
run true` (one login and one command per node: a re-run's floor).

    sudo .venv/bin/python -m bench.provision [--nodes 8] [--fresh 1] [--runs 3]

Goals: fresh nodes to provisioned + smoke passed within 40 s; a re-run with nothing to
change (`--skip smoke`) within 5 s, plus the smoke test. Every run is checked: the
fresh one changed every node and passed the smoke test, each re-run changed nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    GPUCLUSTER,
    add_login_options,
    median_of,
    sandbox,
    shape_logins,
    succeeded,
    timed,
)

# What a fresh cloud server's firewall allows: its own loopback, replies, and SSH.
DEFAULT_DROP = ("iptables -A INPUT -i lo -j ACCEPT; iptables -A INPUT -m conntrack "
                "--ctstate ESTABLISHED,RELATED -j ACCEPT; iptables -A INPUT -p tcp --dport 22 "
                "-j ACCEPT; iptables -P INPUT DROP")


def _provision(inventory: str, *flags: str) -> tuple[float, dict[str, Any]]:
    """Wall time of one provision run, and its --json (results, phases_s...)."""
    started = time.perf_counter()
    done = subprocess.run([*GPUCLUSTER, "provision", "-i", inventory, "--json", *flags],
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    succeeded(done)
    return elapsed, json.loads(done.stdout)


def _expect(results: list[dict[str, Any]], allowed: set[str], what: str) -> None:
    """Every result's outcome is one of `allowed`, else the run did not do what it is
    timed for."""
    wrong = [f"{r['host']} {r['step']}: {r['outcome']}" for r in results
             if r["outcome"] not in allowed]
    if wrong:
        raise SystemExit(f"{what}: expected only {sorted(allowed)}, got " + "; ".join(wrong))


def _fresh_round(args: argparse.Namespace, tmp: Path, measure: Callable[[str, float], None],
                 phases: list[dict[str, float]]) -> None:
    """One sandbox from scratch: the fresh provision, then what is timed beside it."""
    with sandbox("gpcbench", "198.18.9.0/24", args.nodes, tmp) as inventory:
        path = inventory["path"]
        subprocess.run([*GPUCLUSTER, "run", "-i", path, DEFAULT_DROP], check=True,
                       capture_output=True)
        shape_logins(path, args)
        elapsed, payload = _provision(path)
        results = payload["results"]
        phases.append(payload["phases_s"])
        # The steps with work to do on fresh nodes must have changed every node.
        _expect([r for r in results if r["step"] in ("ssh-mesh", "hosts", "firewall")],
                {"changed"}, "fresh provision")
        _expect([r for r in results if r["step"] == "smoke"], {"passed"}, "fresh provision")
        measure("fresh", elapsed)
        measure("smoke", timed([*GPUCLUSTER, "smoke", "-i", path], succeeded))
        for _ in range(args.runs):  # alternated: the box's speed drifts within a run
            elapsed, payload = _provision(path, "--skip", "smoke")
            _expect(payload["results"], {"already ok", "skipped"}, "re-run")
            measure("re-run", elapsed)
            measure("run true", timed([*GPUCLUSTER, "run", "-i", path, "true"], succeeded))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--fresh", type=int, default=1,
                        help="Fresh sandboxes to provision (each brought up from scratch).")
    parser.add_argument("--runs", type=int, default=3,
                        help="Re-runs (and `run true`s) per fresh sandbox, alternated.")
    add_login_options(parser)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"fresh": [], "smoke": [], "re-run": [], "run true": []}
    phases: list[dict[str, float]] = []
    for _ in range(args.fresh):
        with tempfile.TemporaryDirectory() as tmp:
            _fresh_round(args, Path(tmp), lambda what, seconds: times[what].append(seconds),
                         phases)

    fresh, smoke = median_of(times["fresh"]), median_of(times["smoke"])
    rerun, floor = median_of(times["re-run"]), median_of(times["run true"])
    print(f"\nprovision, {args.nodes} sandbox nodes behind a default-drop firewall "
          f"(SSH open), medians")
    print(f"{'measured':<46} {'seconds':>8}   runs")
    rows = (("fresh nodes to provisioned + smoke passed", fresh, times["fresh"]),
            ("smoke test alone (gpucluster smoke)", smoke, times["smoke"]),
            ("re-run, nothing to change (--skip smoke)", rerun, times["re-run"]),
            ("gpucluster run true (the re-run's floor)", floor, times["run true"]))
    for label, value, runs in rows:
        print(f"{label:<46} {value:>8.2f}   {' '.join(f'{r:.2f}' for r in runs)}")
    print(f"fresh: {fresh:.1f} s (goal <= 40 s), of which provisioning about "
          f"{fresh - smoke:.1f} s beside the smoke test's {smoke:.1f} s")
    for number, run in enumerate(phases, start=1):  # as provision itself timed them
        print(f"fresh run {number}, its phases: " + ", ".join(
            f"{phase} {seconds:.1f} s" for phase, seconds in run.items() if seconds >= 0.05))
    print(f"re-run: {rerun:.2f} s (goal <= 5 s plus the smoke test), "
          f"{rerun / floor:.2f}x `run true` on the same nodes")


if __name__ == "__main__":
    main()
