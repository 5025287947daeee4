"""Compiled templates kept between runs, in jinja2's own cache. Compiling costs each
command more than rendering does: about 35 ms of CPU for launch's templates (its lexer's
regexes included), 140 ms for all of them, against a few ms to load them back."""

from __future__ import annotations

import contextlib

import jinja2
from jinja2.bccache import Bucket


class TolerantCache(jinja2.FileSystemBytecodeCache):
    """An entry that cannot be read back is compiled again, and one that cannot be written
    (a full or read-only /tmp) is left out: the cache never fails a command."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # a truncated or foreign entry: pickle, marshal or I/O errors
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def bytecode_cache() -> jinja2.BytecodeCache | None:
    """jinja2's per-user directory under the temp dir (`_jinja2-cache-UID`): it makes and
    keeps it 0700, and refuses one that another user owns or a link in its place, since
    its entries are unpickled and run. Where it is refused, or cannot be made, templates
    are compiled as before."""
    try:
        return TolerantCache()
    except (OSError, RuntimeError):
        return None
