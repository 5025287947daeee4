"""What a real GPU machine said (one H200, driver 580; tests/fixtures/h200/README.md):
doctor's probe output read back into findings, `top` sampling a host reached without SSH
with a stand-in nvidia-smi that replays the real rows, and the sandbox's simulated
nvidia-smi held to the real one's output for the commands gpucluster sends."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpucluster.doctor.checks
from gpucluster import inventory as inventory_module
from gpucluster.doctor import nvidia_smi, probe
from gpucluster.doctor.model import REGISTRY, Context, Status
from gpucluster.doctor.rendezvous import Reachability
from tests.cli import gpucluster
from tests.processes import all_ended
from tests.stand_ins import stand_in

FIXTURES = Path(__file__).parents[1] / "fixtures" / "h200"
JOB = "20261204-164038-772e"  # the job running during the load capture


def real_outputs(state: str) -> dict[str, str]:
    """`nvidia-smi ARGS` -> what the real one printed, from nvidia-smi-STATE.txt."""
    outputs: dict[str, str] = {}
    command = None
    for line in (FIXTURES / f"nvidia-smi-{state}.txt").read_text().splitlines():
        if line.startswith("# $ "):
            command = line[4:]
            outputs[command] = ""
        elif command is not None and not line.startswith("# rc "):
            outputs[command] += line + "\n"
    return {command: text.rstrip("\n") for command, text in outputs.items()}


def real_probe(state: str) -> probe.NodeFacts:
    output = (FIXTURES / f"probe-{state}.txt").read_text()
    clock = float(output.split("@@gpc section clock\n", 1)[1].split()[0])
    return probe.parse_facts(output, clock)


def one_machine(tmp_path: Path, facts: probe.NodeFacts) -> Context:
    """The inventory the capture ran with: this machine alone, its one H200 expected."""
    path = tmp_path / "inventory.yaml"
    path.write_text("defaults: {gpus: 1, gpu_model: NVIDIA H200}\nhosts: [localhost]\n")
    resolved = {"vm": "127.0.0.1"}  # what the node's own name resolved to there
    return Context(inventory_module.load(path), {"localhost": facts}, {},
                   {"localhost": Reachability(resolved, "open")})


def results(context: Context, check: str) -> list:
    return REGISTRY[check].run(context)


def test_doctor_reads_the_real_h200_probe_as_a_healthy_node(tmp_path: Path) -> None:
    facts = real_probe("idle")
    [gpu] = facts.gpus
    assert (gpu.name, gpu.memory_total_mib, gpu.driver) == ("NVIDIA H200", 143771, "580.159.04")
    assert (facts.versions.driver, facts.versions.cuda) == ("580.159.04", "13.0")
    torch = facts.torch
    assert torch is not None and (torch.version, torch.cuda, torch.nccl) == (
        "2.11.0+cu130", "13.0", "2.28.9")
    context = one_machine(tmp_path, facts)
    for check in ("nvidia-smi", "gpu-count", "gpu-model", "driver", "cuda-driver", "torch",
                  "torch-cuda", "nccl", "ecc", "row-remapping", "retired-pages",
                  "persistence", "mig", "clocks", "gpu-processes", "jobs",
                  # one machine alone: its name may resolve to loopback, its address is
                  "name-resolution"):
        statuses = {r.status for r in results(context, check)}
        assert statuses == {Status.OK}, (check, results(context, check))


def test_the_real_probe_under_load_names_the_foreign_process_and_the_running_job(
        tmp_path: Path) -> None:
    facts = real_probe("load")
    processes = nvidia_smi.parse_processes(facts.text("apps") or "")
    assert [(p.pid, p.used_mib) for p in processes] == [(685, 5060), (803, 1364)]
    [finding] = results(one_machine(tmp_path, facts), "gpu-processes")
    assert finding.status is Status.FAIL
    assert "pid 685 python3 (5060 MiB)" in finding.message
    assert f"running job {JOB} (1 process)" in finding.message
    assert "kill 685" in finding.remedy and f"gpucluster stop {JOB}" in finding.remedy
    assert "803" not in finding.remedy  # the job's own worker is never to be killed


def test_a_node_without_ip_gets_no_interface_finding_it_cannot_back(tmp_path: Path) -> None:
    """The GPU machine had no iproute2. Its probe said so; an empty list of interfaces
    (what the probe said there before) would be no evidence that the cluster address is
    on none of them."""
    output = (FIXTURES / "probe-idle.txt").read_text()
    no_ip = f"@@gpc section addresses\n{probe.NO_IP}\n\n@@gpc end 0"
    assert no_ip in output
    for said, status in ((no_ip, Status.SKIP),
                         ("@@gpc section addresses\n\n@@gpc end 0", Status.WARN),
                         ("@@gpc section addresses\nlo 127.0.0.1/8\n@@gpc end 0", Status.OK)):
        facts = probe.parse_facts(output.replace(no_ip, said), time.time())
        [finding] = results(one_machine(tmp_path, facts), "interface")
        assert finding.status is status, finding
        if status is Status.SKIP:
            assert "`ip` not found: install iproute2" in finding.message


def test_the_loopback_name_is_still_a_failure_where_other_machines_need_it(
        tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - localhost\n  - {name: b, address: 10.0.0.2}\n")
    facts = real_probe("idle")
    context = Context(inventory_module.load(path), {"localhost": facts, "b": facts}, {},
                      {"localhost": Reachability({"vm": "127.0.0.1"}, "open"),
                       "b": Reachability({"vm": "127.0.0.1"}, "open")})
    assert {r.status for r in results(context, "name-resolution")} == {Status.FAIL}


def simulated(args: str, tmp_path: Path) -> str:
    """The sandbox's nvidia-smi, staged as the captured machine: one H200, driver 580."""
    state = tmp_path / "state.json"
    state.write_text('{"model": "h200", "count": 1, "driver": "580.159.04", '
                     '"fault": null, "slowdown": null}')
    done = subprocess.run([sys.executable, "-m", "gpucluster.sandbox.fake_nvidia_smi",
                           "--state", str(state), *shlex.split(args)],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.rstrip("\n")


@pytest.mark.parametrize("state", ["idle", "load"])
def test_the_simulation_prints_what_the_real_nvidia_smi_prints_for_our_queries(
        state: str, tmp_path: Path) -> None:
    """Headers (units and all, under nounits too), columns, and the values a capture of
    another H200 shares with this one; the idle state's other answers line by line."""
    real = real_outputs(state)
    queries = [c for c in real if c.startswith("nvidia-smi --query-")]
    assert len(queries) >= 8
    for command in queries:
        ours = simulated(command.removeprefix("nvidia-smi "), tmp_path).splitlines()
        theirs = real[command].splitlines()
        if "noheader" not in command:
            assert ours[0] == theirs[0], command
        width = {len(row.split(", ")) for row in theirs}
        assert {len(row.split(", ")) for row in ours} <= width, command
        if "--query-gpu" in command and "name" in command:
            assert "NVIDIA H200" in ours[-1].split(", "), command
    if state == "idle":
        for command in ("nvidia-smi --version", "nvidia-smi -L"):
            assert simulated(command.removeprefix("nvidia-smi "), tmp_path) == real[command]


@pytest.mark.parametrize("has_ip", [True, False])
def test_top_samples_a_host_reached_without_ssh(tmp_path: Path, has_ip: bool) -> None:
    """The sampler quits when its stdin ends: over SSH the session holds it open; on a
    local host it was /dev/null, so `top` saw no frame ("the sampler ended (exit 0)").
    The GPU machine had no `ip` either, which the sampler died of. The stand-in
    nvidia-smi loops the H200's rows as the real one's -lms loop does."""
    real = real_outputs("load")
    gpu_query = next(c for c in real if c.startswith("nvidia-smi --query-gpu=index,uuid,name")
                     and "clocks.current.sm" in c)
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "nvidia-smi",
             f'case "$1" in --query-gpu=*) row={shlex.quote(real[gpu_query])};; *) row=;; esac\n'
             'while :; do [ -n "$row" ] && printf "%s\\n" "$row"\n'
             '  case "$*" in *-lms*) sleep 0.2;; *) exit 0;; esac\n'
             'done\n')
    # without ip: nothing on PATH but the stand-in and the sleep its loop needs
    (bin_dir / "sleep").symlink_to(shutil.which("sleep") or "/bin/sleep")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}" if has_ip else str(bin_dir)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"cluster: {{python: {sys.executable}}}\nhosts: [localhost]\n")
    done = gpucluster("top", "-i", str(inventory), "--once", "--json", timeout=60,
                      env={"PATH": path})
    [node] = done.json()["nodes"]
    assert not node["stale"] and not node["error"], node
    assert node["interface"] == "lo"  # towards its own address: the node is alone
    [gpu] = node["gpus"]
    row = real[gpu_query].split(", ")  # index, uuid, name, bus, util, used, total...
    assert row[2] == "NVIDIA H200" and int(row[4]) > 90  # the capture was under load
    assert (gpu["name"], gpu["util_pct"], gpu["mem_used_mib"], gpu["mem_total_mib"]) == (
        row[2], int(row[4]), int(row[5]), int(row[6]))
    assert all_ended(str(stand_in))  # top's end ended the sampler, and its loops
