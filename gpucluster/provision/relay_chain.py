"""The image relay's chain, run from the controller: one session per hop, all logged in,
set up and linked to the next hop before any data flows.

A login can cost more than the network (conda or pyenv init in the node's login scripts
runs for every SSH command). A chain whose hops each started the next as the data
reached them paid one login per hop on the data path, in sequence; here every login
happens at once, before the stream: each hop's session, and each hop's link to the next
(an SSH session on the next hop that waits for `go`). The controller paces each hop's
script (templates/provision/image_relay.sh.j2) on its stdin: `go` once every hop is
ready and every link is up, then the image to the first hop. Each hop reports on its own
session: ready, linked, bytes received, the image ID it loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, cast

from gpucluster import reports
from gpucluster.inventory import Host
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import Progress
from gpucluster.remote.fanout import fan_out
from gpucluster.remote.result import CommandResult, HostFailure
from gpucluster.remote.waiting import BOOTSTRAP, DeferredStdin, framed

LINK_TIMEOUT_S = 60.0  # from the start to every hop linked: logins and SSH handshakes
STREAM_TIMEOUT_S = 24 * 3600.0


@dataclass(frozen=True)
class Hop:
    host: Host
    connection: LoggedConnection
    script: str  # image_relay.sh.j2 rendered for this hop
    env: Mapping[str, str] | None = None  # on the session's stdin, never a command line


class RelayChain:
    """`RelayChain(hops, on_progress).run(stream)` pushes `stream` through the hops, in
    order; `loaded` then holds the image ID each hop reported."""

    def __init__(self, hops: Sequence[Hop], on_progress: Progress | None) -> None:
        self._hops = list(hops)
        self._by_name = {h.host.name: h for h in self._hops}
        self._on_progress = on_progress
        self._stdins = {h.host.name: DeferredStdin(framed(h.script)) for h in self._hops}
        self._waiting = {("relay-ready", h.host.name) for h in self._hops} | \
            {("relay-linked", h.host.name) for h in self._hops[1:]}
        self._lock = threading.Lock()
        self._stream: BinaryIO | None = None
        self._going = False  # `go` sent: from then on a hop's end is its own failure
        self._said: dict[str, list[str]] = {h.host.name: [] for h in self._hops}  # last 3
        self.stopped: str | None = None  # why the chain stopped before any data flowed
        self.loaded: dict[str, str] = {}

    def run(self, stream: BinaryIO) -> dict[str, str]:
        """Push `stream`; returns what went wrong on each hop that failed."""
        self._stream = stream
        deadline = threading.Timer(LINK_TIMEOUT_S, self._link_timed_out)
        deadline.start()
        try:
            done = fan_out([h.host for h in self._hops], self._run_hop,
                           parallelism=len(self._hops),  # every hop at once: one chain
                           on_done=self._hop_ended, on_interrupt=self._stop_all)
        finally:
            deadline.cancel()
            self._stop_all()  # every stdin ends, whatever happened
        if self.stopped is not None:
            return {h.host.name: self.stopped for h in self._hops}
        problems = {name: failure.message for name, failure in done.failures.items()}
        for name, result in done.values.items():
            if not result.ok:
                problems[name] = self._last_words(name) or f"exit {result.exit_code}"
        return problems

    def _last_words(self, name: str) -> str:
        """What the hop said last, other than its reports: where it went wrong."""
        return " | ".join(self._said[name])[-300:]

    def _run_hop(self, host: Host) -> CommandResult:
        hop = self._by_name[host.name]

        def on_line(_stream: str, line: str) -> None:
            kind, rest = reports.parse(line) or ("", "")
            parts = rest.split()
            if kind == "" and line.strip():
                self._said[host.name] = [*self._said[host.name][-2:], line.strip()]
            elif kind in ("relay-ready", "relay-linked") and parts:
                self._seen(kind, parts[0])
            elif kind == "relay-link-ended" and parts:
                self._stop(f"{host.name} could not link to {parts[0]}: "
                           f"{self._last_words(host.name) or 'ssh ended'}")
            elif kind == "loaded" and len(parts) >= 2:
                self.loaded[parts[0]] = parts[1].removeprefix("sha256:")
            elif kind == "progress" and len(parts) >= 2 and parts[1].isdigit() and \
                    self._on_progress is not None:
                self._on_progress(parts[0], int(parts[1]), parts[-1] == "done")

        return hop.connection.run(BOOTSTRAP, timeout=STREAM_TIMEOUT_S, on_line=on_line,
                                  env=hop.env, stdin=cast("BinaryIO", self._stdins[host.name]))

    def _seen(self, kind: str, node: str) -> None:
        with self._lock:
            self._waiting.discard((kind, node))
            if not self._going and self.stopped is None and not self._waiting:
                self._going = True
                first, *rest = self._hops
                self._stdins[first.host.name].give(b"go\n", self._stream)
                for hop in rest:
                    self._stdins[hop.host.name].give(b"go\n")

    def _hop_ended(self, name: str, outcome: CommandResult | HostFailure) -> None:
        """A hop that ends before the stream starts stops the whole chain."""
        why = outcome.message if isinstance(outcome, HostFailure) else \
            self._last_words(name) or f"exit {outcome.exit_code}"
        self._stop(f"{name}: {why}")

    def _link_timed_out(self) -> None:
        with self._lock:
            missing = sorted({node for _, node in self._waiting})
        self._stop(f"{', '.join(missing)} not ready and linked within {LINK_TIMEOUT_S:g}s")

    def _stop(self, why: str) -> None:
        with self._lock:
            if self._going or self.stopped is not None:
                return
            self.stopped = f"the relay could not link its hops, so nothing was sent " \
                           f"(is the ssh-mesh step done?): {why}"
        self._stop_all()

    def _stop_all(self) -> None:
        for stdin in self._stdins.values():
            stdin.cancel()
