"""Where the image comes from on the controller: a local podman/docker image, an archive
file (docker-archive or OCI tar) that nodes load into podman/docker, or an Apptainer
(.sif) or enroot (.sqsh) image file that nodes keep as a file. Gives its ID (for a file:
its sha256), its size, and the command that streams it (never an extra copy on disk)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpucluster.errors import GpuclusterError
from gpucluster.torchrun import is_image_file


@dataclass(frozen=True)
class ImageSource:
    reference: str  # what nodes know it as after loading
    image_id: str  # hex, without "sha256:"
    size_bytes: int
    stream_argv: tuple[str, ...]  # prints the archive on stdout
    kind: str = "container"  # container: loaded by podman/docker; file: kept as a file

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


def locate(spec: str, base: Path) -> ImageSource:
    """`spec` is an archive path (relative to the inventory) or a local image name."""
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = base / path
    if path.is_file():
        return _archive(path)
    for engine in ("podman", "docker"):
        if shutil.which(engine) is None:
            continue
        done = subprocess.run([engine, "image", "inspect", "--format", "{{.Id}} {{.Size}}",
                               spec], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.split():
            image_id, size = done.stdout.split()[:2]
            return ImageSource(spec, image_id.removeprefix("sha256:"), int(size),
                               (engine, "save", spec))
    raise GpuclusterError(f"image {spec!r}: not a file and not an image in the controller's "
                          f"podman or docker (build or pull it here first)")


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The file's sha256, read a chunk at a time (image files are gigabytes; and
    hashlib.file_digest needs Python 3.11)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _archive(path: Path) -> ImageSource:
    if is_image_file(path.name):
        return ImageSource(path.name, file_sha256(path), path.stat().st_size, ("cat", str(path)),
                           kind="file")
    try:
        with tarfile.open(path) as archive:
            names = archive.getnames()
            if "manifest.json" in names:  # docker-archive
                manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
                config = manifest[0]["Config"]
                tags = manifest[0].get("RepoTags") or [path.stem]
                image_id = Path(config).name.removesuffix(".json")
            elif "index.json" in names:  # OCI layout
                index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
                digest = index["manifests"][0]["digest"].split(":")[1]
                blob = archive.extractfile(f"blobs/sha256/{digest}")
                image_id = json.load(blob)["config"]["digest"].split(":")[1]  # type: ignore[arg-type]
                annotations = index["manifests"][0].get("annotations", {})
                tags = [annotations.get("org.opencontainers.image.ref.name", path.stem)]
            else:
                raise GpuclusterError(f"{path}: neither a docker nor an OCI image archive")
    except (tarfile.TarError, KeyError, IndexError, ValueError, OSError) as error:
        raise GpuclusterError(f"{path}: cannot read the image archive: {error}") from None
    return ImageSource(tags[0], image_id, path.stat().st_size, ("cat", str(path)))
