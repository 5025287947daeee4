"""launch --debug's variables (templates/launch/_debug_env.sh.j2), run by a real shell
against a stand-in for the job's python that reports a torch version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpucluster.templating import render

OLD_NAMES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def debug_env(tmp_path: Path, torch: str | None, image: bool = False,
              **job_env: str) -> dict[str, str]:
    """The environment the job gets on a node whose python has `torch` (None: none)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + (f"echo {torch}\n" if torch else "exit 1\n"))
    python.chmod(0o755)
    script = render("launch/_debug_env.sh.j2", distributed_debug="INFO",
                    torch_python=None if image else str(python))
    base = {"PATH": os.environ["PATH"], "GPC_JOB_DIR": str(tmp_path / "job")}
    done = subprocess.run(["sh", "-c", script + "\nenv"], env={**base, **job_env},
                          capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


@pytest.mark.parametrize("torch", ["2.9.0", "2.13.0+cpu", "2.10.1+cu128", "3.0.0"])
def test_a_torch_that_knows_the_flight_recorders_new_names_gets_only_those(
        tmp_path: Path, torch: str) -> None:
    env = debug_env(tmp_path, torch)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/job/flight-recorder/rank_"
    assert not set(OLD_NAMES) & set(env)  # it would warn once per rank about them


@pytest.mark.parametrize("torch", ["2.8.0", "2.5.1+cu124", "1.13.1", None])
def test_an_older_or_unknown_torch_gets_the_old_names_too(tmp_path: Path,
                                                         torch: str | None) -> None:
    env = debug_env(tmp_path, torch)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
        f"{tmp_path}/job/flight-recorder/rank_"


def test_in_an_image_torch_is_not_asked_and_both_names_are_set(tmp_path: Path) -> None:
    env = debug_env(tmp_path, "2.13.0", image=True)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "2000"


def test_the_jobs_own_value_under_the_old_name_wins_over_the_default(
        tmp_path: Path) -> None:
    """Current torch reads TORCH_FR_* first: a default there would hide the job's."""
    env = debug_env(tmp_path, "2.13.0", TORCH_NCCL_TRACE_BUFFER_SIZE="500",
                    TORCH_NCCL_DEBUG_INFO_TEMP_FILE="/scratch/fr_")
    assert env["TORCH_FR_BUFFER_SIZE"] == "500" and env["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/fr_"
    env = debug_env(tmp_path, "2.13.0", TORCH_FR_BUFFER_SIZE="64")
    assert env["TORCH_FR_BUFFER_SIZE"] == "64"
