"""One SSH connection and one long-running sampler per node, streaming a frame every
interval; a node that falls silent is marked stale, and reconnected to when it answers
again."""

from __future__ import annotations

import os
import shlex
import threading
import time
from typing import BinaryIO

from gpucluster.inventory import Host, Inventory
from gpucluster.observe.model import NodeSample, node_gpus_command, parse_frame
from gpucluster.remote.connection import password_line
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session

TYPED_SUDO = "typed-sudo"  # the sampler's flag: the password is stdin's first line
STREAM_LIMIT_S = 30 * 24 * 3600.0  # `top` and the exporter may run for weeks
RETRY_S = 1.0  # between a failed connection and the next try


def stale_after(interval_s: float) -> float:
    """No frame for this long and a node is stale: two missed frames, at least 2 s, so
    that a silent node shows as such within 3 s at the default interval."""
    return max(2.0, 2 * interval_s)


def sampler_command(inventory: Inventory, host: Host, interval_s: float,
                    typed_sudo: bool = False) -> str:
    """`typed_sudo`: the --ask-sudo-pass password comes as stdin's first line, for the
    kernel log's Xids where the user reads it through sudo."""
    # The interface that carries the cluster's traffic is the one towards a peer (alone,
    # the one holding the node's own address).
    peers = [h for h in inventory.hosts if h.name != host.name]
    peer = peers[0].address if peers else host.address
    return "exec " + node_gpus_command(inventory.cluster.python, "stream",
                                       str(max(100, round(interval_s * 1000))),
                                       shlex.quote(peer), *([TYPED_SUDO] if typed_sudo else []))


class HeldStdin:
    """The sampler's stdin: the --ask-sudo-pass password's line, if any, then nothing
    until `end()`. The sampler quits when its stdin ends, on this machine (a local
    host) as over SSH, so this, not the connection, is what ends it."""

    def __init__(self, password: str | None) -> None:
        reading, self._writing = os.pipe()
        if password is not None:
            os.write(self._writing, password_line(password))  # a line fits: never blocks
        # unbuffered: the feeder's read1 returns the line at once, then waits. The feeder
        # owns this end from here; it closes when the feeder drops it.
        self.reading: BinaryIO = os.fdopen(reading, "rb", buffering=0)
        self._lock = threading.Lock()
        self._open = True

    def end(self) -> None:
        """The feeder reads the end and closes the command's stdin; once only."""
        with self._lock:
            if self._open:
                self._open = False
                os.close(self._writing)


class NodeStream:
    """A node's sampler, restarted whenever its connection ends."""

    def __init__(self, session: Session, inventory: Inventory, host: Host,
                 interval_s: float) -> None:
        self.session, self.host, self.interval_s = session, host, interval_s
        self.password = session.options.sudo_password
        self.command = sampler_command(inventory, host, interval_s, self.password is not None)
        self.latest: NodeSample | None = None
        self.received_at: float | None = None  # monotonic, when the latest frame came
        self.error = ""  # why it has no fresh frame, when known
        self.ecc_base: dict[str, int] = {}  # each GPU's error count when first seen
        self.dropped: float | None = None  # the last frame before the watchdog closed
        self._stderr = ""
        self._stdin: HeldStdin | None = None  # the running sampler's
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"top-{self.host.name}")
        self._thread.start()

    def stop(self, deadline: float) -> None:
        """End the sampler's stdin, which ends it (no remote kill to wait for, as the
        session's own close would send), and close the connection."""
        self._stopped.set()
        self.drop()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def drop(self) -> None:
        """End this sampler: its stdin, and its connection, which may be dead (then no
        end of stdin reaches the node); the stream starts a new one unless stopped."""
        with self._lock:
            stdin = self._stdin
        if stdin is not None:
            stdin.end()
        self.session.connection(self.host).close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._stderr = ""
            stdin = HeldStdin(self.password)
            with self._lock:
                self._stdin = stdin
            try:
                done = self.session.connection(self.host).run(
                    self.command, timeout=STREAM_LIMIT_S, stdin=stdin.reading,
                    on_line=self._line)
                self.error = self._stderr or f"the sampler ended (exit {done.exit_code})"
            except RemoteError as error:
                self.error = error.message
            finally:
                stdin.end()
            self._stopped.wait(RETRY_S)

    def _line(self, stream: str, line: str) -> None:
        if stream != "stdout":
            self._stderr = line.strip() or self._stderr  # the last words of a failure
            return
        sample = parse_frame(line)
        if sample is None:
            return
        with self._lock:
            for gpu in sample.gpus:
                if gpu.ecc is not None:
                    self.ecc_base.setdefault(gpu.uuid, gpu.ecc)
            self.latest, self.received_at = sample, time.monotonic()
            self.error = sample.error

    def view(self) -> tuple[NodeSample | None, float | None, str, dict[str, int]]:
        """The latest frame, its age in seconds, the error, the ECC baselines."""
        with self._lock:
            age = time.monotonic() - self.received_at if self.received_at else None
            return self.latest, age, self.error, dict(self.ecc_base)

    def silent_for(self) -> float:
        with self._lock:
            return time.monotonic() - self.received_at if self.received_at else 0.0


class ClusterStreams:
    """Every node's stream, and a watchdog that drops the connection of a node silent for
    longer than a few frames, so that its stream reconnects once it answers again."""

    def __init__(self, session: Session, inventory: Inventory, hosts: list[Host],
                 interval_s: float) -> None:
        self.inventory, self.interval_s = inventory, interval_s
        self.session = session
        self.nodes = {h.name: NodeStream(session, inventory, h, interval_s) for h in hosts}
        self._stopped = threading.Event()

    def __enter__(self) -> ClusterStreams:
        for stream in self.nodes.values():
            stream.start()
        threading.Thread(target=self._watch, daemon=True, name="top-watchdog").start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        deadline = time.monotonic() + 2.0
        for stream in self.nodes.values():
            stream.stop(deadline)

    def wait_first(self, limit_s: float) -> None:
        """Until every node has sent a frame or failed (or `limit_s`)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not self._stopped.is_set():
            views = [s.view() for s in self.nodes.values()]
            if all(sample is not None or error for sample, _, error, _ in views):
                return
            time.sleep(0.05)

    def _watch(self) -> None:
        limit = max(5.0, 3 * self.interval_s)  # the connection is taken for dead
        while not self._stopped.wait(0.5):
            for stream in self.nodes.values():
                if stream.silent_for() > limit and stream.dropped != stream.received_at:
                    stream.dropped = stream.received_at  # one close per silence
                    stream.error = f"no frame for {limit:g}s: reconnecting"
                    stream.drop()
