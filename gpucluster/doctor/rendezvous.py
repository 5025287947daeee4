"""Network facts that need more than one node: name resolution between nodes, whether
the rendezvous port on the head node is reachable from every other node, and the port
mesh's arguments (every node's probe listens on one port of the ephemeral range and
connects to every other node's: templates/doctor/port_mesh.py).

Doctor opens a short-lived listener on the head before the probe round; each other
node's probe then connects to the head's cluster address (retrying briefly while the
listener comes up). The listener exits once every node has connected, or after a few
seconds, and is killed if still there when the probes are done: none is left behind.
Names are resolved in the same probe; only hostnames that differ from the inventory's
names need a second, small round trip.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gpucluster import reports
from gpucluster.inventory import Host, Inventory
from gpucluster.remote.connection import Connection
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session
from gpucluster.templating import render, script_text

PROBE_TIMEOUT_S = 3.0
LISTENER_LIFETIME_S = 20.0  # a safety net: it normally exits, or is killed, well before
# The port mesh: how long a node keeps connecting to a peer that refuses (its listener may
# not be up yet: the probes start within a second or two of each other), and the range
# its test port is drawn from, inside every distribution's default ephemeral range.
MESH_TIMEOUT_S = 5.0
MESH_PORTS = (33000, 60000)




@dataclass(frozen=True)
class Reachability:
    """What one node saw of the others."""

    resolved: Mapping[str, str | None] = field(default_factory=dict)  # hostname -> address
    port: str | None = None  # open | timeout | refused | error ...; None: not probed


@dataclass
class Listener:
    """The head's test listener: its state once it reported, and its pid."""

    ready: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    state: str = "not started"  # ready | busy | failed: ...
    pid: str | None = None

    @property
    def note(self) -> str | None:
        """Why the port could not be tested, or that it is busy; None when it could."""
        if self.state == "ready":
            return None
        return self.state


def mesh_argument(inventory: Inventory, host: str, port: int) -> str | None:
    """GPC_MESH for `host`'s probe: the test port, the time limit and every other node's
    address; None where there is no pair of machines to test (one node, or every host
    this machine)."""
    if not inventory.has_machine_pairs:
        return None
    peers = [h.address for h in inventory.hosts if h.name != host]
    return " ".join([str(port), f"{MESH_TIMEOUT_S:g}", *peers])


def connect_script(head: Host, port: int) -> str:
    """Shell arguments for the probe: python -c CONNECT HOST PORT TIMEOUT."""
    return (f"-c {shlex.quote(script_text('doctor/port_connect.py'))} "
            f"{shlex.quote(head.address)} {port} {PROBE_TIMEOUT_S:g}")


@contextlib.contextmanager
def head_listener(session: Session, inventory: Inventory, gpus: str = ""
                  ) -> Iterator[Listener]:
    """Open the test listener on the head while the body runs; always clean it up.
    `gpus`: a job's GPU indices (launch --gpus); a job of ours on none of them does not
    make the port busy (it has a port of its own)."""
    head = inventory.head
    listener = Listener()
    if len(inventory.hosts) < 2:
        listener.state = "a single node: nothing connects to the rendezvous port"
        listener.ready.set()
        yield listener
        return
    connection = session.connection(head)
    thread = threading.Thread(target=_listen, daemon=True, args=(
        connection, inventory.cluster.python, inventory.cluster.rendezvous_port,
        len(inventory.hosts) - 1, head.name, listener, gpus))
    thread.start()
    try:
        yield listener
    finally:
        listener.finished.wait(0.3)  # usually gone already: every node connected
        if listener.pid is not None and not listener.finished.is_set():
            with contextlib.suppress(RemoteError):  # else its own lifetime ends it
                connection.run(f"kill {listener.pid} 2>/dev/null", timeout=10)
        thread.join(5)


def _listen(connection: Connection, python: str, port: int, expected: int, head: str,
            listener: Listener, gpus: str) -> None:
    def on_line(_stream: str, line: str) -> None:
        word, rest = reports.parse(line) or ("", "")
        if word in ("ready", "busy") and not listener.ready.is_set():
            job = rest.removeprefix("job ").strip() if rest.startswith("job ") else None
            listener.state = "ready" if word == "ready" else (
                f"busy: port {port} is held by gpucluster job {job}" if job
                else f"busy: port {port} is in use")
            listener.pid = rest.strip() if word == "ready" else None
            listener.ready.set()

    # The job's python if the node has it, else any python3. Chosen first, then exec'd:
    # with `a || b`, killing the listener would start the fallback, which then held
    # the port for its whole lifetime after doctor had gone.
    command = render("doctor/port_listener.sh.j2", python=python,
                     script=script_text("doctor/port_listener.py"), port=port,
                     lifetime=f"{LISTENER_LIFETIME_S:g}", expected=expected, node=head,
                     gpus=gpus)
    try:
        result = connection.run(command, timeout=LISTENER_LIFETIME_S + 10, on_line=on_line)
        if not listener.ready.is_set():
            listener.state = f"failed: {(result.stderr or result.stdout).strip()[-200:]}"
    except RemoteError as error:
        listener.state = f"failed: {error.message}"
    finally:
        listener.ready.set()
        listener.finished.set()


def resolve_round(session: Session, hosts: list[Host], names: list[str]
                  ) -> dict[str, dict[str, str | None]]:
    """Per host: how it resolves `names` (for hostnames the probe did not know)."""
    command = resolve_command(names)
    result = session.map(hosts, lambda c: parse_resolved(c.run(command, timeout=30).stdout,
                                                         names))
    return dict(result.values)


def resolve_command(names: list[str]) -> str:
    """One getent for every name: it prints `address name aliases...` per name found."""
    return f"getent hosts {' '.join(shlex.quote(n) for n in names)}"


def parse_resolved(output: str, names: list[str]) -> dict[str, str | None]:
    resolved: dict[str, str | None] = dict.fromkeys(names)
    for line in output.splitlines():
        address, *aliases = line.split()
        for name in aliases:
            if name in resolved and resolved[name] is None:
                resolved[name] = address
    return resolved
