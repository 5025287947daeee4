"""Step `image`: one container image (`cluster.image`) on every node, pushed through a
pipelined relay over the node-to-node SSH mesh: controller -> node1 -> node2 -> ...

Each hop loads the stream while passing it on, so N nodes take about as long as one,
and the controller's uplink carries the image once. Every hop logs in and links to the
next before any data flows (provision/relay_chain.py), so no login is on the data path,
and a hop that cannot reach the next stops the push before it starts. The stream is
compressed with zstd when every hop has it. Nodes that already hold the same image ID
are skipped; a node whose disk is too small is refused before anything is sent; every
node's image ID is verified after.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import BinaryIO, cast

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host
from gpucluster.provision.image_source import ImageSource, locate
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import (
    Change,
    Each,
    ProvisionContext,
    Step,
    StepSkipped,
)
from gpucluster.provision.relay_chain import Hop, RelayChain
from gpucluster.remote.connection import SUDO_PASSWORD_VARIABLE, SUDO_WITH_PASSWORD, shell_path
from gpucluster.templating import render, script_text
from gpucluster.torchrun import node_images_dir

GIB = 1024**3
# AES-GCM first: with AES-NI it costs about half of chacha20 per byte, and every hop
# both decrypts and encrypts the whole image.
HOP_CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-gcm@openssh.com"
HEADROOM = 1.2  # unpacked layers plus a margin


def images_dir(context: ProvisionContext) -> str:
    return node_images_dir(context.inventory.cluster.work_dir)


def file_destination(context: ProvisionContext, image: ImageSource) -> str:
    return f"{images_dir(context)}/{shlex.quote(image.reference)}"


def _sink_and_report(context: ProvisionContext, image: ImageSource, runtime: str,
                     sudo: bool, node: str) -> tuple[str, str]:
    """What a hop does with the stream, and the command that prints the ID it now has."""
    if image.is_file:
        # Written under a temporary name of this node's own, then renamed: on a work dir
        # every node shares (NFS) the hops write the same file at once, and each must
        # rename a whole copy, never a mix. The checksum is taken of what arrived and
        # recorded beside it, the same way, for the next run's check.
        destination = file_destination(context, image)
        part = f"{destination}.part-{shlex.quote(node)}"
        return (f"{{ mkdir -p {images_dir(context)} && cat > {part} && "
                f"mv -f {part} {destination}; }}",
                f"sha=$(sha256sum < {destination} | cut -d' ' -f1) && printf '%s\\n' "
                f"\"$sha\" > {part}.sha256 && mv -f {part}.sha256 {destination}.sha256 && "
                f"echo \"$sha\"")
    engine = shlex.quote(runtime)
    if sudo:
        engine = f"{SUDO_WITH_PASSWORD} {engine}" if context.sudo_password is not None \
            else f"sudo -n {engine}"
    return (f"{engine} load >&2",
            f"{engine} image inspect --format '{{{{.Id}}}}' {shlex.quote(image.reference)} "
            f"2>/dev/null")


class ImageStep(Step):
    name = "image"
    summary = "the inventory's container image on every node (pipelined relay, verified)"
    cluster_wide = True  # one relay chain through every node that needs the image

    def needs_root(self, context: ProvisionContext) -> bool:
        return context.inventory.cluster.image is not None

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
        if image.is_file:
            # An image file is current when the checksum recorded beside it (written
            # after it arrived, so not older than it) names the same content.
            destination = file_destination(context, image)
            where = images_dir(context)
            probe = connection.run(
                f"echo file; f={destination}; if [ -f \"$f\" ] && [ -f \"$f.sha256\" ] && "
                f"[ ! \"$f\" -nt \"$f.sha256\" ]; then cat \"$f.sha256\"; else echo absent; "
                f"fi; command -v zstd >/dev/null && echo zstd || echo no-zstd; d={where}; "
                f"while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
                f"df -Pk \"$d\" | tail -n 1", timeout=60)
        else:
            probe = connection.run(
                "rt=$(command -v podman || command -v docker) || { echo none; exit 0; }; "
                "echo \"$rt\"; \"$rt\" image inspect --format '{{.Id}}' "
                f"{shlex.quote(image.reference)} 2>/dev/null || echo absent; "
                "command -v zstd >/dev/null && echo zstd || echo no-zstd; "
                # `podman info` would name the storage root, but costs a second podman
                # start per node: the default roots are where images go unless changed.
                "case $rt in *docker) d=/var/lib/docker;; *) d=/var/lib/containers;; esac; "
                "while [ ! -d \"$d\" ]; do d=$(dirname \"$d\"); done; "
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
        needed = int(image.size_bytes * (1.0 if image.is_file else HEADROOM))
        if free is not None and free < needed:
            raise GpuclusterError(
                f"not enough disk for {image.reference}: needs {needed / GIB:.2f} GiB, "
                f"{free / GIB:.2f} GiB free under {fields[-1]}: free space first")
        how = (f"copy {image.reference} to {file_destination(context, image)}" if image.is_file
               else f"load {image.reference}")
        return [Change(f"{how} (id {image.image_id[:12]}, "
                       f"{image.size_bytes / 1e6:.0f} MB) via the relay")]

    def apply_all(self, context: ProvisionContext, each: Each, targets: list[Host],
                  connections: dict[str, LoggedConnection]) -> dict[str, str | None]:
        """Push to `targets` in one relay chain. Returns per node None when the image ID
        it reports after loading is the right one, else what went wrong."""
        image = self.source(context)
        zstd_everywhere = shutil.which("zstd") is not None and all(
            context.gathered.get("zstd", {}).get(h.name) for h in targets)
        # Inside each node's work directory (not a shared /tmp), and named after the node:
        # on a work dir shared by every node (NFS) the hops must not share one script,
        # control socket or clean-up.
        run_id = uuid.uuid4().hex[:8]
        relay_dirs = {h.name: shell_path(f"{context.inventory.cluster.work_dir}/.relay-"
                                         f"{run_id}-{h.name}") for h in targets}
        runtimes = context.gathered.get("runtimes", {})
        hops = []
        for host, after in zip(targets, [*targets[1:], None], strict=True):
            sink, report = _sink_and_report(context, image, str(runtimes[host.name]),
                                            sudo=host.user != "root", node=host.name)
            script = render(
                "provision/image_relay.sh.j2", node=host.name, dir=relay_dirs[host.name],
                first=host is targets[0], next=after.name if after else None,
                next_dir=relay_dirs[after.name] if after else None,
                python=context.inventory.cluster.python,
                counter=script_text("provision/relay_counter.py"),
                sink=sink, report=report, ciphers=HOP_CIPHERS,
                connect_timeout=math.ceil(_connect_timeout(context, after)),
                decompress="zstd -dc" if zstd_everywhere else "cat")
            asks = host.user != "root" and context.sudo_password is not None
            hops.append(Hop(host, connections[host.name], script,
                            {SUDO_PASSWORD_VARIABLE: str(context.sudo_password)} if asks
                            else None))
        chain = RelayChain(hops, context.on_progress)
        with _image_stream(image, zstd_everywhere) as stream:
            problems = chain.run(stream)
        if problems:  # remove what a hop cut short could not remove itself
            each(lambda host, connection: connection.run(
                render("provision/relay_cleanup.sh.j2", dir=relay_dirs[host.name]),
                timeout=30), targets)
        return {h.name: None if chain.loaded.get(h.name) == image.image_id else
                problems.get(h.name) or
                f"after loading, the node reports image {chain.loaded.get(h.name) or 'none'}, "
                f"not {image.image_id[:12]}" for h in targets}


def _connect_timeout(context: ProvisionContext, host: Host | None) -> float:
    own = host.connect_timeout if host is not None else None
    return own or context.inventory.cluster.connect_timeout


@contextlib.contextmanager
def _image_stream(image: ImageSource, compress: bool) -> Iterator[BinaryIO]:
    """The image as the controller reads it (`podman save` or the file), zstd-compressed
    when every hop can decompress it; the readers are stopped on the way out."""
    saver = subprocess.Popen(image.stream_argv, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    source = cast("BinaryIO | None", saver.stdout)
    compressor = None
    if compress:
        compressor = subprocess.Popen(["zstd", "-1", "-T0", "-q", "-c"], stdin=saver.stdout,
                                      stdout=subprocess.PIPE)
        source = cast("BinaryIO | None", compressor.stdout)
    assert source is not None
    try:
        yield source
    finally:
        for process in (compressor, saver):
            if process is not None:
                process.kill()
                process.wait()
