"""The second round trip: how every node resolves every other node's hostname, and
whether the rendezvous port on the head node is reachable from every other node.

Doctor opens a short-lived listener on the head (it exits by itself after a few
seconds, and is killed as soon as the probes are done), then each other node connects
to the head's cluster address. No listener is left behind.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpucluster.doctor.probe import NodeFacts
from gpucluster.inventory import Host, Inventory
from gpucluster.remote.connection import Connection
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session

PROBE_TIMEOUT_S = 3.0
LISTENER_LIFETIME_S = 20.0  # a safety net: the controller kills it well before

LISTENER = """\
import os, socket, sys, time
port, lifetime = int(sys.argv[1]), float(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("0.0.0.0", port))
    server.listen(128)
except OSError as error:
    print("busy", error.errno, flush=True)
    sys.exit(0)
print("ready", os.getpid(), flush=True)
server.settimeout(0.2)
deadline = time.time() + lifetime
while time.time() < deadline:
    try:
        peer, address = server.accept()
        print("from", address[0], flush=True)
        peer.close()
    except socket.timeout:
        pass
"""

CONNECT = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("port open")
except socket.timeout:
    print("port timeout")
except ConnectionRefusedError:
    print("port refused")
except OSError as error:
    print("port error", error.strerror or error)
"""


@dataclass(frozen=True)
class Reachability:
    """What one node saw of the others."""

    resolved: Mapping[str, str | None] = field(default_factory=dict)  # hostname -> address
    port: str | None = None  # open | timeout | refused | error ...; None: not probed


@dataclass
class _Listener:
    ready: threading.Event = field(default_factory=threading.Event)
    state: str = "not started"  # ready | busy | failed: ...
    pid: str | None = None


def _python(facts: NodeFacts) -> str:
    found = facts.ok_text("python")
    return shlex.quote(found.splitlines()[0]) if found else "python3"


def probe_network(session: Session, inventory: Inventory, facts: Mapping[str, NodeFacts]
                  ) -> tuple[dict[str, Reachability], str | None]:
    """Per node: names resolved and rendezvous port state; plus a note when the port
    could not be probed at all."""
    hosts = [h for h in inventory.hosts if h.name in facts]
    hostnames = sorted({f.hostname for f in facts.values() if f.hostname})
    head = inventory.head
    port = inventory.cluster.rendezvous_port
    listener = _Listener()
    thread = None
    note = None
    if head.name not in facts:
        note = f"head node {head.name} did not answer; rendezvous port not probed"
    elif len(hosts) < 2:
        note = "a single node: nothing connects to the rendezvous port"
    else:
        thread = threading.Thread(target=_listen, daemon=True, args=(
            session.connection(head), facts[head.name], port, listener))
        thread.start()
        if not listener.ready.wait(15):
            note = f"the listener on {head.name} did not start in time"
        elif listener.state.startswith("failed"):
            note = f"could not open a listener on {head.name}: {listener.state}"
    probe_port = thread is not None and listener.state in ("ready", "busy")

    def task(connection: Connection) -> Reachability:
        host = next(h for h in hosts if h.name == connection.host)
        command = _resolve_command(hostnames)
        if probe_port and host.name != head.name:
            command += "; " + _connect_command(facts[host.name], head, port)
        output = connection.run(command, timeout=PROBE_TIMEOUT_S + 15).stdout
        return _parse(output)

    try:
        result = session.map(hosts, task)
    finally:
        if listener.pid is not None:
            with contextlib.suppress(RemoteError):  # else its own lifetime ends it
                session.connection(head).run(f"kill {listener.pid} 2>/dev/null", timeout=10)
        if thread is not None:
            thread.join(5)
    if listener.state == "busy":
        note = f"busy: port {port} is already in use on {head.name}"
    return dict(result.values), note


def _listen(connection: Connection, facts: NodeFacts, port: int, listener: _Listener) -> None:
    def on_line(_stream: str, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word in ("ready", "busy") and not listener.ready.is_set():
            listener.state = word
            listener.pid = rest.strip() if word == "ready" else None
            listener.ready.set()

    command = (f"{_python(facts)} -c {shlex.quote(LISTENER)} {port} "
               f"{LISTENER_LIFETIME_S:g}")
    try:
        result = connection.run(command, timeout=LISTENER_LIFETIME_S + 10, on_line=on_line)
        if not listener.ready.is_set():
            listener.state = f"failed: {(result.stderr or result.stdout).strip()[-200:]}"
    except RemoteError as error:
        listener.state = f"failed: {error.message}"
    finally:
        listener.ready.set()


def _resolve_command(hostnames: list[str]) -> str:
    names = " ".join(shlex.quote(n) for n in hostnames)
    return (f"for n in {names}; do printf 'resolve %s %s\\n' \"$n\" "
            f"\"$(getent hosts \"$n\" | awk '{{print $1; exit}}')\"; done")


def _connect_command(facts: NodeFacts, head: Host, port: int) -> str:
    return (f"{_python(facts)} -c {shlex.quote(CONNECT)} {shlex.quote(head.address)} {port} "
            f"{PROBE_TIMEOUT_S:g}")


def _parse(output: str) -> Reachability:
    resolved: dict[str, str | None] = {}
    port = None
    for line in output.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "resolve" and len(parts) >= 2:
            resolved[parts[1]] = parts[2].strip() if len(parts) == 3 and parts[2].strip() else None
        elif parts[0] == "port" and len(parts) >= 2:
            port = " ".join(parts[1:])
    return Reachability(resolved, port)
