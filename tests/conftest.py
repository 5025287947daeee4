"""Before any sandbox test runs: is this a machine that can run them?

A plain `pytest` as an ordinary user runs the unit tests and reports the sandbox tests as
skipped, saying why. `scripts/test` (and so CI) sets GPUCLUSTER_TEST_SANDBOX=require: there
a missing root or a missing command fails the whole run at once, naming the package that
scripts/setup should have installed, instead of a bare exit 127 deep inside one test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# The session's shared sandbox, and a work dir with examples/train.py, for every test
from tests.sandbox import project, sandbox  # noqa: F401

SYSTEM_PACKAGES = Path(__file__).parent.parent / "scripts" / "system-packages"
REQUIRE_ENV = "GPUCLUSTER_TEST_SANDBOX"


def required_commands(manifest: Path = SYSTEM_PACKAGES) -> dict[str, str]:
    """command -> the Debian package that provides it, as scripts/setup installs them."""
    commands: dict[str, str] = {}
    for line in manifest.read_text().splitlines():
        words = line.partition("#")[0].split()
        for command in words[1:]:
            commands[command] = words[0]
    return commands


def missing_commands(commands: dict[str, str]) -> dict[str, str]:
    """The commands (a name on PATH, or an absolute path) this machine lacks."""
    def present(command: str) -> bool:
        return Path(command).exists() if command.startswith("/") else \
            shutil.which(command) is not None
    return {command: package for command, package in commands.items() if not present(command)}


def sandbox_problems() -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox needs root (network namespaces, mounts): run "
                        "scripts/test, which re-runs itself with sudo")
    missing = missing_commands(required_commands())
    if missing:
        packages = sorted(set(missing.values()))
        problems.append(
            f"missing {', '.join(sorted(missing))}: install {' '.join(packages)} with "
            f"scripts/setup (apt-get install -y {' '.join(packages)}); the list is "
            f"scripts/system-packages")
    return problems


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sandbox_tests = [item for item in items if item.get_closest_marker("sandbox")]
    if not sandbox_tests:
        return
    problems = sandbox_problems()
    if not problems:
        return
    if os.environ.get(REQUIRE_ENV) == "require":
        pytest.exit("sandbox tests cannot run: " + "; ".join(problems), returncode=1)
    skip = pytest.mark.skip(reason="sandbox test not run: " + "; ".join(problems))
    for item in sandbox_tests:
        item.add_marker(skip)
