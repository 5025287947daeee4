"""Send the job's working directory to every node, only what changed.

Like rsync's quick check: a file is sent when its size or modification time differs
from the node's copy. The node keeps the list of files we sent (`.gpucluster-sync`), so
a file deleted here is deleted there, while files the job wrote itself (checkpoints,
outputs) are never touched. Symbolic links go as links (rsync -a's and git's way): a
`data -> /mnt/datasets/x` link points at the node's own copy, never copies the dataset.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pathspec import GitIgnoreSpec

from gpucluster import reports
from gpucluster.errors import GpuclusterError
from gpucluster.remote.connection import Connection
from gpucluster.templating import render

IGNORE_FILE = ".gpuclusterignore"
MANIFEST = ".gpucluster-sync"
# Where a node unpacks a sync before renaming each file into place (<prefix><node>.<pid>).
STAGE_PREFIX = ".gpucluster-incoming."
# `gpucluster bundle`'s archives: their default place is the current directory, often
# the work dir, and a bug report is not the job's code. Never sent either.
BUNDLE_PREFIX = "gpucluster-bundle-"
BUNDLE_PATTERNS = (f"{BUNDLE_PREFIX}*.tar.gz", f"{BUNDLE_PREFIX}*.tar.gz.partial")
# Never sent: version control, virtualenvs, caches, and our own state (the cluster key).
ALWAYS_EXCLUDED = (".git", ".hg", ".svn", "__pycache__", ".gpucluster", ".venv", "venv",
                   ".mypy_cache", ".pytest_cache", ".ruff_cache", MANIFEST)
SYNC_TIMEOUT_S = 600.0
# A tar up to this size is made once, in memory, for every node that needs the same
# files; a larger one is streamed to each node as it is read (no copy in memory).
SHARED_TAR_LIMIT = 64 << 20
# ...and gzipped when it is at most this: code shrinks 3-4x, and a small file's member
# (a 512-byte header, its data padded to 512) 40x, at 0.03 s for this repository's
# 3.6 MB. Past it a tar is mostly data (a checkpoint, a dataset), which gzip's fastest
# level crosses at 46 MB/s for little gain, before the first byte is sent.
GZIP_LIMIT = 16 << 20
_TAR_BLOCK = 512


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, POSIX separators
    size: int  # a link's: the length of its target, as lstat and find's %s say
    mtime: int
    mode: int
    link: str | None = None  # a symbolic link's target


@dataclass(frozen=True)
class SyncPlan:
    send: tuple[LocalFile, ...]
    delete: tuple[str, ...]
    unchanged: int

    @property
    def bytes_to_send(self) -> int:
        return sum(f.size for f in self.send if f.link is None)  # a link carries no data


@dataclass(frozen=True)
class SyncResult:
    sent: int
    deleted: int
    unchanged: int
    bytes_sent: int


class IgnoreRules:
    """What is never sent: ALWAYS_EXCLUDED names anywhere, and `.gpuclusterignore` with
    git's own rules (pathspec's GitIgnoreSpec: `**`, anchoring, negation, escapes), so
    that a pattern means here what it means in a .gitignore."""

    def __init__(self, root: Path) -> None:
        self.path = root / IGNORE_FILE
        lines = self.path.read_text(encoding="utf-8").splitlines() \
            if self.path.is_file() else []
        self._spec = self._compile(lines)

    def _compile(self, lines: list[str]) -> GitIgnoreSpec:
        try:  # bundles first, so that a `!` line of the user's can still send one
            return GitIgnoreSpec.from_lines([*BUNDLE_PATTERNS, *lines])
        except ValueError as error:  # pathspec names no line: find it
            for number, line in enumerate(lines, 1):
                try:
                    GitIgnoreSpec.from_lines([line])
                except ValueError:
                    raise GpuclusterError(f"{self.path}:{number}: {line!r} is not a valid "
                                          f"gitignore pattern ({error}; fix or remove "
                                          f"it)") from None
            raise GpuclusterError(f"{self.path}: {error}") from None

    def ignored(self, relative: str, is_dir: bool = False) -> bool:
        if relative.rsplit("/", 1)[-1] in ALWAYS_EXCLUDED:
            return True
        return self._spec.match_file(relative + "/" if is_dir else relative)


def local_files(root: Path) -> dict[str, LocalFile]:
    """Regular files and symbolic links under `root` that are not excluded; virtualenvs
    are recognised by their pyvenv.cfg whatever they are called. As in git, a file under
    an excluded directory stays out whatever a later `!pattern` says, and a link is
    matched as a file (a link to a directory is never walked into)."""
    rules = IgnoreRules(root)
    found: dict[str, LocalFile] = {}
    for directory, dirs, files in os.walk(root):
        base = Path(directory)
        prefix = base.relative_to(root).as_posix()
        prefix = "" if prefix == "." else prefix + "/"
        links = [d for d in dirs if (base / d).is_symlink()]
        dirs[:] = sorted(d for d in dirs
                         if d not in links and not rules.ignored(prefix + d, is_dir=True)
                         and not (base / d / "pyvenv.cfg").exists())
        for name in sorted([*files, *links]):
            relative = prefix + name
            if rules.ignored(relative):
                continue
            _check_name(base / name, rules.path)
            status = os.lstat(base / name)
            if stat.S_ISLNK(status.st_mode):
                # os.readlink: the target as written (a Path would drop a "./" or "/").
                target = os.readlink(base / name)  # noqa: PTH115
                found[relative] = LocalFile(relative, status.st_size, int(status.st_mtime),
                                            0o777, target)
            elif stat.S_ISREG(status.st_mode):
                found[relative] = LocalFile(relative, status.st_size, int(status.st_mtime),
                                            status.st_mode & 0o777)
    return found


def _check_name(path: Path, ignore_file: Path) -> None:
    """Refuse, by name, a file the sync cannot carry rather than leave it out unsaid:
    the node lists its files one line each, as UTF-8 text."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
        why = "a file name with a line break" if "\n" in str(path) else None
    except UnicodeDecodeError:
        why = "a file name that is not UTF-8"
    if why is not None:
        shown = raw.decode("utf-8", "backslashreplace").replace("\n", "\\n")
        raise GpuclusterError(f"{shown}: {why} cannot be synced (fix: rename it, or list "
                              f"it in {ignore_file})")


def listing_command(code_dir: str) -> str:
    """What the node has: the last sync's manifest and every file, as report sections."""
    return render("launch/sync_listing.sh.j2", code_dir=code_dir, manifest=MANIFEST,
                  stage_prefix=STAGE_PREFIX)


LISTING_SECTIONS = ("manifest", "files")


def parse_listing(found: Mapping[str, reports.Section]
                  ) -> tuple[set[str], dict[str, tuple[int, int]]]:
    manifest, files = found.get("manifest"), found.get("files")
    previous = {p for p in (manifest.output if manifest else "").splitlines() if p}
    remote: dict[str, tuple[int, int]] = {}
    for record in (files.output if files else "").splitlines():
        size, _, rest = record.partition(" ")
        mtime, _, path = rest.partition(" ")
        if path and size.isdigit():
            remote[path] = (int(size), int(float(mtime)))
    return previous, remote


def plan_sync(local: Mapping[str, LocalFile], previous: set[str],
              remote: Mapping[str, tuple[int, int]],
              ignored: Callable[[str], bool] = lambda _path: False) -> SyncPlan:
    """Send what differs; delete what we sent before and the work dir no longer has,
    but not what it now ignores (as rsync's --delete spares excluded files): ignoring a
    dataset the nodes hold must not delete it there."""
    send = tuple(f for p, f in local.items() if remote.get(p) != (f.size, f.mtime))
    delete = tuple(sorted(p for p in previous
                          if p not in local and p in remote and not ignored(p)))
    return SyncPlan(send, delete, len(local) - len(send))


def write_tar(target: BinaryIO, root: Path, send: tuple[LocalFile, ...],
              manifest: list[str]) -> None:
    """The changed files plus the new manifest, as one tar stream into `target`."""
    with tarfile.open(fileobj=target, mode="w|") as archive:
        for entry in send:
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.mode = entry.mtime, entry.mode
            if entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                archive.addfile(info)
                continue
            info.size = entry.size
            with (root / entry.path).open("rb") as handle:
                archive.addfile(info, handle)
        data = "\0".join(manifest).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


@contextlib.contextmanager
def tar_stream(root: Path, send: tuple[LocalFile, ...], manifest: list[str]
               ) -> Iterator[BinaryIO]:
    """The tar as a pipe, written while it is read: a work dir with large files costs
    no memory for the copy, however many nodes are synced at once."""
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "rb")
    problems: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_end, "wb") as writer:
                write_tar(writer, root, send, manifest)
        except BrokenPipeError:
            pass  # the node stopped reading; its exit code tells why
        except Exception as error:  # a local file vanished or could not be read:
            problems.append(error)   # the node sees the tar end before the manifest

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        yield reader
    finally:
        reader.close()  # a producer still writing gets EPIPE and ends
        producer.join(30)
    if problems:
        raise GpuclusterError(f"cannot read the work dir to sync it: {problems[0]}")


def _tar_size(send: tuple[LocalFile, ...]) -> int:
    """About what the tar of `send` weighs: a header block per member, its data padded to
    whole blocks (long names' extra headers left out)."""
    return sum(_TAR_BLOCK + -(-entry.size // _TAR_BLOCK) * _TAR_BLOCK
               if entry.link is None else _TAR_BLOCK for entry in send)


def _tar_in_memory(root: Path, send: tuple[LocalFile, ...], manifest: list[str]) -> bytes:
    buffer = io.BytesIO()
    try:
        write_tar(buffer, root, send, manifest)
    except OSError as error:
        raise GpuclusterError(f"cannot read the work dir to sync it: {error}") from None
    if not sent_gzipped(send):
        return buffer.getvalue()
    return gzip.compress(buffer.getvalue(), compresslevel=1, mtime=0)  # once, for all


@contextlib.contextmanager
def tar_streams(root: Path, sends: Mapping[str, tuple[LocalFile, ...]], manifest: list[str]
                ) -> Iterator[dict[str, BinaryIO]]:
    """Each node's tar of the files it lacks. Nodes that lack the same files share one
    tar, made once in memory when it is at most SHARED_TAR_LIMIT: a work dir of code is
    thousands of small files, and encoding them once per node, one node after another
    under the GIL, cost 1.5 s per node for 30000 files. A larger tar is streamed to each
    node as it is read."""
    made: dict[tuple[str, ...], bytes] = {}
    with contextlib.ExitStack() as streamed:
        streams: dict[str, BinaryIO] = {}
        for node, send in sends.items():
            if not shares_tar(send):
                streams[node] = streamed.enter_context(tar_stream(root, send, manifest))
                continue
            key = tuple(entry.path for entry in send)  # one path, one LocalFile: `local`'s
            if key not in made:
                made[key] = _tar_in_memory(root, send, manifest)
            streams[node] = io.BytesIO(made[key])  # shares the bytes, copies nothing
        yield streams


def shares_tar(send: tuple[LocalFile, ...]) -> bool:
    """Whether `tar_streams` sends these files as a tar made once in memory."""
    return _tar_size(send) <= SHARED_TAR_LIMIT


def sent_gzipped(send: tuple[LocalFile, ...]) -> bool:
    """Whether the tar `tar_streams` sends of these files is gzipped."""
    return _tar_size(send) <= GZIP_LIMIT


def apply_command(code_dir: str, delete: tuple[str, ...], node: str,
                  gzipped: bool = False) -> str:
    return render("launch/sync_apply.sh.j2", code_dir=code_dir, delete=delete, node=node,
                  stage_prefix=STAGE_PREFIX, manifest=MANIFEST, gzipped=gzipped)


def plan_for(connection: Connection, local: Mapping[str, LocalFile], code_dir: str,
             listed: Mapping[str, reports.Section] | None = None,
             ignored: Callable[[str], bool] = lambda _path: False) -> tuple[SyncPlan, bool]:
    """What to send the node, and whether anything must be applied there (the manifest
    too can be out of date). From `listed` when the caller's own round trip brought the
    node's listing; else one round trip for it."""
    if listed is None or not all(name in listed for name in LISTING_SECTIONS):
        listing = connection.run(listing_command(code_dir), timeout=60)
        if not listing.ok:
            raise GpuclusterError(f"cannot list {code_dir}: {listing.stderr.strip()[-200:]}")
        listed = reports.sections(listing.stdout)
    previous, remote = parse_listing(listed)
    plan = plan_sync(local, previous, remote, ignored)
    return plan, bool(plan.send or plan.delete or previous != set(local))


def result_of(plan: SyncPlan) -> SyncResult:
    return SyncResult(len(plan.send), len(plan.delete), plan.unchanged, plan.bytes_to_send)


def apply(connection: Connection, code_dir: str, plan: SyncPlan, tar: BinaryIO) -> SyncResult:
    """Send the node the tar `tar_streams` made for `plan`, and unpack it there."""
    applied = connection.run(apply_command(code_dir, plan.delete, connection.host,
                                           gzipped=sent_gzipped(plan.send)),
                             timeout=SYNC_TIMEOUT_S, stdin=tar)
    if not applied.ok:
        raise GpuclusterError(f"cannot unpack into {code_dir}: "
                              f"{applied.stderr.strip()[-200:]}")
    return result_of(plan)


def sync(connection: Connection, root: Path, local: Mapping[str, LocalFile],
         code_dir: str) -> SyncResult:
    """Bring one node's copy of `root` up to date: its listing, then one round that sends
    the changes (for many nodes, plan them all and share `tar_streams`, as launch and
    export sbatch do)."""
    plan, needed = plan_for(connection, local, code_dir, None, IgnoreRules(root).ignored)
    if not needed:
        return result_of(plan)
    with tar_streams(root, {connection.host: plan.send}, sorted(local)) as tars:
        return apply(connection, code_dir, plan, tars[connection.host])

