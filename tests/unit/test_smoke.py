"""Judging smoke results, and the torchrun command each node gets."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from gpucluster import inventory as inventory_module
from gpucluster.nproc import nproc_for
from gpucluster.smoke.runner import command_for, judge, slow_nodes


def _found(correct: bool = True, busbw: float = 5.0) -> dict:
    return {"backend": "gloo", "world_size": 4,
            "sweep": [{"bytes": 1 << 20, "time_s": 0.01, "algbw_gbps": busbw / 1.5,
                       "busbw_gbps": busbw, "correct": correct}],
            "per_node": {"a": {"link_gbps": None, "intra_busbw_gbps": 9.0, "compute_s": 0.05},
                         "b": {"link_gbps": 9.0, "intra_busbw_gbps": 9.0, "compute_s": 0.05},
                         "c": {"link_gbps": 8.0, "intra_busbw_gbps": 8.5, "compute_s": 0.06},
                         "d": {"link_gbps": 0.9, "intra_busbw_gbps": 9.2, "compute_s": 0.30}}}


def test_a_slow_link_and_a_slow_compute_are_named() -> None:
    slow = slow_nodes(_found()["per_node"])
    assert set(slow) == {"d"}
    # both reasons, the link's first: a noisy compute time must not hide a slow link
    assert slow["d"] == ("link to the head: 0.900 Gbit/s, others about 8.500; "
                         "compute kernel: 0.300 s, others about 0.050 s")


def test_wrong_results_threshold_and_node_errors_fail() -> None:
    assert judge(_found(), {}, None).passed
    assert not judge(_found(correct=False), {}, None).passed
    low = judge(_found(busbw=2.0), {}, 10.0)
    assert not low.passed and "under the threshold 10" in low.problems[0]
    broken = judge(_found(), {"c": "torchrun exited 1: boom"}, None)
    assert broken.problems == ["c: torchrun exited 1: boom"]
    # what several nodes say alike is said once for them
    alike = judge(_found(), {"n1": "timed out: x", "n2": "timed out: x", "c": "boom"}, None)
    assert alike.problems == ["n[1-2]: timed out: x", "c: boom"]


def test_nproc_per_node() -> None:
    path = Path(__file__).parent.parent.parent / "inventory.example.yaml"
    loaded = inventory_module.load(path)
    assert nproc_for(loaded.host("gpu01"), None) == 8
    assert nproc_for(loaded.host("gpu05"), None) == 4
    assert nproc_for(loaded.host("gpu01"), 2) == 2


def test_command_quotes_inventory_values_and_sets_interfaces(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  torchrun: '/opt/my venv/bin/torchrun'\n"
                    "  work_dir: '~/jobs; rm -rf x'\nhosts:\n  - name: a\n    address: 10.0.0.1\n"
                    "  - name: b\n    address: 10.0.0.2\n")
    loaded = inventory_module.load(path)
    command = command_for(loaded, loaded.host("b"), "rid", 1, "auto", 5, "cuda")
    assert command.endswith(" --device cuda")
    assert "'/opt/my venv/bin/torchrun'" in command
    assert "'jobs; rm -rf x'" in command
    assert "--rdzv-endpoint 10.0.0.1:29500" in command and "--nnodes 2" in command
    assert 'NCCL_SOCKET_IFNAME="$iface" GLOO_SOCKET_IFNAME="$iface"' in command
    shlex.split(command)  # well-formed shell words
    path.write_text("cluster:\n  env: {GLOO_SOCKET_IFNAME: ib0}\nhosts: [a, b]\n")
    pinned = inventory_module.load(path)
    assert "GLOO_SOCKET_IFNAME=\"$iface\"" not in command_for(pinned, pinned.host("a"), "r",
                                                               1, "auto", 5)


def test_a_rank_told_to_use_the_gpus_fails_in_torchs_words_where_it_finds_none(
        tmp_path: Path) -> None:
    """gloo on the CPU said `passed` of nodes whose torch is a CPU build, where the
    inventory says jobs use the GPUs. Told `--device cuda`, the smoke job run with this
    machine's torch (no GPU here) fails before any rendezvous, saying why in the words
    the known causes read."""
    import sys

    from gpucluster.launch.known_causes import known_cause
    from gpucluster.smoke.runner import JOB

    done = subprocess.run([sys.executable, str(JOB), "--device", "cuda"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    cause = known_cause(done.stderr.splitlines())
    assert cause is not None and cause.name == "no-gpu-for-torch", done.stderr[-2000:]


def test_sizes_take_units_and_a_bad_one_is_refused_before_any_node_runs() -> None:
    import pytest

    from gpucluster.errors import GpuclusterError
    from gpucluster.smoke.runner import parse_sizes

    assert parse_sizes("auto") == parse_sizes(" AUTO ") == "auto"
    assert parse_sizes("4,64K, 1M,2MiB,1g") == "4,65536,1048576,2097152,1073741824"
    for bad in ("abc", "1M,", "0", "3", "65G", "1.5M", "-4", "1T"):
        with pytest.raises(GpuclusterError, match=r"^--sizes .*: .* is not a message size "
                                                  r"from 4 bytes to 64G \(fix: e.g. "):
            parse_sizes(bad)


def test_without_gpus_in_the_inventory_smoke_runs_a_rank_per_gpu_found(
        tmp_path: Path) -> None:
    """A node of two GPUs (the real H200's index and MIG mode, and a second like it): two
    ranks without `gpus:` (they were one), and three refused before torchrun starts; with
    the GPUs in MIG mode, two refused. The two ranks, told to use the GPUs found, find none
    in this machine's torch (the stand-in has no driver): the test fails in torch's words,
    where gloo on the CPU used to say `passed`."""
    from gpucluster.nproc import GpuCount, count_gpus, counted_gpus
    from tests.cli import gpucluster

    env, inventory, real, answer = _a_local_node_of_two_gpus(tmp_path)

    def count(*visible: str) -> GpuCount | None:
        return counted_gpus("x\n" + subprocess.run(
            ["/bin/sh", "-c", count_gpus(visible or None)], env=env, capture_output=True,
            text=True, check=True).stdout)

    assert (count(), counted_gpus("")) == (GpuCount(2, mig=0), None)
    # CUDA_VISIBLE_DEVICES' reading: an index, a UUID or its start; nothing unknown
    assert [count("1"), count(real["uuid"][:12]), count("GPU-2", "0"), count("2")] == [
        GpuCount(1, 0), GpuCount(1, 0), GpuCount(2, 0), GpuCount(0, 0)]
    none_visible = subprocess.run(["/bin/sh", "-c", count_gpus(())], env=env,
                                  capture_output=True, text=True, check=True).stdout
    assert counted_gpus(none_visible) == GpuCount(0, 0)  # CUDA_VISIBLE_DEVICES=
    done = gpucluster("smoke", "-i", str(inventory), "--sizes", "64K", "--json", env=env,
                      timeout=120)
    assert "--nproc-per-node 2 " in (tmp_path / "torchrun-args").read_text()
    assert done.code == 1 and not done.json()["passed"], done.stdout + done.stderr
    assert any("localhost: likely cause: torch found no GPU it could use on the node (fix: "
               "`gpucluster doctor -w localhost --only nvidia-smi,torch-build," in problem
               for problem in done.json()["problems"]), done.stdout
    refused = gpucluster("smoke", "-i", str(inventory), "--nproc-per-node", "3", env=env)
    assert refused.code == 2
    assert ("--nproc-per-node 3: localhost has 2 GPUs (found there) (fix: "
            "--nproc-per-node 2 or fewer, one process per GPU)") in refused.stderr
    (tmp_path / "bin" / "nvidia-smi").write_text(
        f"#!/bin/sh\nprintf '%s' {shlex.quote(answer.replace('Disabled', 'Enabled'))}\n")
    in_mig = gpucluster("smoke", "-i", str(inventory), env=env)
    assert in_mig.code == 2
    assert "localhost: 2 GPUs in MIG mode, where CUDA gives a process one MIG device" in \
        in_mig.stderr


def _a_local_node_of_two_gpus(tmp_path: Path) -> tuple[dict[str, str], Path,
                                                       dict[str, str], str]:
    """This machine as a node whose nvidia-smi lists two GPUs (the real H200's row, and a
    second like it), its torchrun the real one noting its arguments and
    CUDA_VISIBLE_DEVICES in torchrun-args: the env, inventory, real row and answer."""
    import os
    import sys

    header, row = (Path(__file__).parents[1] / "fixtures" / "h200" / "nvidia-smi-idle.txt"
                   ).read_text().split("--query-gpu=index,name,")[1].splitlines()[2:4]
    real = dict(zip(header.split(", "), row.split(", "), strict=True))
    assert (real["index"], real["mig.mode.current"]) == ("0", "Disabled")
    answer = (f"0, {real['uuid']}, {real['mig.mode.current']}\n"
              f"1, GPU-2{real['uuid'][5:]}, {real['mig.mode.current']}\n")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s' {shlex.quote(answer)}\n")
    (tools / "nvidia-smi").chmod(0o755)
    torchrun = tmp_path / "torchrun"
    torchrun.write_text(f"#!/bin/sh\necho \"$@\" \"[$CUDA_VISIBLE_DEVICES]\" >> "
                        f"{tmp_path}/torchrun-args\n"
                        f"exec {Path(sys.executable).parent}/torchrun \"$@\"\n")
    torchrun.chmod(0o755)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"cluster: {{python: {sys.executable}, torchrun: {torchrun},"
                         f" work_dir: {tmp_path}/work, rendezvous_port: 29531}}\n"
                         f"hosts: [localhost]\n")
    return {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}, inventory, real, answer


def test_smoke_on_some_gpus_takes_their_port_and_refuses_a_held_one(tmp_path: Path) -> None:
    """smoke --gpus: a rank per GPU listed, CUDA_VISIBLE_DEVICES set; a GPU the node
    lacks refused; the rendezvous port held on the head (a job's) refused before torchrun
    starts, and with cluster.rendezvous_ports, GPU 1's port taken instead."""
    import socket

    from tests.cli import gpucluster

    env, inventory, _, _ = _a_local_node_of_two_gpus(tmp_path)
    noted = tmp_path / "torchrun-args"
    one = gpucluster("smoke", "-i", str(inventory), "--gpus", "1", "--sizes", "64K",
                     "--json", env=env, timeout=120)
    assert one.code == 1, one.stdout + one.stderr  # this machine's torch finds no GPU
    assert "--nproc-per-node 1 " in noted.read_text() and noted.read_text().endswith(
        "[1]\n"), noted.read_text()
    noted.unlink()
    lacking = gpucluster("smoke", "-i", str(inventory), "--gpus", "1-2", "--json", env=env)
    assert lacking.code == 1 and lacking.json()["problems"] == [
        "not run: localhost: nvidia-smi lists not every GPU of GPU 1-2 there (fix: choose "
        "GPUs that nvidia-smi -L lists on every node)"], lacking.stdout
    assert not noted.exists()
    with socket.create_server(("127.0.0.1", 29531)):
        held = gpucluster("smoke", "-i", str(inventory), "--json", env=env)
        assert held.code == 1 and len(held.json()["problems"]) == 1, held.stdout
        assert held.json()["problems"][0].startswith(
            "not run: localhost: port 29531 (the rendezvous port) is already held there, "
            "by a running job of ours or another program (fix: see which with gpucluster "
            "jobs, or sudo ss -ltnp 'sport = :29531'; let it finish, or test the GPUs it "
            "leaves free: smoke --gpus LIST; to run jobs on separate GPUs side by side, "
            "give each its own port: cluster.rendezvous_ports: 8"), held.stdout
        assert not noted.exists()
        inventory.write_text(inventory.read_text().replace(
            "rendezvous_port: 29531", "rendezvous_port: 29531, rendezvous_ports: 2"))
        beside = gpucluster("smoke", "-i", str(inventory), "--gpus", "1", "--sizes", "64K",
                            env=env, timeout=120)
        assert "port 29531" not in beside.stdout + beside.stderr, beside.stdout
        assert ":29532 " in noted.read_text(), noted.read_text()


def test_a_failed_node_is_told_by_its_ranks_error_and_its_likely_cause() -> None:
    """torchrun's last lines (its ChildFailedError's footer) say only that a worker
    failed: the rank's own error line is what smoke shows, with the cause it names."""
    from gpucluster.remote.result import CommandResult, FanoutResult
    from gpucluster.smoke.runner import _errors, _likely_causes
    from tests.unit.test_known_causes import GLOO_TIMED_OUT

    output = "\n".join([
        "[rank2]: Traceback (most recent call last):", "[rank2]:     work.wait()",
        GLOO_TIMED_OUT,
        "E1205 04:17:10.877000 29432 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 0 (pid: 29748) of binary: /usr/bin/python",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/"
        "errors.html",
        "============================================================"])
    failed = CommandResult("node3", "true", 1, "", output, 31.0)
    result: FanoutResult[CommandResult] = FanoutResult(("node3",), {"node3": failed}, {})
    error = _errors(result, "torchrun exited")["node3"]
    assert error.startswith("torchrun exited 1: RuntimeError: [/__w/pytorch/") and \
        "Read error [198.18.5.12]:62888: Connection timed out" in error
    assert _likely_causes(result) == [
        "node3: likely cause: a connection between ranks stopped carrying data (fix: the "
        "other node went away, or the network between them drops packets: the full-size "
        "ones where the nodes' MTU is larger than the path's; `gpucluster doctor --only "
        "ssh,peer-ports,path-mtu` says which)"]


def test_smoke_refuses_gpus_a_job_of_ours_runs_on_and_names_it(tmp_path: Path) -> None:
    """The first round, run here for real, finds a job's process by its marker and its
    CUDA_VISIBLE_DEVICES; smoke on a GPU of the job's is refused naming it and the way
    out, on others it may run. A job on every GPU refuses any smoke; another smoke test
    is named as one."""
    import os

    from gpucluster.doctor.gpu_selection import from_option
    from gpucluster.remote.result import CommandResult, FanoutResult
    from gpucluster.smoke import first_round

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [gpc-unit-node]\n")
    loaded = inventory_module.load(path)
    host = loaded.hosts[0]
    env = {**os.environ, "GPUCLUSTER_JOB": "20261207-120000-abcd@gpc-unit-node",
           "CUDA_VISIBLE_DEVICES": "2, 3"}
    job = subprocess.Popen(["sleep", "60"], env=env)
    try:
        said = subprocess.run(["/bin/bash", "-c", first_round.command(loaded, host)],
                              capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        job.kill()
        job.wait()
    assert "@@gpc job-gpus 20261207-120000-abcd 2,3\n" in said, said

    def refused(stdout: str, gpus: str | None) -> list[str]:
        answer = CommandResult(host.name, "first round", 0, stdout, "", 0.1)
        written: FanoutResult[CommandResult] = FanoutResult((host.name,),
                                                            {host.name: answer}, {})
        return first_round.refusals(loaded, written, from_option(gpus) if gpus else None)

    assert refused(said, "0-1") == [] and refused(said, "4") == []
    assert refused(said, "3-4") == refused(said, None) == [
        "gpc-unit-node: job 20261207-120000-abcd runs on GPU 2,3 there, GPUs this test "
        "would share with it (fix: let it finish, or end it: gpucluster stop "
        "20261207-120000-abcd; or test the GPUs it leaves free: smoke --gpus LIST)"]
    every = "@@gpc job-gpus 20261207-130000-beef -\n@@gpc port-busy 29500\n"
    assert refused(every, "7") == [
        "gpc-unit-node: job 20261207-130000-beef runs on every GPU there, GPUs this test "
        "would share with it (fix: let it finish, or end it: gpucluster stop "
        "20261207-130000-beef)"]  # it leaves no GPU free: no --gpus to offer
    assert refused("@@gpc job-gpus gpucluster-smoke-0123abcd 0\n", "0") == [
        "gpc-unit-node: another smoke test (gpucluster-smoke-0123abcd) runs on GPU 0 there "
        "(fix: let it finish, then run this one)"]
    assert refused("@@gpc port-busy 29500\n", None)[0].startswith(
        "gpc-unit-node: port 29500 (the rendezvous port) is already held there")
