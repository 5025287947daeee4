"""Compiled templates kept in jinja2's per-user cache: loaded back instead of compiled,
and never a failed command when the cache is broken, unwritable or not ours."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest

from gpucluster import templating
from gpucluster.template_cache import bytecode_cache

TEMPLATE = "launch/stamper.sh.j2"  # renders without arguments, and includes two more


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp dir of the test's own, and a fresh environment on each side of it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    templating._environment.cache_clear()
    yield tmp_path
    templating._environment.cache_clear()


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the templates jinja2 compiles from source."""
    names: list[str] = []
    compile_source = jinja2.Environment.compile

    def counting(self: jinja2.Environment, source: str, name: str | None = None,
                 *args: object, **kwargs: object) -> object:
        names.append(name or "")
        return compile_source(self, source, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    return names


def test_a_template_is_compiled_once_then_loaded_back(temp_dir: Path,
                                                      compiled: list[str]) -> None:
    first = templating.render(TEMPLATE)
    assert TEMPLATE in compiled
    cache = temp_dir / f"_jinja2-cache-{os.getuid()}"
    assert cache.is_dir() and cache.stat().st_mode & 0o777 == 0o700
    assert list(cache.iterdir())  # written
    compiled.clear()
    templating._environment.cache_clear()  # as the next command starts
    assert templating.render(TEMPLATE) == first
    assert compiled == []  # loaded, not compiled, its includes too


def test_a_broken_entry_is_compiled_again(temp_dir: Path, compiled: list[str]) -> None:
    first = templating.render(TEMPLATE)
    cache = temp_dir / f"_jinja2-cache-{os.getuid()}"
    for entry in cache.iterdir():
        entry.write_bytes(entry.read_bytes()[:20])  # cut short, as a full disk leaves it
    compiled.clear()
    templating._environment.cache_clear()
    assert templating.render(TEMPLATE) == first
    assert TEMPLATE in compiled


def test_a_cache_that_cannot_be_written_fails_nothing(temp_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> object:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", full)
    assert "tail" in templating.render(TEMPLATE)


def test_a_cache_dir_planted_by_someone_else_is_not_used(temp_dir: Path,
                                                         compiled: list[str]) -> None:
    """Its entries are unpickled and run, so a link in /tmp (or a dir another user owns)
    in the cache's place means no cache: templates are compiled as before."""
    elsewhere = temp_dir / "theirs"
    elsewhere.mkdir(mode=0o777)
    (temp_dir / f"_jinja2-cache-{os.getuid()}").symlink_to(elsewhere)
    assert bytecode_cache() is None
    first = templating.render(TEMPLATE)
    templating._environment.cache_clear()
    assert templating.render(TEMPLATE) == first
    assert compiled.count(TEMPLATE) == 2
    assert list(elsewhere.iterdir()) == []
