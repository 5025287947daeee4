"""The wheel as a user installs it: everything the package reads from disk is inside."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_an_installed_wheel_has_its_templates_example_and_licence(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=180)
    wheel = next((tmp_path / "dist").glob("gpucluster-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for inside in ("gpucluster/inventory.example.yaml", "gpucluster/examples/train.py",
                   "gpucluster/templates/doctor/probe.sh.j2"):
        assert inside in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=180)
    elsewhere = tmp_path / "elsewhere"  # no source checkout around it
    elsewhere.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpucluster", *args], cwd=elsewhere,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)},
                              capture_output=True, text=True, timeout=60, check=False)

    where = subprocess.run([sys.executable, "-c", "import gpucluster; print(gpucluster.__file__)"],
                           env={"PYTHONPATH": str(target)}, capture_output=True, text=True,
                           check=True, cwd=elsewhere)
    assert where.stdout.startswith(str(target)), "the wheel, not the checkout, is under test"
    example = cli("inventory", "example")
    assert example.returncode == 0, example.stderr
    assert example.stdout == (ROOT / "inventory.example.yaml").read_text()
    (elsewhere / "inventory.yaml").write_text(example.stdout)
    checked = cli("inventory", "check")
    assert checked.returncode == 0 and "OK, 8 hosts" in checked.stdout, checked.stderr
    (elsewhere / "inventory.yaml").unlink()
    missing = cli("inventory", "check")
    assert missing.returncode == 2
    assert "gpucluster inventory example > inventory.yaml" in missing.stderr
