"""Step `image`: one container image (`cluster.image`) on every node, pushed through a
pipelined relay over the node-to-node SSH mesh: controller -> node1 -> node2 -> ...

Each hop loads the stream while passing it on, so N nodes take about as long as one,
and the controller's uplink carries the image once. All hops connect (SSH control
masters) before any data flows. The stream is compressed with zstd when every hop has
it. Nodes that already hold the same image ID are skipped; a node whose disk is too
small is refused before anything is sent; every node's image ID is verified after.
"""

from __future__ import annotations

import contextlib
import itertools
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import BinaryIO, cast

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host
from gpucluster.provision.image_source import ImageSource, locate
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import Change, Each, ProvisionContext, StepSkipped
from gpucluster.remote.result import RemoteError
from gpucluster.templating import render

GIB = 1024**3
HEADROOM = 1.2  # unpacked layers plus a margin
COUNTER = """\
import sys, time
node, read, write = sys.argv[1], sys.stdin.buffer.read, sys.stdout.buffer.write
total, last = 0, 0.0
while chunk := read(1 << 20):
    write(chunk)
    total += len(chunk)
    if time.time() - last > 0.5:
        last = time.time()
        print("progress", node, total, file=sys.stderr, flush=True)
sys.stdout.flush()
print("progress", node, total, "done", file=sys.stderr, flush=True)
"""
Progress = Callable[[str, int, bool], None]  # node, bytes received, finished


class ImageStep:
    name = "image"
    summary = "the inventory's container image on every node (pipelined relay, verified)"

    def __init__(self) -> None:
        self.on_progress: Progress | None = None

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        spec = context.inventory.cluster.image
        if spec is None:
            raise StepSkipped("no `image:` in the inventory's cluster section")
        context.gathered["image"] = {"source": locate(spec, context.inventory.path.parent)}

    def source(self, context: ProvisionContext) -> ImageSource:
        found = context.gathered["image"]["source"]
        assert isinstance(found, ImageSource)
        return found

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        image = self.source(context)
        probe = connection.run(
            "rt=$(command -v podman || command -v docker) || { echo none; exit 0; }; "
            "echo \"$rt\"; \"$rt\" image inspect --format '{{.Id}}' "
            f"{shlex.quote(image.reference)} 2>/dev/null || echo absent; "
            "command -v zstd >/dev/null && echo zstd || echo no-zstd; "
            "root=$(\"$rt\" info --format '{{.Store.GraphRoot}}' 2>/dev/null || "
            "\"$rt\" info --format '{{.DockerRootDir}}' 2>/dev/null); "
            "d=${root:-/var/lib}; while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
            "df -Pk \"$d\" | tail -n 1", timeout=60, sudo=True)
        lines = probe.stdout.split("\n")
        if not lines or lines[0].strip() == "none":
            raise GpuclusterError("no container runtime (podman or docker) on this node")
        runtime, present, zstd, df_line = [*lines, "", "", "", ""][:4]
        context.gathered.setdefault("runtimes", {})[host.name] = runtime.strip()
        context.gathered.setdefault("zstd", {})[host.name] = zstd.strip() == "zstd"
        if present.strip().removeprefix("sha256:") == image.image_id:
            return []
        fields = df_line.split()
        free = int(fields[3]) * 1024 if len(fields) > 3 and fields[3].isdigit() else None
        needed = int(image.size_bytes * HEADROOM)
        if free is not None and free < needed:
            raise GpuclusterError(
                f"not enough disk for {image.reference}: needs {needed / GIB:.2f} GiB, "
                f"{free / GIB:.2f} GiB free under {fields[-1]}: free space first")
        return [Change(f"load {image.reference} (id {image.image_id[:12]}, "
                       f"{image.size_bytes / 1e6:.0f} MB) via the relay")]

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None:
        raise GpuclusterError("the image step is applied to all nodes at once")

    def apply_all(self, context: ProvisionContext, each: Each, targets: list[Host],
                  connections: dict[str, LoggedConnection]) -> None:
        """Push to `targets` in one relay chain; failures show in the re-check."""
        image = self.source(context)
        zstd_everywhere = shutil.which("zstd") is not None and all(
            context.gathered.get("zstd", {}).get(h.name) for h in targets)
        dirs = {h.name: connections[h.name].run(
            "mktemp -d \"${TMPDIR:-/tmp}/gpucluster-relay.XXXXXX\"", timeout=30).stdout.strip()
            for h in targets}
        python = context.inventory.cluster.python
        runtimes = context.gathered.get("runtimes", {})
        for position, host in enumerate(targets):  # write each hop's script
            following = targets[position + 1] if position + 1 < len(targets) else None
            runtime = shlex.quote(str(runtimes[host.name]))
            script = render("provision/image_relay.sh.j2", node=host.name, dir=dirs[host.name],
                            next=following.name if following else None,
                            next_dir=dirs[following.name] if following else "",
                            python=python, counter=COUNTER,
                            runtime=runtime if host.user == "root" else f"sudo -n {runtime}",
                            decompress="zstd -dc" if zstd_everywhere else "cat")
            connection = connections[host.name]
            quoted = shlex.quote(dirs[host.name])
            connection.run(f"cat > {quoted}/relay.sh", timeout=30, stdin=script.encode())
        try:
            self._connect_hops(targets, dirs, connections)
            self._stream(image, targets[0], connections[targets[0].name], dirs, zstd_everywhere)
        finally:
            for host in targets:
                quoted = shlex.quote(dirs[host.name])
                with contextlib.suppress(RemoteError):  # a dead node: its /tmp clears
                    connections[host.name].run(
                        f"ssh -o ControlPath={quoted}/control -O exit x 2>/dev/null; "
                        f"rm -rf {quoted}", timeout=30)

    def _connect_hops(self, targets: list[Host], dirs: dict[str, str],
                      connections: dict[str, LoggedConnection]) -> None:
        """Every hop opens its SSH connection to the next before data flows, in parallel."""
        errors: list[str] = []

        def connect(host: Host, following: Host) -> None:
            quoted = shlex.quote(dirs[host.name])
            try:
                result = connections[host.name].run(
                    f"ssh -o BatchMode=yes -o ControlMaster=yes -o ControlPath={quoted}/control "
                    f"-o ControlPersist=600 -fN {shlex.quote(following.name)} "
                    f"</dev/null >/dev/null 2>&1; ssh -o ControlPath={quoted}/control -O check "
                    f"x 2>&1", timeout=30)
                if not result.ok:
                    errors.append(f"{host.name} -> {following.name}: {result.stdout.strip()}")
            except RemoteError as error:
                errors.append(f"{host.name}: {error.message}")

        threads = [threading.Thread(target=connect, args=(a, b), daemon=True)
                   for a, b in itertools.pairwise(targets)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        if errors:
            raise GpuclusterError("relay hops could not connect (run the ssh-mesh step): "
                                  + "; ".join(errors))

    def _stream(self, image: ImageSource, first: Host, connection: LoggedConnection,
                dirs: dict[str, str], compress: bool) -> None:
        saver = subprocess.Popen(image.stream_argv, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
        source = cast("BinaryIO | None", saver.stdout)
        compressor = None
        if compress:
            compressor = subprocess.Popen(["zstd", "-1", "-T0", "-q", "-c"], stdin=saver.stdout,
                                          stdout=subprocess.PIPE)
            source = cast("BinaryIO | None", compressor.stdout)
        assert source is not None

        def on_line(_stream: str, line: str) -> None:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "progress" and parts[2].isdigit() and \
                    self.on_progress is not None:
                self.on_progress(parts[1], int(parts[2]), parts[-1] == "done")

        try:
            connection.run(f"sh {shlex.quote(dirs[first.name])}/relay.sh", timeout=24 * 3600,
                           stdin=source, on_line=on_line)
        finally:
            for process in (compressor, saver):
                if process is not None:
                    process.kill()
                    process.wait()
