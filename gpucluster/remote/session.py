"""The connections of one CLI invocation: one per host, opened on first use, reused.

Also the common case of the fan-out: the same shell command on many hosts.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from gpucluster.inventory import Host, Inventory
from gpucluster.remote.connection import Connection, LineCallback, Stdin
from gpucluster.remote.fanout import fan_out
from gpucluster.remote.local import LocalConnection
from gpucluster.remote.result import CommandResult, FanoutResult, HostFailure
from gpucluster.remote.ssh import Endpoint, SshConnection, SshOptions
from gpucluster.ssh_config import SshConfig

T = TypeVar("T")


class Session:
    """Hands out one connection per host and closes them all at the end."""

    def __init__(self, inventory: Inventory, options: SshOptions) -> None:
        self.inventory = inventory
        self.options = options
        self._connections: dict[str, Connection] = {}
        self._jumps: dict[str, SshConnection] = {}
        self._lock = threading.Lock()
        self._ssh_config: SshConfig | None = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def connection(self, host: Host) -> Connection:
        with self._lock:
            existing = self._connections.get(host.name)
            if existing is None:
                existing = self._new_connection(host)
                self._connections[host.name] = existing
            return existing

    def _new_connection(self, host: Host) -> Connection:
        if host.is_local:
            return LocalConnection(host.name, self.options.sudo_password)
        endpoint = Endpoint(host.name, host.address, host.port, host.user, host.identity_file,
                            host.identity_files, host.proxy_command, host.connect_timeout)
        via = self._jump(host.jump_host) if host.jump_host else None
        return SshConnection(endpoint, self.options, via=via)

    def _jump(self, spec: str) -> SshConnection:
        """A shared connection to a jump host; `a,b` means through a, then b."""
        existing = self._jumps.get(spec)
        if existing is not None:
            return existing
        *before, last = [part.strip() for part in spec.split(",")]
        via = self._jump(",".join(before)) if before else None
        connection = SshConnection(self._jump_endpoint(last), self.options, via=via)
        self._jumps[spec] = connection
        return connection

    def _jump_endpoint(self, spec: str) -> Endpoint:
        """An inventory host by name, or `[user@]host[:port]` completed by ~/.ssh/config."""
        user, _, rest = spec.rpartition("@")
        alias, _, port = rest.partition(":")
        known = {h.name: h for h in (*self.inventory.hosts, *self.inventory.left_out)}.get(alias)
        if known is not None:
            return Endpoint(f"jump host {alias}", known.address,
                            int(port) if port.isdigit() else known.port, user or known.user,
                            known.identity_file)
        if self._ssh_config is None:
            self._ssh_config = SshConfig(self.inventory.cluster.ssh_config)
        found = self._ssh_config.lookup(alias)
        return Endpoint(
            label=f"jump host {alias}",
            address=found.hostname or alias,
            port=int(port) if port.isdigit() else (found.port or 22),
            user=user or found.user or getpass.getuser(),
            identity_file=found.identity_file,
        )

    def close(self) -> None:
        """End whatever still runs on the nodes (Ctrl-C), then close every connection."""
        with self._lock:
            running = list(self._connections.values())
        enders = [threading.Thread(target=c.end_running, daemon=True) for c in running]
        for thread in enders:
            thread.start()
        for thread in enders:
            thread.join(10)
        with self._lock:
            for connection in [*self._connections.values(), *self._jumps.values()]:
                if isinstance(connection, SshConnection):
                    connection.retire()
                else:
                    connection.close()
            self._connections.clear()
            self._jumps.clear()

    # -- fan-out helpers

    def map(self, hosts: Sequence[Host], task: Callable[[Connection], T],
            on_done: Callable[[str, T | HostFailure], None] | None = None) -> FanoutResult[T]:
        """`task(connection)` on every host in parallel; Ctrl-C closes every connection."""
        return fan_out(hosts, lambda host: task(self.connection(host)),
                       parallelism=self.inventory.cluster.fanout,
                       on_done=on_done, on_interrupt=self.close)

    def run(
        self,
        hosts: Sequence[Host],
        command: str,
        timeout: float | None = None,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        on_line: Callable[[str, str, str], None] | None = None,
        on_done: Callable[[str, CommandResult | HostFailure], None] | None = None,
    ) -> FanoutResult[CommandResult]:
        """The same command on every host. `on_line(host, stream, line)` streams output."""
        limit = timeout if timeout is not None else self.inventory.cluster.command_timeout

        def task(connection: Connection) -> CommandResult:
            per_host: LineCallback | None = None
            if on_line is not None:
                def per_host(stream: str, line: str) -> None:
                    on_line(connection.host, stream, line)
            data: Stdin = stdin
            return connection.run(command, limit, sudo=sudo, env=env, stdin=data,
                                  on_line=per_host)

        return self.map(hosts, task, on_done=on_done)
