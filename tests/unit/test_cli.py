"""The CLI as a user meets it: help, version, and one-line errors without tracebacks."""

from __future__ import annotations

from pathlib import Path

from gpucluster import __version__
from tests.cli import gpucluster


def test_version_and_help() -> None:
    assert gpucluster("--version").stdout.strip() == f"gpucluster {__version__}"
    helped = gpucluster("--help")
    assert helped.code == 0
    for command in ("run", "inventory", "sandbox"):
        assert command in helped.stdout


def test_bad_inventory_is_reported_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - name: a\n    prot: 22\n  - name: a\n")
    result = gpucluster("inventory", "check", "-i", str(path))
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"gpucluster: error: {path}:3: unknown key 'prot' in host entry "
        f"(fix: did you mean 'port'?)",
        f"gpucluster: error: {path}:4: duplicate host 'a' (first defined on line 2) "
        f"(fix: remove one of them)",
    ]


def test_missing_inventory_names_all_three_places(tmp_path: Path) -> None:
    result = gpucluster("inventory", "show", cwd=str(tmp_path),
                        env={"GPUCLUSTER_INVENTORY": ""})
    assert result.code == 2
    assert "-i/--inventory" in result.stderr and "$GPUCLUSTER_INVENTORY" in result.stderr
    assert "Traceback" not in result.stderr


def test_inventory_from_environment_and_show(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts:\n  - name: gpu[01-02]\n    address: 10.0.0.[1-2]\n")
    shown = gpucluster("inventory", "show", "--json", env={"GPUCLUSTER_INVENTORY": str(path)})
    assert shown.code == 0
    assert [h["address"] for h in shown.json()["hosts"]] == ["10.0.0.1", "10.0.0.2"]
    checked = gpucluster("inventory", "check", "-i", str(path))
    assert checked.code == 0 and "2 hosts" in checked.stdout


def test_run_on_localhost_needs_no_ssh(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text("hosts: [localhost]\n")
    result = gpucluster("run", "-i", str(path), "--json", "echo hi")
    assert result.code == 0
    assert result.json()["hosts"][0]["stdout"] == "hi\n"


def test_sandbox_without_root_says_what_is_needed() -> None:
    import os

    if os.geteuid() == 0:
        result = gpucluster("sandbox", "status", "--name", "gpcnone")
        assert result.code == 2 and "no sandbox 'gpcnone'" in result.stderr
    else:
        result = gpucluster("sandbox", "up", "--name", "gpcnone")
        assert result.code == 2 and "must run as root" in result.stderr
