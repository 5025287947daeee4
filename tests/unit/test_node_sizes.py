"""The node-side sizing prune uses (templates/_measure.sh.j2): one find over every path,
its entries told apart by the /dev/null before each; compared with du, stat and the
paths' own files, under dash and bash, with names no line-based listing survives."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpucluster.templating import render


def sizes_of(paths: list[Path], shell: str) -> dict[int, dict[str, str]]:
    script = render("_measure.sh.j2") + 'mark "$@" | sizes\n'
    done = subprocess.run([shell, "-c", script, "sizes", *map(str, paths)],
                          capture_output=True, text=True, check=True)
    found: dict[int, dict[str, str]] = {}
    for assignment in done.stdout.split():
        name, _, value = assignment.partition("=")
        field, _, index = name.rpartition("_")
        found.setdefault(int(index), {})[field] = value
    return found


def du_kib(path: Path) -> str:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return done.stdout.split()[0]


def newest(path: Path) -> float:
    times = [path.lstat().st_mtime]
    for root, dirs, files in os.walk(path):
        times += [Path(root, name).lstat().st_mtime for name in dirs + files]
    return max(times)


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_each_path_is_sized_as_du_and_stat_see_it_whatever_its_name(
        tmp_path: Path, shell: str) -> None:
    odd = tmp_path / "a job\nwith a newline"
    (odd / "ranks").mkdir(parents=True)
    (odd / "ranks" / "rank 0.log\nfake 0 f 99 1:1 1 1").write_bytes(os.urandom(9000))
    linked = tmp_path / "checkpoints"
    linked.mkdir()
    (linked / "model.pt").write_bytes(os.urandom(40_000))
    os.link(linked / "model.pt", linked / "same-model.pt")  # one file's blocks, once
    empty = tmp_path / "never written"
    empty.mkdir()
    plain = tmp_path / "stdout.log"
    plain.write_bytes(b"x" * 5000)
    paths = [odd, tmp_path / "gone", linked, empty, plain, linked]
    found = sizes_of(paths, shell)
    assert sorted(found) == list(range(len(paths)))
    for index in (0, 2, 3, 5):
        path = paths[index]
        assert found[index]["kib"] == du_kib(path), path
        inode, _, time = found[index]["dirid"].partition("/")
        assert int(inode) == path.stat().st_ino and time == found[index]["newest"]
        assert abs(float(time) - newest(path)) < 1e-3
    assert [found[i]["files"] for i in range(len(paths))] == ["1", "0", "1", "0", "1", "1"]
    assert found[1] == {"kib": "-", "files": "0", "newest": "-", "dirid": "-"}
    assert found[4]["kib"] == du_kib(plain) and found[4]["dirid"] == "-"
    assert found[5] == found[2]  # listed twice: the same answer, not half or double


def test_a_list_past_one_find_s_arguments_is_sized_whole(tmp_path: Path) -> None:
    """xargs gives each find about 128 KiB of arguments: 800 paths of 200 bytes take two
    finds or more, and a /dev/null may end one and its path begin the next."""
    paths = []
    for index in range(800):
        path = tmp_path / f"{index:04d}-{'x' * 190}"
        if index % 7:
            path.mkdir()
            (path / "log").write_bytes(b"y" * (index * 10))
        paths.append(path)
    found = sizes_of(paths, "sh")
    assert sorted(found) == list(range(800))
    for index, path in enumerate(paths):
        assert found[index]["kib"] == (du_kib(path) if index % 7 else "-"), index
        assert found[index]["files"] == ("1" if index % 7 else "0")
