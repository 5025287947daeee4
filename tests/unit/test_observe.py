"""The sampler's frames, the snapshot's summary and JSON, the exporter's exposition, and
the sampler script itself against the simulated nvidia-smi."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpucluster.observe.exporter import ClusterCollector
from gpucluster.observe.model import NodeSample, bus_key, parse_frame
from gpucluster.observe.slowest import Slowest
from gpucluster.observe.snapshot import NodeView, Snapshot, to_json
from gpucluster.templating import template_dir
from tests.cli import gpucluster
from tests.processes import all_ended

JOB = "20261130-120000-abcd"


def frame(util: tuple[int, ...] = (90, 3), rx: int = 1000, xid: list | None = None,
          job: str | None = JOB, foreign: bool = True) -> str:
    gpus = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100", "bus_id":
             f"00000000:{0x18 + i:02X}:00.0", "util": u, "mem_used": 100 * (i + 1),
             "mem_total": 81559, "temp": 40, "power": 70.5, "ecc": 2,
             **({"sm_clock": 1980, "mem_temp": 54, "clock_events": 0x4} if i == 0
                else {})}  # GPU 0 at its power cap; GPU 1 of an older driver

            for i, u in enumerate(util)]
    processes = [{"gpu_uuid": "GPU-0", "pid": 11, "used_mib": 100, "user": "root",
                  "state": "S", "readable": True, "job": job, "rank": 2, "local_rank": 0},
                 {"gpu_uuid": "GPU-1", "pid": 12, "used_mib": 200, "user": "root",
                  "state": "R", "readable": True, "job": job, "rank": 3, "local_rank": 1},
                 {"gpu_uuid": "GPU-1", "pid": 99, "used_mib": 50, "user": "alice",
                  "state": "S", "readable": False, "job": None, "rank": None,
                  "local_rank": None}][:3 if foreign else 2][:None if job else 0]
    return json.dumps({"t": 1.0, "interface": "eth0", "rates": {"eth0": [rx, 2 * rx],
                                                               "mlx5_0/1": [0, 0]},
                       "load": [1.5, 1, 1], "cpus": 16, "error": "", "gpus": gpus,
                       "processes": processes, "xid": xid if xid is not None else []})


def view(host: str, sample: NodeSample | None, stale: bool = False,
         ecc_base: dict[str, int] | None = None) -> NodeView:
    return NodeView(host, sample, 0.4 if not stale else 4.2, stale,
                    "no frame for 5s" if stale else "", ecc_base or {})


def test_a_frame_is_parsed_and_anything_else_is_not() -> None:
    sample = parse_frame(frame(xid=[["0000:19:00", 79]]))
    assert sample is not None
    assert [g.util for g in sample.gpus] == [90, 3]
    assert [p.rank for p in sample.processes_on(sample.gpus[1])] == [3, None]
    assert sample.processes[2].owner == "foreign" and sample.processes[0].owner == "running"
    assert sample.xid_on(sample.gpus[1]) == [79] and sample.xid_on(sample.gpus[0]) == []
    assert bus_key("0000:19:00") == bus_key("00000000:19:00.0") == (0, 0x19, 0)
    assert parse_frame("Welcome to node1") is None
    assert parse_frame('{"t": 1, "gpus": [{"index": "x"}]}') is None


def test_the_summary_names_the_slowest_node_the_busiest_link_and_idle_job_gpus() -> None:
    busy, slow = parse_frame(frame((95, 90), rx=10)), parse_frame(frame((40, 2), rx=5000))
    snapshot = Snapshot(0.0, 1.0, (view("node1", busy), view("node2", slow),
                                   view("node3", None, stale=True)))
    summary = snapshot.summary
    # Per job: the job's GPUs (node2's 40% and 2%), and alice's process of no known job
    # on GPU 1 of both nodes (node2's 2%), the slowest first.
    assert summary.slowest == (Slowest("node2", 2.0, None), Slowest("node2", 21.0, JOB))
    assert summary.busiest == ("node2", "eth0", 15000)
    assert summary.idle_in_jobs == (("node2", 1, JOB),)  # 2% while its job runs
    # A Slurm job's idle GPU is named too, as logs and stop name it.
    slurm = json.loads(frame((40, 2), foreign=False))
    for process in slurm["processes"]:
        process.update(job=None, rank=None, slurm_job="12")
    in_slurm = Snapshot(0.0, 1.0, (view("node1", parse_frame(json.dumps(slurm))),))
    assert in_slurm.summary.idle_in_jobs == (("node1", 1, "slurm-12"),)
    idle = Snapshot(0.0, 1.0, (view("node1", parse_frame(frame((0, 0), rx=0))),
                               view("node2", parse_frame(frame((1, 0), rx=0)))))
    assert idle.summary.slowest == () and idle.summary.busiest is None  # nothing works
    assert summary.busy_gpus == (3, 4) and idle.summary.busy_gpus == (0, 4)
    # A job on 2 of 8 GPUs per node: judged on those 2, not diluted by 6 idle ones
    # (node1 read 4% beside node2's 28%, where its job's GPUs ran at 15%).
    job_on_two = Snapshot(0.0, 1.0, tuple(
        view(host, parse_frame(frame((util, util, *[0] * 6), foreign=False)))
        for host, util in (("node1", 15), ("node2", 25))))
    assert job_on_two.summary.slowest == (Slowest("node1", 15.0, JOB),)


def test_a_node_is_compared_only_with_the_other_nodes_of_its_own_job() -> None:
    from gpucluster.cli.views.top import summary_line

    other = "20261130-120500-f00d"

    def node(host: str, util: tuple[int, ...], job: str | None) -> NodeView:
        return view(host, parse_frame(frame(util, job=job, foreign=False)))

    # node5 runs nothing: it read as the slowest node at 0% beside the jobs' nodes.
    idle = node("node5", (0, 0), None)
    one_job = Snapshot(0.0, 1.0, (node("node1", (90, 80), JOB), node("node2", (60, 50), JOB),
                                  idle))
    assert one_job.summary.slowest == (Slowest("node2", 55.0, JOB),)
    assert "| slowest node: node2 (55% GPU) |" in summary_line(one_job).plain
    # Two jobs on nodes of their own: each job's slowest node, the slowest first.
    two_jobs = Snapshot(0.0, 1.0, (*one_job.nodes[:2], node("node3", (20, 10), other),
                                   node("node4", (30, 30), other), idle))
    assert two_jobs.summary.slowest == (Slowest("node3", 15.0, other),
                                        Slowest("node2", 55.0, JOB))
    assert "| slowest nodes: node3 (15% GPU, f00d), node2 (55% GPU, abcd) |" in \
        summary_line(two_jobs).plain
    # A job on one node has nothing to be slower than.
    alone = Snapshot(0.0, 1.0, (node("node1", (90, 80), JOB), node("node3", (20, 10), other)))
    assert alone.summary.slowest == () and "slowest" not in summary_line(alone).plain


def test_the_summary_line_counts_busy_gpus_even_on_one_node() -> None:
    from gpucluster.cli.views.top import summary_line

    alone = Snapshot(0.0, 1.0, (view("node1", parse_frame(frame((65, 50), rx=0))),))
    assert alone.summary.slowest == () and alone.summary.busiest is None
    assert summary_line(alone).plain == "2/2 GPUs busy"  # not "no GPU activity"
    none = Snapshot(0.0, 1.0, (view("node1", None, stale=True),))
    assert summary_line(none).plain == "no GPUs sampled | stale: node1"
    # Every GPU's Xid column read `?` with nothing to say why (a sudo user whose sudo
    # asks a password cannot read the kernel log)
    unread = {**json.loads(frame((65, 50), rx=0)), "xid": None}
    blind = Snapshot(0.0, 1.0, tuple(view(n, parse_frame(json.dumps(unread)))
                                     for n in ("node1", "node2")))
    assert summary_line(blind).plain.endswith(
        " | Xid ?: node[1-2] cannot read the kernel log (fix: --ask-sudo-pass where sudo "
        "asks a password, passwordless sudo, or sysctl kernel.dmesg_restrict=0)")


def _quiet_frame(quiet: dict[str, float]) -> NodeSample | None:
    return parse_frame(json.dumps({**json.loads(frame((99, 99), rx=0)), "quiet": quiet}))


def test_a_job_quiet_on_every_node_is_said_by_top_and_served_by_the_exporter() -> None:
    """A hang keeps the GPUs busy (NCCL waits spinning) and prints nothing: a job
    quiet for a minute on every node is said, by the least of its nodes' readings."""
    from gpucluster.cli.views.top import summary_line

    other = "20261130-130000-9f9f"
    snapshot = Snapshot(0.0, 1.0, (view("node1", _quiet_frame({JOB: 300.0, other: 400.0})),
                                   view("node2", _quiet_frame({JOB: 75.5, other: 20.0}))))
    assert snapshot.summary.quiet == ((JOB, 75.5),)  # the other printed 20 s ago on node2
    assert summary_line(snapshot).plain.endswith(
        " | job abcd quiet for 1m: no output or heartbeat on any node")
    assert to_json(snapshot)["summary"]["quiet_jobs"] == [{"job": JOB, "quiet_s": 75.5}]

    streams = SimpleNamespace(interval_s=1.0, inventory=SimpleNamespace(hosts=[]),
                              nodes={"node1": _Stream(_quiet_frame({JOB: 300.0}), 0.3)})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(streams))  # type: ignore[arg-type]
    assert f'gpucluster_job_quiet_seconds{{Hostname="node1",job_id="{JOB}"}} 300.0' in \
        generate_latest(registry).decode()


def test_gpus_whose_clocks_are_held_down_are_named_with_the_reason_and_a_remedy() -> None:
    """A thermal slowdown halves a GPU's clocks: its rank becomes the straggler. The
    power cap alone (how a busy GPU runs) is not named."""
    from gpucluster.cli.views.top import summary_line

    hot = json.loads(frame((95, 90)))
    for gpu in hot["gpus"]:
        gpu["clock_events"] = 0x44  # power_cap + hw_thermal
    snapshot = Snapshot(0.0, 1.0, (view("node1", parse_frame(frame((95, 90)))),
                                   view("node2", parse_frame(json.dumps(hot)))))
    assert snapshot.summary.slowed == (("node2", 0, ("hw_thermal",)),
                                       ("node2", 1, ("hw_thermal",)))
    assert " | clocks held down: node2 GPU 0-1 hw_thermal (too hot: check the node's " \
        "cooling and airflow)" in summary_line(snapshot).plain
    payload = to_json(snapshot)
    assert payload["summary"]["slowed_gpus"] == [
        {"host": "node2", "gpu": 0, "reasons": ["hw_thermal"]},
        {"host": "node2", "gpu": 1, "reasons": ["hw_thermal"]}]
    assert [g["clock_events"] for g in payload["nodes"][0]["gpus"]] == [["power_cap"], None]
    assert payload["nodes"][1]["gpus"][0]["clock_events"] == ["power_cap", "hw_thermal"]


def test_json_counts_ecc_errors_since_first_seen_and_marks_stale_nodes() -> None:
    sample = parse_frame(frame())
    snapshot = Snapshot(0.0, 1.0, (view("node1", sample, ecc_base={"GPU-0": 1}),
                                   view("node2", None, stale=True)))
    payload = to_json(snapshot)
    node1, node2 = payload["nodes"]
    assert [g["ecc_errors"] for g in node1["gpus"]] == [1, 0]  # 2 now, 1 when first seen
    assert node1["rx_bytes_per_s"] == 1000 and node1["tx_bytes_per_s"] == 2000
    assert node1["infiniband"] == {"mlx5_0/1": {"rx_bytes_per_s": 0, "tx_bytes_per_s": 0}}
    assert node1["gpus"][1]["processes"][1]["foreign"] is True
    assert node2 == {**node2, "stale": True, "age_s": 4.2, "gpus": [], "error":
                     "no frame for 5s"}


class _Stream:
    def __init__(self, sample: NodeSample | None, age: float | None) -> None:
        self.sample, self.age = sample, age

    def view(self) -> tuple[NodeSample | None, float | None, str, dict[str, int]]:
        return self.sample, self.age, "" if self.age and self.age < 2 else "silent", {}


class _Streams:
    interval_s = 1.0

    def __init__(self, expected_gpus: dict[str, int] | None = None) -> None:
        self.nodes = {"node1": _Stream(parse_frame(frame(xid=[["0000:18:00", 48]])), 0.3),
                      "node2": _Stream(parse_frame(frame()), 7.0)}
        self.inventory = SimpleNamespace(hosts=[  # the inventory's `gpus`, where given
            SimpleNamespace(name=name, gpus=gpus) for name, gpus in (expected_gpus or {}).items()])


def test_the_exporter_speaks_dcgm_names_and_leaves_stale_nodes_out() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(_Streams()))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert ('DCGM_FI_DEV_GPU_UTIL{Hostname="node1",UUID="GPU-0",device="nvidia0",gpu="0",'
            f'hpc_job="{JOB}",modelName="NVIDIA H100",pci_bus_id="00000000:18:00.0"}} 90.0'
            ) in text
    assert 'DCGM_FI_DEV_FB_FREE{Hostname="node1",UUID="GPU-1"' in text
    assert 'DCGM_FI_DEV_XID_ERRORS{Hostname="node1",UUID="GPU-0"' in text and \
        'pci_bus_id="00000000:18:00.0"} 48.0' in text
    assert 'Hostname="node2",UUID' not in text  # stale: its GPU series are left out
    clocks = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_SM_CLOCK{")]
    assert len(clocks) == 1 and 'gpu="0"' in clocks[0] and clocks[0].endswith(" 1980.0")
    assert re.search(r'^DCGM_FI_DEV_CLOCKS_EVENT_REASONS\{.*gpu="0".*\} 4.0$', text, re.M)
    assert re.search(r'^DCGM_FI_DEV_MEMORY_TEMP\{.*gpu="0".*\} 54.0$', text, re.M)
    assert 'gpucluster_node_up{Hostname="node2"} 0.0' in text
    assert 'gpucluster_node_up{Hostname="node1"} 1.0' in text
    assert (f'gpucluster_gpu_job_info{{Hostname="node1",UUID="GPU-1",gpu="1",job_id="{JOB}",'
            f'local_rank="1",rank="3"}} 1.0') in text
    assert 'pid="99",rank="",user="alice"} 50.0' in text  # foreign, with its memory
    assert ('gpucluster_node_network_receive_bytes_per_second{Hostname="node1",'
            'interface="eth0"} 1000.0') in text


def test_a_node_whose_driver_failed_is_counted_against_the_inventorys_gpus() -> None:
    """Its frames come with no GPU: no DCGM series, nothing for an alert to see, but for
    the count of GPUs answering beside the inventory's (GpuclusterGpusMissing)."""
    failed = json.loads(frame(util=()))
    failed.update(processes=[], error="NVIDIA-SMI has failed because it couldn't "
                                      "communicate with the NVIDIA driver.")
    streams = _Streams(expected_gpus={"node1": 2, "node3": 8, "elsewhere": 4})
    streams.nodes["node3"] = _Stream(parse_frame(json.dumps(failed)), 0.3)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(streams))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    answering = dict(re.findall(r'^gpucluster_node_gpus\{Hostname="(\w+)"\} (\S+)$', text,
                                re.M))
    assert answering == {"node1": "2.0", "node3": "0.0"}  # node2 is stale: left out
    expected = dict(re.findall(r'^gpucluster_node_gpus_expected\{Hostname="(\w+)"\} (\S+)$',
                               text, re.M))
    assert expected == {"node1": "2.0", "node3": "8.0"}  # node2: the inventory says none
    assert 'Hostname="node3",UUID' not in text


def test_dcgm_series_carry_hpc_job_as_dcgm_exporters_job_mapping_does() -> None:
    """One series per job holding the GPU (a Slurm job by its ID), none on an idle GPU."""
    raw = json.loads(frame(util=(90, 3, 0)))
    raw["processes"][2].update(slurm_job="12")  # alice's process: Slurm job 12's
    streams = _Streams()
    streams.nodes = {"node1": _Stream(parse_frame(json.dumps(raw)), 0.3)}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(streams))  # type: ignore[arg-type]
    util = [line for line in generate_latest(registry).decode().splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    jobs = [(re.search(r'gpu="(\d)"', line)[1],  # type: ignore[index]
             (re.findall(r'hpc_job="([^"]*)"', line) or [None])[0], line.rsplit(" ", 1)[1])
            for line in util]
    assert sorted(jobs, key=str) == [("0", JOB, "90.0"), ("1", "12", "3.0"),
                                     ("1", JOB, "3.0"), ("2", None, "0.0")]


def test_the_exporter_binds_first_and_says_why_it_cannot(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from gpucluster.errors import GpuclusterError
    from gpucluster.observe.exporter import listening

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(GpuclusterError, match=rf"^--listen 127.0.0.1:{port}: cannot "
                                                  rf"serve there: another program listens "
                                                  rf"on port {port} \(fix: another port"), \
                listening("127.0.0.1", port):
            pass
    with pytest.raises(GpuclusterError, match=r"nor a name it resolves \(fix: "), \
            listening("no-such-host.invalid", port):
        pass
    # Served from an empty registry until the caller registers its collector.
    with listening("127.0.0.1", port) as registry:
        registry.register(ClusterCollector(_Streams()))  # type: ignore[arg-type]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            assert 'gpucluster_node_up{Hostname="node1"} 1.0' in page.read().decode()
        # Only there: a landing page links to it, and any other path is not found, so
        # that a mistyped metrics_path fails its scrape instead of passing.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
            landing = page.read().decode()
        assert 'href="/metrics"' in landing and "gpucluster_node_up" not in landing
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metric", timeout=5)
        assert missing.value.code == 404
        assert "the metrics are at /metrics" in missing.value.read().decode()
    with pytest.raises(ConnectionRefusedError):  # closed: nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _local_exporter(tmp_path: Path, address: str, *where: str
                    ) -> tuple[subprocess.Popen[str], int]:
    """The exporter of this machine alone (a `localhost` inventory) on a free port of
    `address`, run with faulthandler: SIGABRT dumps every thread's stack. `where`, if
    given, says where to serve instead of `--listen address:port` ({port} filled in)."""
    inventory = tmp_path / "local.yaml"
    inventory.write_text("hosts: [localhost]\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    told = [arg.format(port=port) for arg in where] or ["--listen", f"{address}:{port}"]
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "gpucluster", "exporter", "-i",
         str(inventory), *told], stderr=subprocess.PIPE, text=True, cwd=tmp_path), port


def _ended(exporter: subprocess.Popen[str], limit_s: float) -> int:
    """Its exit code once it ends; past `limit_s`, a failure with every thread's stack."""
    try:
        return exporter.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        exporter.send_signal(signal.SIGABRT)
        stacks = exporter.communicate(timeout=20)[1]
        raise AssertionError(f"the exporter outlived SIGTERM by {limit_s:g} s:\n{stacks}"
                             ) from None


def test_the_exporter_on_every_network_says_so(tmp_path: Path) -> None:
    """Plain HTTP naming the nodes, jobs and users: on 0.0.0.0 the user is told."""
    exporter, port = _local_exporter(tmp_path, "0.0.0.0")  # noqa: S104 - what is tested
    hung = threading.Timer(30, exporter.kill)  # a hang fails the test, not the suite
    hung.start()
    try:
        assert exporter.stderr is not None
        said = [exporter.stderr.readline(), exporter.stderr.readline()]
    finally:
        hung.cancel()
        exporter.terminate()
        _ended(exporter, 20)
    assert said[0].startswith(f"serving http://0.0.0.0:{port}/metrics for 1 node"), said
    assert said[1].startswith("note: 0.0.0.0 serves every network this machine is on"), said


def test_the_exporters_port_alone_serves_this_machine_only(tmp_path: Path) -> None:
    """`--port 9477` and `--listen 9477` (dcgm-exporter's `-a :9400` habit) were errors;
    both serve on 127.0.0.1, never every network."""
    for where in (("--port", "{port}"), ("--listen", "{port}"),
                  ("--listen", "127.0.0.1:1", "-p", "{port}")):
        exporter, port = _local_exporter(tmp_path, "", *where)
        hung = threading.Timer(30, exporter.kill)
        hung.start()
        try:
            assert exporter.stderr is not None
            said = exporter.stderr.readline()
        finally:
            hung.cancel()
            exporter.terminate()
            _ended(exporter, 20)
        assert said.startswith(f"serving http://127.0.0.1:{port}/metrics for 1 node"), said


def test_the_exporter_ends_on_a_sigterm_that_another_of_its_threads_took(
        tmp_path: Path) -> None:
    """The kernel hands a process's signal to any thread that does not block it. The
    exporter's main thread waited on a lock without a timeout, which such a signal
    never woke: a CI run found it serving an hour after its SIGTERM. Here the signal goes
    to a thread other than the main one on purpose (tgkill)."""
    import ctypes
    import platform

    exporter, _ = _local_exporter(tmp_path, "127.0.0.1")
    try:
        assert exporter.stderr is not None
        assert exporter.stderr.readline().startswith("serving ")
        time.sleep(0.5)  # into its wait
        others = [int(t.name) for t in Path(f"/proc/{exporter.pid}/task").iterdir()
                  if int(t.name) != exporter.pid]
        assert others  # the server's and the sampler's threads
        tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # its syscall number
        assert ctypes.CDLL(None, use_errno=True).syscall(
            tgkill, exporter.pid, others[0], signal.SIGTERM) == 0
        code = _ended(exporter, 10)
    finally:
        exporter.kill()
        exporter.wait()
    assert code == 0


def _fake_nvidia_smi(directory: Path, count: int, first: str = "") -> Path:
    """An `nvidia-smi` in `directory` replaying `count` H200s (shell `first` runs before
    it); the state file, whose path names its processes."""
    state = directory / "gpu.json"
    state.write_text(json.dumps({"model": "h200", "count": count, "driver": None,
                                 "fault": None}))
    wrapper = directory / "nvidia-smi"
    root = Path(__file__).parents[2]
    wrapper.write_text(f"#!/bin/sh\n{first}PYTHONPATH={root} exec {sys.executable} -m "
                       f"gpucluster.sandbox.fake_nvidia_smi --state {state} \"$@\"\n")
    wrapper.chmod(0o755)
    return state


def _sampler(interval_ms: int, path: str) -> subprocess.Popen[str]:
    """The node script's stream towards 127.0.0.1 (so on lo), with PATH `path`."""
    return subprocess.Popen(
        [sys.executable, "-u", str(template_dir() / "observe" / "node_gpus.py"), "stream",
         str(interval_ms), "127.0.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PATH": path})


def _frames(count: int, interval_ms: int, path: str) -> list[NodeSample | None]:
    """The sampler's first `count` frames; then its stdin ends (as when the SSH session
    does) and it must quit cleanly."""
    sampler = _sampler(interval_ms, path)
    try:
        assert sampler.stdout is not None
        return [parse_frame(sampler.stdout.readline()) for _ in range(count)]
    finally:
        assert sampler.stdin is not None
        sampler.stdin.close()
        assert sampler.wait(timeout=10) == 0


def test_the_sampler_streams_frames_from_nvidia_smi_loops(tmp_path: Path) -> None:
    """The node script itself, with the simulated nvidia-smi on its PATH."""
    state = _fake_nvidia_smi(tmp_path, 2)
    # a worker that computes, so that its GPU works (the simulation follows its CPU)
    # its job dir's newest output or heartbeat 90 s ago: the job's quiet
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    for name, age in (("node.log", 300), ("heartbeat", 90)):
        (job_dir / name).touch()
        os.utime(job_dir / name, (time.time() - age, time.time() - age))
    worker = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 60\n"
                               "while time.time() < end: pass"],
                              env={**os.environ, "LOCAL_RANK": "1", "GPC_JOB_DIR": str(job_dir),
                                   "GPUCLUSTER_JOB": f"{JOB}@here", "RANK": "7"})
    sampler = _sampler(300, f"{tmp_path}:{os.environ['PATH']}")
    try:
        assert sampler.stdout is not None
        lines = [sampler.stdout.readline() for _ in range(3)]
        frames = [parse_frame(line) for line in lines]
    finally:
        worker.kill()
        assert sampler.stdin is not None
        sampler.stdin.close()  # as when the SSH session ends: it quits, and its loops
        assert sampler.wait(timeout=10) == 0
    loops = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True,
                           check=False)
    assert loops.stdout == ""  # its nvidia-smi loops ended with it
    assert all(f is not None and len(f.gpus) == 2 for f in frames)
    last = frames[-1]
    assert last is not None and last.interface == "lo"
    mine = [p for p in last.processes if p.pid == worker.pid]
    assert [(p.job, p.rank, p.local_rank, p.gpu_uuid[-1]) for p in mine] == \
        [(JOB, 7, 1, "1")]
    assert list(last.quiet) == [JOB] and 90 <= last.quiet[JOB] < 95, last.quiet
    assert all('"job_dir"' not in line for line in lines)  # read there, not sent
    # DCGM exporter's other gauges, as the H200 capture has them idle, boosted when busy
    idle, working = last.gpus
    assert (idle.sm_clock, idle.mem_clock, idle.mem_temp, idle.enc_util) == (345, 3201, 32, 0)
    assert working.util and working.sm_clock == 1980 and working.mem_temp > 32
    assert (idle.clock_events, working.clock_events) == (0x1, 0)  # gpu_idle; nothing
    assert idle.slowdowns == [] == working.slowdowns


def test_a_driver_without_the_extra_fields_still_streams_the_rest(tmp_path: Path) -> None:
    """An older driver refuses a field it does not know, and the whole query with it:
    the sampler then asks the fields every driver has."""
    _fake_nvidia_smi(tmp_path, 2, 'case "$*" in *temperature.memory*) echo \'Field '
                     '"temperature.memory" is not a valid field to query.\'; exit 2;; esac\n')
    for sample in _frames(2, 200, f"{tmp_path}:{os.environ['PATH']}"):
        assert sample is not None and sample.error == "", sample
        assert [(g.index, g.mem_total, g.sm_clock, g.mem_temp) for g in sample.gpus] == \
            [(0, 143771, None, None), (1, 143771, None, None)]


def test_a_node_without_nvidia_smi_still_reports_its_cpus_and_network(tmp_path: Path) -> None:
    """A CPU node (no NVIDIA driver): frames with no GPUs, the reason, load and traffic;
    the sampler must not die with its loops."""
    bin_dir = tmp_path / "bin"  # `ip` for the interface, and no nvidia-smi anywhere
    bin_dir.mkdir()
    ip = subprocess.run(["sh", "-c", "command -v ip"], capture_output=True, text=True,
                        check=True).stdout.strip()
    (bin_dir / "ip").symlink_to(ip)
    for frame in _frames(2, 200, str(bin_dir)):
        assert frame is not None and frame.gpus == () and frame.processes == ()
        assert frame.interface == "lo" and frame.cpus == os.cpu_count()
        assert frame.load1 is not None
        assert "no GPUs: nvidia-smi: No such file or directory" in frame.error


def test_the_first_frame_measures_traffic_over_the_time_it_was_counted(
        tmp_path: Path) -> None:
    """The first frame's rates once divided the bytes counted since the sampler started
    by the few microseconds after its first process query: a trickle showed as hundreds
    of Gb/s. A slow process query (as on a busy node) and a steady 2 MB/s on lo."""
    # the one-off process query (no -lms) takes a second
    _fake_nvidia_smi(tmp_path, 1, 'case "$*" in *-lms*) ;; *compute-apps*) sleep 1 ;; esac\n')
    stop = threading.Event()

    def send_steadily() -> None:  # 20 KB every 10 ms: 2 MB/s
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as source:
            sink.bind(("127.0.0.1", 0))
            while not stop.wait(0.01):
                for _ in range(5):
                    source.sendto(b"x" * 4000, sink.getsockname())
                    with contextlib.suppress(BlockingIOError):
                        sink.recv(8192, socket.MSG_DONTWAIT)
    sender = threading.Thread(target=send_steadily, daemon=True)
    sender.start()
    sampler = _sampler(1000, f"{tmp_path}:{os.environ['PATH']}")
    try:
        assert sampler.stdout is not None
        first = parse_frame(sampler.stdout.readline())
    finally:
        stop.set()
        assert sampler.stdin is not None
        sampler.stdin.close()
        assert sampler.wait(timeout=10) == 0
    assert first is not None and first.interface == "lo"
    received, _ = first.rates["lo"]
    assert 0 < received < 50_000_000, received  # 2 MB/s and whatever else lo carries


def test_top_shows_a_line_per_node_when_a_line_per_gpu_would_not_fit() -> None:
    """8 nodes of 8 GPUs are 74 lines: in a 40-line terminal the last nodes were cut off
    behind rich's '...'. Then each node gets one line: every GPU's utilisation as a bar,
    the sums, its jobs' ranks and its links."""
    from rich.console import Console

    from gpucluster.cli.views.top import render

    nodes = (view("node1", parse_frame(frame((95, 3), rx=1000)), ecc_base={"GPU-0": 0}),
             view("node2", parse_frame(frame((0, 100), rx=0))),
             view("node3", None, stale=True))

    def shown(height: int | None, compact: bool = False, width: int = 240) -> list[str]:
        console = Console(width=width, height=height or 25, record=True, file=io.StringIO())
        console.print(render(Snapshot(0.0, 1.0, nodes), console, compact=compact,
                             fit=height is not None))
        return console.export_text().splitlines()

    full = shown(height=None)
    assert len(full) == 2 + 2 + 2 + 2 + 1  # summary, header, 2 x (node + 2 GPUs), stale
    assert shown(height=len(full)) == full
    compact = shown(height=len(full) - 1)
    assert len(compact) == 2 + 3 and compact == shown(height=None, compact=True)
    node1 = next(line for line in compact if line.startswith("node1"))
    # Each GPU's bar (95%, 3%), memory summed, hottest, power summed, ECC/Xid summed,
    # its job's ranks and a foreign process, then the link.
    assert "█▁ 49%" in node1 and "0.3/159G" in node1 and "40C" in node1
    assert "141W" in node1 and "2/0" in node1, node1
    assert f"{JOB} ranks 2-3" in node1 and "foreign 1" in node1, node1
    assert "eth0 rx 8.0 kb/s tx 16.0 kb/s" in node1, node1
    assert "▁█ 50%" in next(line for line in compact if line.startswith("node2"))
    assert any(line.startswith("node3 stale") for line in compact)
    # A narrow terminal: still one line per node, every figure whole, the job cut short
    narrow = shown(height=None, compact=True, width=80)
    table = narrow[next(i for i, line in enumerate(narrow) if line.startswith("node ")):]
    node1 = table[1]  # (the summary line above it wraps)
    assert len(table) == 4 and "█▁ 49%" in node1 and "2/0" in node1
    # ...by its last part, which names it as well (gpucluster stop takes a unique part)
    assert f"{JOB.rsplit('-', 1)[1]} ranks 2-3" in node1 and JOB not in node1, node1
    assert "eth0" in node1  # the link keeps a third
    assert max(len(line) for line in table) <= 80
    # One rank on a node is `rank 2`, not `ranks 2`.
    one_rank = json.loads(frame((95, 3), foreign=False))
    del one_rank["processes"][1]
    console = Console(width=240, height=25, record=True, file=io.StringIO())
    console.print(render(Snapshot(0.0, 1.0, (view("node1", parse_frame(json.dumps(one_rank))),)),
                         console, compact=True))
    assert f"{JOB} rank 2 " in console.export_text(), console.export_text()
    # GPUs that keep no ECC count (a GeForce's [N/A]) show none, not 0 errors.
    no_ecc = json.loads(frame((5, 6)))
    for gpu in no_ecc["gpus"]:
        gpu["ecc"] = None
    geforce = Snapshot(0.0, 1.0, (view("node5", parse_frame(json.dumps(no_ecc))),))
    for compact in (False, True):
        console = Console(width=160, height=25, record=True, file=io.StringIO())
        console.print(render(geforce, console, compact=compact))
        text = console.export_text()
        assert re.search(r" -/0 ", text) and not re.search(r" 0/0 ", text), text
    # A node without GPU figures says why in the jobs' place: as its util figure, the
    # long reason took the other columns' room (every other node's memory was 'm…')
    driverless = json.loads(frame(()))
    driverless.update(error="no GPUs: nvidia-smi: No such file or directory (a node "
                            "without the NVIDIA driver; gpucluster doctor says more)",
                      processes=[])
    with_cpu_node = Snapshot(0.0, 1.0, (*nodes, view("node4",
                                                     parse_frame(json.dumps(driverless)))))
    console = Console(width=80, height=25, record=True, file=io.StringIO())
    console.print(render(with_cpu_node, console, compact=True))
    lines = console.export_text().splitlines()
    node1 = next(line for line in lines if line.startswith("node1"))
    node4 = next(line for line in lines if line.startswith("node4"))
    assert "█▁ 49%" in node1 and "0.3/159G" in node1 and "141W" in node1, lines
    assert re.search(r"^node4\s+-\s+-\s+-\s+-\s+-\s+no GPUs: nvidia-smi", node4), lines
    assert max(len(line) for line in lines[1:]) <= 80, lines
    # A line per GPU on a narrow screen: the job column is cut, so no line wraps.
    per_gpu = shown(height=None, width=66)
    gpu_lines = [line for line in per_gpu if line.startswith("    ")]
    assert len(gpu_lines) == 4 and max(len(line) for line in gpu_lines) <= 66, per_gpu
    # (rich 15 ends the cut with '…'; older rich crops it)
    assert all(JOB not in line for line in gpu_lines) and JOB[:12] in gpu_lines[0], gpu_lines


def test_xids_read_through_sudo_skip_the_records_logged_before_the_sampler_started() -> None:
    """cat /dev/kmsg (a sudo user's way in) starts at the buffer's oldest record, where
    the sampler's own open of /dev/kmsg starts at its end: older Xids are not new ones."""
    import runpy

    sampler = runpy.run_path(str(template_dir() / "observe" / "node_gpus.py"))
    xid = sampler["Xid"].__new__(sampler["Xid"])
    xid.events, xid.since_us = [], 5_000_000
    xid.record("3,100,4999999,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off\n")
    xid.record("3,101,5000001,-;NVRM: Xid (PCI:0000:19:00): 48, pid=2, DBE\n")
    xid.record("6,102,5000002,-;eth0: link up\n")
    assert xid.events == [["0000:19:00", 48]]


def test_a_sampler_that_fails_ends_its_nvidia_smi_loops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes' loop prints nothing while no process holds a GPU, so no closed pipe
    ever ends it: a sampler that died before its first frame (as one did on a node
    without `ip`) left it running on the node for good."""
    import runpy

    loop = tmp_path / "nvidia-smi"  # a loop that, like that one, prints nothing
    loop.write_text("#!/bin/sh\nwhile :; do sleep 0.2; done\n")
    loop.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # a stdin that never ends: its end would os._exit, the controller gone
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(read=threading.Event().wait))
    sampler = runpy.run_path(str(template_dir() / "observe" / "node_gpus.py"))

    def fails(_peer: str) -> None:
        raise RuntimeError("failed before the first frame")
    sampler["stream"].__globals__["interface_to"] = fails
    try:
        with pytest.raises(RuntimeError, match="before the first frame"):
            sampler["stream"](200, "127.0.0.1")
        assert all_ended(str(loop))
    finally:
        subprocess.run(["pkill", "-f", str(loop)], check=False)


def test_without_ip_the_cluster_interface_is_the_longest_route_of_proc_net_route() -> None:
    """A node without iproute2 (the H200 machine had none): the kernel's table says it."""
    import runpy

    sampler = runpy.run_path(str(template_dir() / "observe" / "node_gpus.py"))

    def word(address: str) -> str:  # as the kernel prints it: %08X of the word in memory
        return f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}"
    assert sys.byteorder != "little" or word("192.168.0.0") == "0000A8C0"  # as on x86
    default = "00000000"  # 0.0.0.0/0
    table = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n" + "".join(
        f"{name}\t{net}\t00000000\t0001\t0\t0\t0\t{mask}\n"
        for name, net, mask in (("eth0", default, default),
                                ("ib0", word("10.0.0.0"), word("255.0.0.0")),
                                ("eth1", word("10.1.2.0"), word("255.255.255.0"))))
    sampler["routed_interface"].__globals__["read"] = lambda _path: table
    routed = sampler["routed_interface"]
    assert [routed(a) for a in ("10.1.2.5", "10.9.9.9", "8.8.8.8", "127.0.0.1", "::1")] == [
        "eth1", "ib0", "eth0", "lo", None]


def test_a_slurm_jobs_process_is_slurms_not_foreign_and_never_a_target() -> None:
    """A running Slurm job's GPU process read as foreign: `reap --yes --foreign` ended it."""
    from rich.console import Console

    from gpucluster.cli.views.top import render
    from gpucluster.observe.model import process_of
    from gpucluster.observe.reap import NodeProcesses, targets

    def slurms(running: bool | None) -> dict:
        return {"gpu_uuid": "GPU-1", "pid": 77, "used_mib": 10, "user": "bob", "state": "S",
                "job": None, "slurm_job": "12", "slurm_job_running": running}

    listed = NodeProcesses("n1", tuple(process_of(slurms(r)) for r in (True, None, False)))
    assert [p.owner for p in listed.processes] == ["slurm", "slurm", "leftover"]
    assert targets(listed, foreign=True) == [listed.processes[2]]  # Slurm has forgotten it
    raw = json.loads(frame())
    raw["processes"][2] = slurms(None)
    sample = parse_frame(json.dumps(raw))
    assert sample is not None
    shown = Console(width=240, record=True, file=io.StringIO())
    shown.print(render(Snapshot(0.0, 1.0, (view("node1", sample),)), shown))
    assert "slurm-12 pid 77 (bob)" in shown.export_text()
    compact = Console(width=240, record=True, file=io.StringIO())
    compact.print(render(Snapshot(0.0, 1.0, (view("node1", sample),)), compact, compact=True))
    assert "ranks 2-3, slurm-12" in compact.export_text() and "foreign" not in \
        compact.export_text()
    gpu = to_json(Snapshot(0.0, 1.0, (view("node1", sample),)))["nodes"][0]["gpus"][1]
    assert gpu["processes"][1]["slurm_job"] == "12" and not gpu["processes"][1]["foreign"]
    # Under export sbatch's torchrun a Slurm job's worker has its rank: shown as a
    # gpucluster job's (it read `slurm-2 pid 13304 (root)` on the sandbox).
    raw["processes"][2].update(rank=5)
    ranked = Snapshot(0.0, 1.0, (view("node1", parse_frame(json.dumps(raw))),))
    shown = Console(width=240, record=True, file=io.StringIO())
    shown.print(render(ranked, shown))
    assert "slurm-12 rank 5 (bob)" in shown.export_text()
    compact = Console(width=240, record=True, file=io.StringIO())
    compact.print(render(ranked, compact, compact=True))
    assert "ranks 2-3, slurm-12 rank 5" in compact.export_text()
    streams = _Streams()
    streams.nodes = {"node1": _Stream(sample, 0.3)}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(streams))  # type: ignore[arg-type]
    assert ('gpucluster_gpu_slurm_job_info{Hostname="node1",UUID="GPU-1",gpu="1",'
            'slurm_job_id="12"} 1.0') in generate_latest(registry).decode()


def test_the_node_script_knows_the_same_ended_slurm_states_as_the_controller() -> None:
    """node_gpus.py runs on nodes alone, so it keeps a copy: reap must never take a job
    Slurm still has for an ended one."""
    import importlib.util

    from gpucluster.slurm_states import ENDED_JOB_STATES

    spec = importlib.util.spec_from_file_location(
        "node_gpus", template_dir() / "observe" / "node_gpus.py")
    assert spec is not None and spec.loader is not None
    node_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(node_script)
    assert node_script.SLURM_ENDED == ENDED_JOB_STATES


def test_a_process_whose_ending_did_not_run_is_never_reported_ended() -> None:
    """reap --yes printed `ended` for a root process beside sudo's `a password is
    required` (the end script never ran), the process still there."""
    from rich.console import Console

    from gpucluster.cli.reap_cmd import _print_node
    from gpucluster.observe.model import process_of
    from gpucluster.observe.reap import Ended, NodeProcesses

    foreign = process_of({"gpu_uuid": "GPU-1", "gpu_index": 3, "pid": 88, "used_mib": 512,
                          "user": "root", "state": "S"})
    done = Ended.not_run("node1", (foreign,), "lost the connection")
    left = {p.pid: why for p, why in done.left}
    shown = Console(width=240, record=True, file=io.StringIO())
    _print_node(shown, "node1", NodeProcesses("node1", (foreign,)), done, left, {88},
                yes=True, foreign=True)
    lines = shown.export_text().splitlines()
    assert lines == ["node1 pid 88 root GPU 3 512 MiB state S: foreign (not gpucluster's) "
                     "LEFT: not ended: see the node's error", "node1: lost the connection"]
    assert done.freed_mib == 0


def test_the_live_view_takes_c_to_switch_and_q_to_quit(tmp_path: Path) -> None:
    """top's live view on a terminal: c gives a line per node, q ends it at once (exit
    0, no Ctrl-C), and the terminal gets its echo and line mode back."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    inventory = tmp_path / "local.yaml"
    inventory.write_text("hosts: [localhost]\n")
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    top = subprocess.Popen([sys.executable, "-m", "gpucluster", "top", "-i", str(inventory),
                            "--interval", "0.5"], stdin=follower, stdout=follower,
                           stderr=follower, start_new_session=True, cwd=tmp_path)
    os.close(follower)
    screen = b""

    def shown() -> bytes:  # the screen's text, without its colours
        return re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", screen)

    def read_until(text: bytes, seconds: float = 30) -> None:
        nonlocal screen
        deadline = time.monotonic() + seconds
        while text not in shown() and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                screen += os.read(leader, 65536)
        assert text in shown(), shown()[-2000:]

    try:
        read_until(b"GPU   util")  # a line per GPU's header
        os.write(leader, b"c")
        read_until(b"ECC/Xid  jobs")  # a line per node's (its header: "jobs", not "job /")
        os.write(leader, b"q")
        code = top.wait(timeout=5)
        modes = termios.tcgetattr(leader)[3]
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(leader)
    assert code == 0
    assert modes & termios.ECHO and modes & termios.ICANON


def test_a_node_without_nvidia_smi_has_no_gpus_to_reap_not_an_error(tmp_path: Path) -> None:
    """A CPU node in the inventory (a login node, torch_device: cpu) made `reap` fail
    with `[Errno 2] No such file or directory: 'nvidia-smi'` and exit 1, every time."""
    listed = subprocess.run(
        [sys.executable, str(template_dir() / "observe" / "node_gpus.py"), "processes",
         str(tmp_path / "jobs"), "node3"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": str(tmp_path)}, check=True)  # no nvidia-smi on PATH
    payload = json.loads(listed.stdout.strip().splitlines()[-1])
    assert payload == {"error": "", "processes": [], "no_gpus": True}
    inventory = tmp_path / "local.yaml"
    inventory.write_text(f"cluster: {{python: {sys.executable}}}\nhosts: [localhost]\n")
    reaped = subprocess.run([sys.executable, "-m", "gpucluster", "reap", "-i", str(inventory)],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={**os.environ, "PATH": str(tmp_path)}, check=False)
    assert reaped.returncode == 0, reaped.stderr
    assert reaped.stderr == "localhost: no GPUs (no nvidia-smi there)\n"


def test_top_job_picks_the_nodes_the_job_runs_on(tmp_path: Path) -> None:
    from gpucluster.cli.launch_cmd import job_store
    from gpucluster.cli.top_cmd import _job_nodes
    from gpucluster.errors import GpuclusterError
    from gpucluster.inventory import load
    from gpucluster.launch.jobs import JobRecord

    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n" + "".join(f"  - {{name: node{i}, address: 10.0.0.{i}}}\n"
                                         for i in range(1, 4)))
    inventory = load(path)
    job = "20261204-000324-d082"
    job_store(inventory).save(JobRecord(job, "t.py", [], ["node3", "node2", "gone"], "/c",
                                        "/j", 100.0, {"node2": 2, "node3": 2}))
    picked = _job_nodes(inventory, inventory.select(), "d082", None)
    assert [h.name for h in picked] == ["node2", "node3"]  # the inventory's order
    assert [h.name for h in _job_nodes(inventory, inventory.select("node[1-2]"), "last",
                                       "node[1-2]")] == ["node2"]
    with pytest.raises(GpuclusterError, match=re.escape(
            f"job {job} ran on gone,node[2-3], none of them in -w/-g node1 (fix: gpucluster "
            f"top without --job, or -w with the job's nodes)")):
        _job_nodes(inventory, inventory.select("node1"), job, "node1")
    # An unknown job is refused before any password is asked for.
    done = gpucluster("top", "-i", str(path), "-j", "nope", "--ask-pass", stdin="secret\n")
    assert done.code == 2 and done.stderr.strip() == (
        "gpucluster: error: job 'nope' matches no job (fix: gpucluster jobs lists them)"), \
        done.stderr


def test_a_marker_without_a_job_dir_is_a_running_smoke_test_never_a_leftover(
        tmp_path: Path) -> None:
    """A smoke test's processes carry the job marker but it has no job dir: read as a
    job whose torchrun had ended, reap --yes took a running smoke test for leftovers and
    ended it. Nothing tells such a marker ended: it runs; a job's dir with its leader
    gone is still a leftover."""
    import runpy

    sampler = runpy.run_path(str(template_dir() / "observe" / "node_gpus.py"))
    job_running = sampler["job_running"]
    assert job_running(str(tmp_path), "gpucluster-smoke-0123abcd", "node1") is True
    node_dir = tmp_path / "20261207-120000-abcd" / "node1"
    node_dir.mkdir(parents=True)
    (node_dir / "leader.pid").write_text(f"{2 ** 22 + 1}\n")  # no such process
    assert job_running(str(tmp_path), "20261207-120000-abcd", "node1") is False
    leader = subprocess.Popen(["sleep", "30"], env={
        **os.environ, "GPUCLUSTER_JOB": "20261207-120000-abcd@node1"})
    try:
        (node_dir / "leader.pid").write_text(f"{leader.pid}\n")
        assert job_running(str(tmp_path), "20261207-120000-abcd", "node1") is True
    finally:
        leader.kill()
        leader.wait()
