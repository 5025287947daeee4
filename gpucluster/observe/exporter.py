"""`gpucluster exporter`: the samplers' latest frames as Prometheus metrics, under DCGM
exporter's names and labels (so that NVIDIA's Grafana dashboard reads them, but for its
profiling panels) plus gpucluster_* metrics for jobs and ranks, NIC rates and staleness."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from gpucluster.errors import GpuclusterError
from gpucluster.observe.model import Gpu, NodeSample
from gpucluster.observe.slurm_queue import QueuePoller, QueueReading
from gpucluster.observe.snapshot import NodeView, take
from gpucluster.observe.streams import ClusterStreams
from gpucluster.wording import endpoint

GPU_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"]
# name, help (DCGM exporter's default-counters.csv), the frame's value
DCGM_GAUGES: tuple[tuple[str, str, Callable[[NodeView, NodeSample, Gpu], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda n, s, g: g.util),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda n, s, g: g.mem_used),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     lambda n, s, g: g.mem_total - g.mem_used
     if g.mem_total is not None and g.mem_used is not None else None),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda n, s, g: g.temp),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda n, s, g: g.power),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.",
     lambda n, s, g: g.ecc),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
     lambda n, s, g: (s.xid_on(g) or [0])[-1] if s.xid is not None else None),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda n, s, g: g.sm_clock),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).",
     lambda n, s, g: g.mem_clock),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda n, s, g: g.mem_temp),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda n, s, g: g.mem_util),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda n, s, g: g.enc_util),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda n, s, g: g.dec_util),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event reasons (bitmask of "
     "DCGM_CLOCKS_EVENT_REASON_*).", lambda n, s, g: g.clock_events),
)


class ClusterCollector(Collector):
    """Reads the streams' latest frames at each scrape: nothing is sampled for it. The
    gpucluster job is the label `job_id`: Prometheus keeps `job` for its scrape job."""

    def __init__(self, streams: ClusterStreams, slurm: QueuePoller | None = None) -> None:
        self.streams, self.slurm = streams, slurm
        # The inventory's `gpus` per node, where it gives one: a node whose driver failed
        # sends frames with no GPU, and only a count to compare with can say so.
        self.expected_gpus = {h.name: h.gpus for h in streams.inventory.hosts
                              if h.name in streams.nodes and h.gpus is not None}

    def collect(self) -> Iterator[Metric]:
        snapshot = take(self.streams, self.slurm)
        fresh = [n for n in snapshot.nodes if n.sample is not None and not n.stale]
        series = [(node, node.sample, gpu, _gpu_labels(node, gpu), _hpc_jobs(node.sample, gpu))
                  for node in fresh if node.sample is not None for gpu in node.sample.gpus]
        for name, help_text, value_of in DCGM_GAUGES:
            family = Metric(name, help_text, "gauge")
            for node, sample, gpu, labels, jobs in series:
                value = value_of(node, sample, gpu)
                if value is None:
                    continue
                for job in jobs:  # one series per job holding the GPU, as DCGM exporter's
                    family.add_sample(name, {**labels, **job}, float(value))
            yield family
        yield from _node_families(snapshot.nodes)
        yield from _gpu_count_families(snapshot.nodes, self.expected_gpus)
        yield from _job_families(fresh)
        if snapshot.slurm is not None:
            yield from _slurm_families(snapshot.slurm)


def _gpu_labels(node: NodeView, gpu: Gpu) -> dict[str, str]:
    return dict(zip(GPU_LABELS, (str(gpu.index), gpu.uuid, f"nvidia{gpu.index}", gpu.name,
                                 node.host, gpu.bus_id), strict=True))


def _hpc_jobs(sample: NodeSample, gpu: Gpu) -> list[dict[str, str]]:
    """The `hpc_job` label DCGM exporter's HPC job mapping adds: one per job holding the
    GPU (the gpucluster job, else the Slurm job's ID), none on a GPU no job holds."""
    held = dict.fromkeys(p.job or p.slurm_job for p in sample.processes_on(gpu))
    return [{"hpc_job": job} for job in held if job] or [{}]


def _node_families(nodes: tuple[NodeView, ...]) -> Iterator[Metric]:
    up = GaugeMetricFamily("gpucluster_node_up", "1 when the node's sampler sends fresh "
                           "frames, 0 when it is stale or unreachable.", labels=["Hostname"])
    age = GaugeMetricFamily("gpucluster_node_sample_age_seconds",
                            "Seconds since the node's latest frame.", labels=["Hostname"])
    load = GaugeMetricFamily("gpucluster_node_load1", "The node's 1-minute load average.",
                             labels=["Hostname"])
    receive = GaugeMetricFamily("gpucluster_node_network_receive_bytes_per_second",
                                "Receive rate of the cluster interface or an InfiniBand "
                                "port.", labels=["Hostname", "interface"])
    transmit = GaugeMetricFamily("gpucluster_node_network_transmit_bytes_per_second",
                                 "Transmit rate of the cluster interface or an InfiniBand "
                                 "port.", labels=["Hostname", "interface"])
    for node in nodes:
        up.add_metric([node.host], 0.0 if node.stale else 1.0)
        if node.age_s is not None:
            age.add_metric([node.host], node.age_s)
        if node.sample is None or node.stale:
            continue
        if node.sample.load1 is not None:
            load.add_metric([node.host], node.sample.load1)
        for interface, (rx, tx) in node.sample.rates.items():
            receive.add_metric([node.host, interface], float(rx))
            transmit.add_metric([node.host, interface], float(tx))
    yield from (up, age, load, receive, transmit)


def _gpu_count_families(nodes: tuple[NodeView, ...], expected: dict[str, int]
                        ) -> Iterator[Metric]:
    answering = GaugeMetricFamily(
        "gpucluster_node_gpus", "GPUs the node's nvidia-smi answers for (0 when it cannot "
        "reach the driver); absent while the node is stale.", labels=["Hostname"])
    promised = GaugeMetricFamily(
        "gpucluster_node_gpus_expected", "GPUs the inventory's `gpus` gives the node (absent "
        "where it gives none).", labels=["Hostname"])
    for node in nodes:
        if node.sample is not None and not node.stale:
            answering.add_metric([node.host], float(len(node.sample.gpus)))
        if node.host in expected:
            promised.add_metric([node.host], float(expected[node.host]))
    yield from (answering, promised)


def _job_families(nodes: list[NodeView]) -> Iterator[Metric]:
    job = GaugeMetricFamily(
        "gpucluster_gpu_job_info", "1 for each gpucluster job and rank on a GPU (join on "
        "Hostname and gpu with the DCGM metrics).", labels=["Hostname", "gpu", "UUID",
                                                            "job_id", "rank", "local_rank"])
    slurm = GaugeMetricFamily(
        "gpucluster_gpu_slurm_job_info", "1 for each Slurm job holding a GPU (its processes' "
        "SLURM_JOB_ID).", labels=["Hostname", "gpu", "UUID", "slurm_job_id"])
    memory = GaugeMetricFamily(
        "gpucluster_gpu_process_memory_used_mib", "GPU memory held by each process, with "
        "its gpucluster job and rank (empty for a foreign process).",
        labels=["Hostname", "gpu", "UUID", "pid", "user", "job_id", "rank"])
    quiet = GaugeMetricFamily(
        "gpucluster_job_quiet_seconds", "Seconds since a running gpucluster job's newest "
        "output or heartbeat on the node (a hang is quiet while NCCL keeps its GPUs busy).",
        labels=["Hostname", "job_id"])
    for node in nodes:
        assert node.sample is not None
        for job_id, seconds in sorted(node.sample.quiet.items()):
            quiet.add_metric([node.host, job_id], seconds)
        for gpu in node.sample.gpus:
            held = node.sample.processes_on(gpu)
            for slurm_job in dict.fromkeys(p.slurm_job for p in held if p.slurm_job):
                slurm.add_metric([node.host, str(gpu.index), gpu.uuid, slurm_job], 1.0)
            for process in held:
                rank = "" if process.rank is None else str(process.rank)
                if process.job:
                    local = "" if process.local_rank is None else str(process.local_rank)
                    job.add_metric([node.host, str(gpu.index), gpu.uuid, process.job, rank,
                                    local], 1.0)
                if process.used_mib is not None:
                    memory.add_metric([node.host, str(gpu.index), gpu.uuid, str(process.pid),
                                       process.user, process.job or "", rank],
                                      float(process.used_mib))
    yield from (job, slurm, memory, quiet)


def _slurm_families(reading: QueueReading) -> Iterator[Metric]:
    """Slurm's queue, where Slurm is set up from here: whether squeue answers, the jobs
    by state (PENDING and RUNNING always there, 0 when none), and each job's size."""
    up = GaugeMetricFamily("gpucluster_slurm_up", "1 when squeue on the Slurm controller "
                           "host answered within the last polls, else 0.")
    up.add_metric([], 0.0 if reading.error else 1.0)
    yield up
    if reading.error:
        return  # no queue figures rather than stale ones
    jobs = GaugeMetricFamily("gpucluster_slurm_jobs", "Jobs in Slurm's queue, by state.",
                             labels=["state"])
    for state, count in reading.by_state().items():
        jobs.add_metric([state], float(count))
    nodes = GaugeMetricFamily(
        "gpucluster_slurm_job_nodes", "Nodes each job in Slurm's queue has (running) or "
        "asks for (pending); its id is the slurm_job_id of gpucluster_gpu_slurm_job_info.",
        labels=["slurm_job_id", "name", "user", "state"])
    for job in reading.jobs:
        nodes.add_metric([job.id, job.name, job.user, job.state], float(job.nodes))
    yield from (jobs, nodes)


@contextmanager
def listening(address: str, port: int) -> Iterator[CollectorRegistry]:
    """/metrics served on ADDRESS:PORT from an empty registry, for the caller to fill
    once the nodes are connected: bound first, so that a port in use is said at once
    rather than after every node's connection."""
    registry = CollectorRegistry(auto_describe=False)
    try:
        server = _server(address, port, _routes(make_wsgi_app(registry)))
    except OSError as error:
        raise GpuclusterError(f"--listen {endpoint(address, port)}: cannot serve there: "
                              f"{_why_not(error, port)}") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
LANDING = (b"<html><head><title>gpucluster exporter</title></head><body>"
           b"<h1>gpucluster exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>")


def _routes(metrics: WsgiApp) -> WsgiApp:
    """/metrics, a landing page at / (as node_exporter has), 404 elsewhere:
    prometheus-client's own app answers every path with the metrics, so a mistyped
    `metrics_path` would scrape without a word instead of failing."""
    def route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"404 not found: the metrics are at /metrics\n"]
    return route


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape on the exporter's terminal."""


def _server(address: str, port: int, app: WsgiApp) -> WSGIServer:
    """A threaded WSGI server on ADDRESS:PORT, of the address family the address is
    (an IPv6 one too): prometheus-client's own server class, as its start_http_server
    makes it, which takes no app of ours."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return make_server(str(sockaddr[0]), port, app, Server, handler_class=_Quiet)




def _why_not(error: OSError, port: int) -> str:
    if isinstance(error, socket.gaierror):
        return ("not an address of this machine, nor a name it resolves (fix: one of its "
                "addresses, 127.0.0.1 for this machine only, or 0.0.0.0 for every network)")
    if error.errno == errno.EADDRINUSE:
        return (f"another program listens on port {port} (fix: another port, e.g. "
                f"--listen 127.0.0.1:{port + 1}; `ss -ltnp` names the program)")
    if error.errno == errno.EADDRNOTAVAIL:
        return ("not an address of this machine (fix: one of its addresses, `ip -br addr` "
                "lists them, or 127.0.0.1)")
    if error.errno == errno.EACCES:
        return f"port {port} needs root (fix: a port from 1024 up, e.g. 9400)"
    return error.strerror or str(error)
