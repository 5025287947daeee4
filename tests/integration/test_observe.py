"""top, the exporter (scraped by a real Prometheus) and reap, on a 3-node sandbox of
their own while a real 3-node torchrun job (2 ranks per node) runs: its workers are the
simulated GPUs' compute processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpucluster.procfs import gone
from tests.cli import gpucluster
from tests.sandbox import Sandbox, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET = "gpcobs", "198.19.8.0/24"
GPUS = 8  # the sandbox's default staging


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    # node3 too hot: every GPU's clocks held down (top names it, the exporter serves it)
    sandbox = start_sandbox(tmp_path_factory.mktemp("observe") / "cluster.yaml", NAME,
                            SUBNET, 3, "--clock-slowdown", "node3=hw_thermal",
                            provision="hosts")
    try:
        yield sandbox
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def start_job(cluster: Sandbox, project: Path, *hosts: str) -> str:
    """A long job (on `hosts`, else every node), once every rank has started stepping."""
    selection = ["-w", ",".join(hosts)] if hosts else []
    started = gpucluster("launch", "-i", str(cluster.inventory), *selection, "-d",
                         "--nproc-per-node", "2", "train.py", "--", "--epochs", "100000",
                         cwd=str(project), timeout=180)
    assert started.code == 0, started.stderr
    job_id = started.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 120
    while "epoch 1 loss" not in gpucluster("logs", "-i", str(cluster.inventory),
                                           job_id).stdout:
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(2)
    return job_id


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("project")
    train = Path(__file__).parents[2] / "examples" / "train.py"
    (directory / "train.py").write_bytes(train.read_bytes())
    return directory


@pytest.fixture(scope="module")
def job(cluster: Sandbox, project: Path) -> Iterator[str]:
    job_id = start_job(cluster, project)
    try:
        yield job_id
    finally:
        gpucluster("stop", "-i", str(cluster.inventory), job_id)


def top_once(cluster: Sandbox, *args: str) -> dict:
    done = gpucluster("top", "-i", str(cluster.inventory), "--once", "--json", *args)
    assert done.code == 0, done.stderr
    return json.loads(done.stdout)


def test_top_once_json_shows_every_gpu_and_attributes_each_rank(cluster: Sandbox, job: str,
                                                                tmp_path: Path) -> None:
    snapshot = top_once(cluster)
    # The schema, pinned: a change here is a new schema number.
    assert snapshot["schema"] == 1
    assert set(snapshot) == {"schema", "time", "interval_s", "nodes", "summary", "slurm"}
    assert snapshot["slurm"] is None  # no Slurm set up from beside this inventory
    node = snapshot["nodes"][0]
    assert set(node) == {"host", "stale", "age_s", "error", "interface", "rx_bytes_per_s",
                         "tx_bytes_per_s", "infiniband", "load1", "cpus", "gpus"}
    assert set(node["gpus"][0]) == {"index", "uuid", "name", "bus_id", "util_pct",
                                    "mem_used_mib", "mem_total_mib", "temp_c", "power_w",
                                    "ecc_errors", "xid_errors", "sm_clock_mhz",
                                    "mem_clock_mhz", "mem_temp_c", "mem_util_pct",
                                    "enc_util_pct", "dec_util_pct", "clock_events",
                                    "processes"}
    assert set(snapshot["summary"]) == {"slowest_node", "slowest_nodes", "busiest_link",
                                        "idle_gpus_in_jobs", "slowed_gpus", "quiet_jobs"}
    assert snapshot["summary"]["quiet_jobs"] == []  # it prints an epoch every few seconds
    # The job runs on every node: only its own nodes are compared, under its name.
    assert {s["job"] for s in snapshot["summary"]["slowest_nodes"]} <= {job}
    assert {(s["host"], s["gpu"], tuple(s["reasons"])) for s in
            snapshot["summary"]["slowed_gpus"]} == {("node3", g, ("hw_thermal",))
                                                     for g in range(GPUS)}

    assert [n["host"] for n in snapshot["nodes"]] == cluster.nodes
    ranks: dict[int, str] = {}
    for node in snapshot["nodes"]:
        assert not node["stale"] and node["interface"] == "eth0", node
        assert [g["index"] for g in node["gpus"]] == list(range(GPUS))
        for gpu in node["gpus"]:
            ours = [p for p in gpu["processes"] if p["job"] == job]
            # LOCAL_RANK k holds GPU k, with its memory; no other GPU holds anything.
            assert len(ours) == (1 if gpu["index"] < 2 else 0), gpu
            for process in ours:
                assert process["local_rank"] == gpu["index"] and not process["foreign"]
                assert process["used_mib"] > 0 and gpu["mem_used_mib"] >= process["used_mib"]
                ranks[process["rank"]] = node["host"]
    assert sorted(ranks) == list(range(6))
    assert all(len({r for r, h in ranks.items() if h == host}) == 2 for host in cluster.nodes)
    # -w selects hosts; --job the job's, among them.
    assert [n["host"] for n in top_once(cluster, "-w", "node2")["nodes"]] == ["node2"]
    assert [n["host"] for n in top_once(cluster, "--job", job[-4:])["nodes"]] == cluster.nodes
    assert [n["host"] for n in top_once(cluster, "-j", "last", "-w", "node[2-3]")[
        "nodes"]] == ["node2", "node3"]
    # A line per node: each node's two ranks of the job
    compact = gpucluster("top", "-i", str(cluster.inventory), "--once", "--compact")
    assert compact.code == 0, compact.stderr
    rows = {line.split()[0]: line for line in compact.stdout.splitlines()[2:]}
    assert sorted(rows) == cluster.nodes, compact.stdout
    for host in cluster.nodes:
        held = sorted(r for r, h in ranks.items() if h == host)
        assert f"{job} ranks {held[0]}-{held[1]}" in rows[host], compact.stdout
    # A one-node cluster has no peer to find its interface by: the one holding its address.
    alone = cluster.write_inventory(tmp_path / "one.yaml", hosts=[
        h for h in cluster.data["hosts"] if h["name"] == "node2"])
    done = gpucluster("top", "-i", str(alone), "--once", "--json")
    assert json.loads(done.stdout)["nodes"][0]["interface"] == "eth0", done.stderr


def test_doctor_fails_the_node_whose_clocks_are_held_down(cluster: Sandbox) -> None:
    done = gpucluster("doctor", "-i", str(cluster.inventory), "--only", "clocks", "--json")
    assert done.code == 1, done.stderr
    found = {r["host"]: (r["status"], r["message"]) for r in json.loads(done.stdout)["results"]}
    assert found == {"node1": ("OK", "no clocks held down"),
                     "node2": ("OK", "no clocks held down"),
                     "node3": ("FAIL", "GPU 0-7: clocks held down: hw_thermal")}


def _read_snapshots(process: subprocess.Popen[str], until: object, limit: float) -> dict:
    """Snapshots from `top --json` until `until(snapshot)` is true."""
    assert process.stdout is not None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        snapshot = json.loads(process.stdout.readline())
        if until(snapshot):  # type: ignore[operator]
            return snapshot
    raise AssertionError("the snapshot awaited never came")


def test_a_silent_node_turns_stale_within_3s_and_comes_back(cluster: Sandbox,
                                                             job: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "top", "-i", str(cluster.inventory), "--json",
         "--interval", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    namespace = f"{NAME}-node3"
    try:
        _read_snapshots(process, lambda s: all(not n["stale"] for n in s["nodes"]), 60)
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-I", chain, "-j",
                            "DROP"], check=True)
        dropped = time.monotonic()
        stale = _read_snapshots(process, lambda s: s["nodes"][2]["stale"], 30)
        assert time.monotonic() - dropped <= 3.0 + 1.0  # + one snapshot's interval
        assert not stale["nodes"][0]["stale"] and not stale["nodes"][1]["stale"]
        assert stale["nodes"][2]["age_s"] >= 2
    finally:
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-D", chain, "-j",
                            "DROP"], check=False)
    try:
        back = _read_snapshots(process, lambda s: not s["nodes"][2]["stale"], 40)
        assert len(back["nodes"][2]["gpus"]) == GPUS  # reconnected, a new sampler
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0


def test_the_live_view_renders_every_node_and_rank_on_a_terminal(cluster: Sandbox,
                                                                 job: str) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 140, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "top", "-i", str(cluster.inventory)],
        stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True)
    os.close(follower)
    screen = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and screen.count(b"rank 5") < 2:  # two frames
            with contextlib.suppress(OSError):
                screen += os.read(leader, 65536)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(timeout=20)
        os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", screen.decode(errors="replace"))
    assert code == 0
    for node in cluster.nodes:
        assert re.search(rf"^{node}\s+eth0 rx", text, re.M), text[-3000:]
    frame = text[text.rfind("GPU   util"):]
    for rank in range(6):
        assert f"{job} rank {rank}" in frame, frame
    assert "clocks held down: node3 GPU 0-7 hw_thermal (too hot" in text, text[-3000:]
    assert re.search(r"^\s+7\s+\d+%\s+[\d.]+/\d+G\s+\d+C\s+\d+W\s+0/\d", frame, re.M), frame


def test_top_into_a_pipe_prints_each_frame_whole_under_its_time(cluster: Sandbox,
                                                                job: str) -> None:
    """`top > gpus.log`: a live view off a terminal showed nothing until it ended."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "top", "-i", str(cluster.inventory), "--compact",
         "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    stamps: list[str] = []
    lines: list[str] = []
    watchdog = threading.Timer(60, process.kill)  # no third frame in a minute: fail
    watchdog.start()
    try:
        while len(stamps) < 3:
            line = process.stdout.readline()
            assert line, "top ended: " + "".join(lines)
            lines.append(line)
            if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n", line):
                stamps.append(line)
    finally:
        watchdog.cancel()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    frames = "".join(lines).split(stamps[1])[1]  # the second frame, whole
    for node in cluster.nodes:
        assert re.search(rf"^{node}\s+\S+\s+\d+%", frames, re.M), frames
    assert "GPUs busy" in frames


def _shipped_prometheus_config(tmp_path: Path, exporter_port: int) -> Path:
    """examples/prometheus/ as a user takes it (its node-per-instance relabelling, its
    alerts), pointed at this exporter and read every second."""
    shipped = Path(__file__).parents[2] / "examples" / "prometheus"
    config = yaml.safe_load((shipped / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(shipped / "alerts.yml")]
    config["scrape_configs"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{exporter_port}"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _alerts(port: int) -> list[dict]:
    """Pending and firing alerts, each by its labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5) as answer:
        return [alert["labels"] for alert in json.loads(answer.read())["data"]["alerts"]]


# The panels of NVIDIA's "NVIDIA DCGM Exporter Dashboard" (Grafana 12239, in
# dcgm-exporter's grafana/) but those on DCGM's profiling counters, which are not
# nvidia-smi's to read: its earlier revisions, which pick a node by `instance`, and the
# current one, which picks it by `Hostname`.
DASHBOARD_PANELS = (
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    'max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, uuid)',
    'avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"})',
    'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, '
    'uuid)',
    'sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) by (gpu))',
    'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, '
    'UUID, gpu)',
    'max(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, '
    'GPU_I_ID, GPU_I_PROFILE)',
)
OWN_DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana" / "gpucluster.json"


def _label_values(port: int, label: str, metric: str) -> list[str]:
    url = (f"http://127.0.0.1:{port}/api/v1/label/{label}/values?"
           + urllib.parse.urlencode({"match[]": metric}))
    with urllib.request.urlopen(url, timeout=5) as answer:
        return sorted(json.loads(answer.read())["data"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())["data"]["result"]


def _dashboard_queries(path: Path) -> Iterator[tuple[str, str, str]]:
    """Each query of a Grafana dashboard: its row's title, its panel's, its PromQL."""
    row = ""
    for panel in json.loads(path.read_text())["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        for target in panel.get("targets", []):
            yield row, panel["title"], target["expr"]


def _check_own_dashboard(port: int, cluster: Sandbox, job: str) -> None:
    """examples/grafana/gpucluster.json as Grafana would ask, every node and the job
    picked: each panel answers (Slurm's none: no Slurm is set up from here), the job's
    panels a series per rank, and node3's staged heat is counted."""
    answers: dict[str, list[dict]] = {}
    for row, title, expr in _dashboard_queries(OWN_DASHBOARD):
        answer = _query(port, expr.replace("$Hostname", ".*").replace("$job_id", job))
        assert bool(answer) != (row == "Slurm"), (row, title, expr, answer)
        answers[title] = answer
    for title in ("GPU utilisation by rank", "GPU memory by rank"):
        assert sorted(int(s["metric"]["rank"]) for s in answers[title]) == list(range(6)), \
            (title, answers[title])
    assert answers["Nodes up"][0]["value"][1] == "3", answers["Nodes up"]
    quiet = answers["Seconds without output or heartbeat"]  # each node's, a few seconds
    assert sorted(s["metric"]["Hostname"] for s in quiet) == cluster.nodes and \
        all(float(s["value"][1]) < 60 for s in quiet), quiet
    assert answers["GPUs in jobs"][0]["value"][1] == "6", answers["GPUs in jobs"]
    assert answers["GPUs held down"][0]["value"][1] == str(GPUS), answers["GPUs held down"]
    assert {s["metric"]["Hostname"] for s in answers["GPU utilisation"]} == set(cluster.nodes)
    one = _query(port, next(e for _, t, e in _dashboard_queries(OWN_DASHBOARD)
                            if t == "GPU utilisation").replace("$Hostname", "node2"))
    assert [s["metric"]["Hostname"] for s in one] == ["node2"] * GPUS, one


def test_a_real_prometheus_scrapes_the_exporter(cluster: Sandbox, job: str,
                                                tmp_path: Path) -> None:
    exporter_port, prometheus_port = _free_port(), _free_port()
    # The inventory promises node2 more GPUs than it has: one fell off the bus.
    hosts = [dict(h) for h in cluster.data["hosts"]]
    hosts[1]["gpus"] = GPUS + 1
    promised = cluster.write_inventory(tmp_path / "promised.yaml", hosts=hosts)
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "exporter", "-i", str(promised),
         "--listen", f"127.0.0.1:{exporter_port}"], stderr=subprocess.PIPE, text=True)
    config = _shipped_prometheus_config(tmp_path, exporter_port)
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        series: list[dict] = []
        while time.monotonic() < deadline and len(series) < 3 * GPUS:
            time.sleep(1)
            with contextlib.suppress(OSError, ValueError, KeyError):
                series = _query(prometheus_port, "DCGM_FI_DEV_GPU_UTIL")
        # One utilisation series per node and GPU, with DCGM exporter's labels.
        assert sorted((s["metric"]["Hostname"], int(s["metric"]["gpu"])) for s in series) == \
            [(node, gpu) for node in cluster.nodes for gpu in range(GPUS)]
        assert {s["metric"]["modelName"] for s in series} == {"NVIDIA H100 80GB HBM3"}
        # The job's GPUs (LOCAL_RANK k holds GPU k) carry it as hpc_job; the others do not.
        assert sorted((s["metric"]["Hostname"], int(s["metric"]["gpu"]))
                      for s in series if s["metric"].get("hpc_job") == job) == \
            [(node, gpu) for node in cluster.nodes for gpu in range(2)]
        assert all(s["metric"].get("hpc_job") in (job, None) for s in series)
        joined = _query(prometheus_port, f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}} * '
                        f'on(Hostname, gpu) group_left(rank) '
                        f'gpucluster_gpu_job_info{{job_id="{job}"}}')  # as monitoring.md
        assert sorted(int(s["metric"]["rank"]) for s in joined) == list(range(6))
        ranks = _query(prometheus_port, f'gpucluster_gpu_job_info{{job_id="{job}"}}')
        assert sorted(int(s["metric"]["rank"]) for s in ranks) == list(range(6))
        up = _query(prometheus_port, "gpucluster_node_up")
        assert sorted((s["metric"]["Hostname"], s["value"][1]) for s in up) == \
            [(node, "1") for node in cluster.nodes]
        # NVIDIA's dashboard picks a node by `instance` (monitoring.md's relabelling makes
        # each node one), and each of its panels answers for every node.
        assert _label_values(prometheus_port, "instance", "DCGM_FI_DEV_GPU_TEMP") == \
            cluster.nodes
        for node in cluster.nodes:
            for panel in DASHBOARD_PANELS:
                promql = panel.replace("$instance", node).replace("$Hostname", node) \
                    .replace("$gpu", ".*")
                answer = _query(prometheus_port, promql)
                assert len(answer) == (1 if panel.startswith(("avg", "sum")) else GPUS), \
                    (promql, answer)
        assert _label_values(prometheus_port, "Hostname", "DCGM_FI_DEV_FB_FREE") == \
            cluster.nodes  # the current revision's node picker
        _check_own_dashboard(prometheus_port, cluster, job)
        # An idle GPU's SM clock is the capture's idle one (345 MHz), in Hz on the panel.
        idle = _query(prometheus_port, 'DCGM_FI_DEV_SM_CLOCK{gpu=~"[2-7]"} * 1000000')
        assert sorted({s["value"][1] for s in idle}) == ["345000000"] and \
            len(idle) == 3 * (GPUS - 2)
        # node3's staged thermal slowdown, bit 0x40 of the clock event reasons
        hot = _query(prometheus_port, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        assert {s["metric"]["Hostname"] for s in hot if int(s["value"][1]) & 0x40} == \
            {"node3"} and len(hot) == 3 * GPUS
        alert = _query(prometheus_port,  # monitoring.md's alert on heat
                       "floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 64) % 2 == 1")
        assert sorted((s["metric"]["Hostname"], s["metric"]["gpu"]) for s in alert) == \
            [("node3", str(g)) for g in range(GPUS)]
        # The shipped alerts: node3's GPUs held down (pending: it waits 2 minutes to fire),
        # node2 short of a GPU, and none of those that would mean trouble elsewhere.
        held: set[tuple[str, str]] = set()
        short: set[str] = set()
        deadline = time.monotonic() + 30
        while not (held and short) and time.monotonic() < deadline:
            time.sleep(1)
            alerts = _alerts(prometheus_port)
            held = {(a["Hostname"], a["gpu"]) for a in alerts
                    if a["alertname"] == "GpuclusterClocksHeldDown"}
            short = {a["Hostname"] for a in alerts if a["alertname"] == "GpuclusterGpusMissing"}
        assert held == {("node3", str(g)) for g in range(GPUS)}, alerts
        assert short == {"node2"}, alerts
        assert not {a["alertname"] for a in alerts} & {
            "GpuclusterNodeDown", "GpuclusterXidError", "GpuclusterUncorrectableEccErrors",
            "GpuclusterSlurmQueueUnread"}, alerts
    finally:
        prometheus.terminate()
        exporter.send_signal(signal.SIGINT)
        prometheus.wait(timeout=30)
        assert exporter.wait(timeout=20) == 0


def _gpu_processes_check(cluster: Sandbox, node: str) -> str:
    return _gpu_processes_finding(cluster, node)["status"]


def _gpu_processes_finding(cluster: Sandbox, node: str, *args: str) -> dict:
    done = gpucluster("doctor", "-i", str(cluster.inventory), "-w", node, "--json",
                      "--only", "gpu-processes", *args)
    payload = json.loads(done.stdout)
    return next(r for r in payload["results"] if r["check"] == "gpu-processes")


def _kill_agents(node: str, job: str) -> None:
    """SIGKILL the job's torchrun (and its shell) on `node`: the workers stay, holding
    their GPUs, as after an agent crash."""
    pids = subprocess.run(["ip", "netns", "pids", f"{NAME}-{node}"], capture_output=True,
                          text=True, check=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"GPUCLUSTER_JOB={job}@{node}".encode() in environ and \
                    not any(e.startswith(b"LOCAL_RANK=") for e in environ):
                os.kill(int(pid), signal.SIGKILL)


def test_reap_ends_a_dead_jobs_leftovers_and_leaves_the_rest(cluster: Sandbox, job: str,
                                                             project: Path) -> None:
    # Two jobs of their own: one keeps running on node[1-2], one on node3 loses its
    # torchrun (so the leftovers' end cannot take the running job's ranks with it).
    assert gpucluster("stop", "-i", str(cluster.inventory), job).code == 0
    running_job = start_job(cluster, project, "node1", "node2")
    dead_job = start_job(cluster, project, "node3")
    # A foreign process on node1's GPU 5 (the sandbox's GPUs go by LOCAL_RANK).
    foreign = subprocess.Popen(["ip", "netns", "exec", f"{NAME}-node1", "env", "LOCAL_RANK=5",
                                "sleep", "600"])
    try:
        _kill_agents("node3", dead_job)
        time.sleep(1)
        # doctor tells a running job's ranks (stop the job, never kill a rank by pid),
        # a dead job's leftovers (reap) and a foreign process apart.
        dead = _gpu_processes_finding(cluster, "node3")
        assert dead["status"] == "FAIL"
        assert f"GPUs held by leftovers of job {dead_job}" in dead["message"], dead
        assert "gpucluster reap --yes" in dead["remedy"]
        chosen = _gpu_processes_finding(cluster, "node3", "--gpus", "0,1")
        assert "end them: gpucluster reap --gpus 0-1 --yes" in chosen["remedy"], chosen
        busy = _gpu_processes_finding(cluster, "node1")
        assert f"GPUs held by running job {running_job} (2 processes)" in busy["message"], busy
        assert f"gpucluster stop {running_job}" in busy["remedy"]
        assert f"GPUs held by: pid {foreign.pid} " in busy["message"]
        assert f"kill {foreign.pid};" in busy["remedy"]  # the foreign pid alone

        listed = gpucluster("reap", "-i", str(cluster.inventory), "--json")
        assert listed.code == 0, listed.stderr
        owners = {(n["host"], p["pid"]): (p["owner"], p["job"])
                  for n in json.loads(listed.stdout)["nodes"] for p in n["processes"]}
        leftovers = [pid for (host, pid), (owner, _) in owners.items() if owner == "leftover"]
        assert {host for (host, _), (owner, _) in owners.items() if owner == "leftover"} == \
            {"node3"} and len(leftovers) == 2
        assert {j for (owner, j) in owners.values() if owner == "leftover"} == {dead_job}
        assert [owner for (host, _), (owner, _) in owners.items() if host == "node1"].count(
            "foreign") == 1
        indexes = {p["pid"]: p["gpu_index"] for n in json.loads(listed.stdout)["nodes"]
                   for p in n["processes"]}
        assert indexes[foreign.pid] == 5  # nvidia-smi's index, not the uuid
        assert f"pid {foreign.pid} root GPU 5 " in gpucluster(
            "reap", "-i", str(cluster.inventory), "-w", "node1").stderr
        # jobs agrees: node3's torchrun ended, its workers are left (it said running)
        table = json.loads(gpucluster("jobs", "-i", str(cluster.inventory), "--json").stdout)
        node3_state = next(j for j in table["jobs"] if j["id"] == dead_job)["nodes"]["node3"]
        assert node3_state["state"] == "leftover", node3_state
        running = [pid for (_, pid), (owner, j) in owners.items() if owner == "running"
                   and j == running_job]
        assert len(running) == 4

        ended = gpucluster("reap", "-i", str(cluster.inventory), "--yes", "--grace", "3",
                           "--json")
        assert ended.code == 0, ended.stderr
        node3 = next(n for n in json.loads(ended.stdout)["nodes"] if n["host"] == "node3")
        assert node3["freed_mib"] > 0 and all(p["ended"] for p in node3["processes"])
        assert all(gone(pid) for pid in leftovers)
        assert not any(gone(pid) for pid in running)  # a running job's: never touched
        assert foreign.poll() is None  # foreign: only with --foreign
        assert _gpu_processes_check(cluster, "node3") == "OK"

        # --gpus: the processes on those GPUs alone, listed and ended; GPU 5's left.
        spared = gpucluster("reap", "-i", str(cluster.inventory), "-w", "node1", "--gpus",
                            "0-4", "--yes", "--foreign", "--grace", "3")
        assert spared.code == 0, spared.stderr
        assert "node1: 1 process on GPUs other than GPU 0-4: left alone" in spared.stderr
        assert foreign.poll() is None and not any(gone(pid) for pid in running)
        on_five = json.loads(gpucluster("reap", "-i", str(cluster.inventory), "-w", "node1",
                                        "--gpus", "5", "--json").stdout)
        assert on_five["gpus"] == "5" and on_five["nodes"][0]["on_other_gpus"] == 2
        assert [p["pid"] for p in on_five["nodes"][0]["processes"]] == [foreign.pid]
        foreign_reap = gpucluster("reap", "-i", str(cluster.inventory), "-w", "node1",
                                  "--gpus", "5", "--yes", "--foreign", "--grace", "3")
        assert foreign_reap.code == 0, foreign_reap.stderr
        assert foreign.wait(timeout=10) != 0  # ended by TERM
        assert not any(gone(pid) for pid in running)

        assert gpucluster("stop", "-i", str(cluster.inventory), running_job).code == 0
        quiet = gpucluster("reap", "-i", str(cluster.inventory))
        assert quiet.code == 0, quiet.stderr
        assert quiet.stderr.splitlines() == ["node[1-3]: no GPU processes"]  # one line
    finally:
        foreign.kill()
        gpucluster("stop", "-i", str(cluster.inventory), running_job)
