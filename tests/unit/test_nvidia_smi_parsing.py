"""nvidia-smi parsers against every real capture, and the awkward forms drivers print."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.doctor import nvidia_smi
from gpucluster.sandbox import captures

FIXTURES = Path(__file__).resolve().parents[2] / "gpucluster" / "sandbox" / "captures"

# What each capture file says (read off its `-q` section by hand).
EXPECTED = {
    "nvidia-h100-80gb-hbm3": ("NVIDIA H100 80GB HBM3", "590.48.01", "13.1", 81559, True, True,
                              False),
    "nvidia-h100-mig": ("NVIDIA H100 80GB HBM3", "590.48.01", "13.1", 81559, True, True, True),
    "nvidia-h200": ("NVIDIA H200", "590.48.01", "13.1", 143771, True, True, False),
    "nvidia-l40s": ("NVIDIA L40S", "595.80", "13.2", 46068, True, False, None),
    "nvidia-geforce-rtx-2080-super": ("NVIDIA GeForce RTX 2080 SUPER", "595.71.05", "13.2",
                                      8192, None, False, None),
    "nvidia-geforce-rtx-4080-super": ("NVIDIA GeForce RTX 4080 SUPER", "595.71.05", "13.2",
                                      16376, None, False, None),
}


def _capture(model: str) -> captures.Capture:
    path = next(FIXTURES.glob(f"*__{model}__*.txt"))
    return captures.Capture(model, path.stem.split("__")[2],
                            captures._split_sections(path.read_text()))


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_every_capture_parses_as_the_file_says(model: str) -> None:
    name, driver, cuda, memory, ecc, persistence, mig = EXPECTED[model]
    capture = _capture(model)
    for state in ("idle", "load"):
        (gpu,) = nvidia_smi.parse_gpus(capture.section(state, "query-gpu"))
        assert (gpu.index, gpu.name, gpu.driver, gpu.memory_total_mib) == (0, name, driver,
                                                                           memory)
        assert (gpu.ecc_enabled, gpu.persistence, gpu.mig_enabled) == (ecc, persistence, mig)
        assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    versions = nvidia_smi.parse_versions(capture.section("capabilities", "version"))
    assert versions == nvidia_smi.DriverVersions(driver, cuda)
    assert nvidia_smi.parse_versions(capture.section("idle", "query (-q)")) == versions
    assert nvidia_smi.parse_versions(capture.section("idle", "nvidia-smi (default")) == versions
    for process in nvidia_smi.parse_processes(capture.section("load", "query-compute-apps")):
        assert process.pid > 0 and process.name and process.bus_id


def test_compute_apps_idle_and_under_load() -> None:
    idle = _capture("nvidia-h100-80gb-hbm3").section("idle", "query-compute-apps")
    assert nvidia_smi.parse_processes(idle) == []
    desktop = _capture("nvidia-geforce-rtx-4080-super").section("idle", "query-compute-apps")
    assert [(p.name, p.used_mib) for p in nvidia_smi.parse_processes(desktop)] == [
        ("/usr/bin/kwin_wayland", 25)]
    processes = nvidia_smi.parse_processes(_capture("nvidia-h100-80gb-hbm3").section(
        "load", "query-compute-apps"))
    assert [(p.pid, p.name, p.used_mib) for p in processes] == [
        (11327, "/root/tools/memhog", 2566), (11328, "/root/tools/memhog", 1542),
        (11345, "./gpu_burn", 15690)]


@pytest.mark.parametrize("raw", ["[N/A]", "N/A", "[Requested functionality has been deprecated]",
                                 "[Not Supported]", "", "  "])
def test_placeholders_are_none(raw: str) -> None:
    assert nvidia_smi.value(raw) is None
    assert nvidia_smi.number(raw) is None
    assert nvidia_smi.flag(raw) is None


def test_units_with_and_without_nounits() -> None:
    with_units = "index, memory.total [MiB], power.draw [W]\n0, 81559 MiB, 35.50 W\n"
    without = "index, memory.total, power.draw\n0, 81559, 35.50\n"
    for text in (with_units, without):
        (gpu,) = nvidia_smi.parse_gpus(text)
        assert gpu.memory_total_mib == 81559


def test_extra_missing_and_reordered_columns() -> None:
    text = ("name, some.future.field, index, persistence_mode\n"
            "NVIDIA A100-SXM4-80GB, 7, 1, Disabled\nNVIDIA A100-SXM4-80GB, 7, 0, Enabled\n")
    gpus = nvidia_smi.parse_gpus(text)
    assert [g.index for g in gpus] == [0, 1]
    assert [g.persistence for g in gpus] == [True, False]
    assert gpus[0].driver is None and gpus[0].memory_total_mib is None  # not asked


def test_clock_event_reasons_under_either_name() -> None:
    capture = _capture("nvidia-h100-80gb-hbm3")
    idle, load = (nvidia_smi.parse_gpus(capture.section(s, "query-gpu"))[0]
                  for s in ("idle", "load"))
    assert (idle.clock_events, load.clock_events) == (0x1, 0x0)  # gpu_idle; nothing
    older = "index, clocks_throttle_reasons.active\n0, 0x0000000000000040\n1, [N/A]\n"
    assert [g.clock_events for g in nvidia_smi.parse_gpus(older)] == [0x40, None]


def test_per_field_blocks_are_merged_by_index() -> None:
    # What the probe prints when a combined query failed on an older driver.
    text = ("index, name\n0, Tesla V100\n1, Tesla V100\n"
            "index, fabric.state\n"
            "index, retired_pages.pending\n0, No\n1, Yes\n")
    gpus = nvidia_smi.parse_gpus(text)
    assert [(g.name, g.retired_pages_pending, g.fabric_state) for g in gpus] == [
        ("Tesla V100", False, None), ("Tesla V100", True, None)]


def test_empty_and_error_output() -> None:
    assert nvidia_smi.parse_gpus("") == []
    failure = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n")
    assert nvidia_smi.parse_gpus(failure) == []
    assert nvidia_smi.driver_failure(failure, 9).startswith("NVIDIA-SMI has failed")
    assert nvidia_smi.driver_failure("index, name\n0, X\n", 0) is None
    assert nvidia_smi.driver_failure("Segmentation fault\n", 139) == "Segmentation fault"
    assert nvidia_smi.driver_failure("", 255) == "nvidia-smi exited with 255"


def test_driver_610_renamed_version_fields() -> None:
    text = ("NVIDIA-SMI version  : 610.12\nNVML version        : 610.12\n"
            "KMD Version         : 610.12.03\nCUDA UMD Version    : 13.4\n")
    assert nvidia_smi.parse_versions(text) == nvidia_smi.DriverVersions("610.12.03", "13.4")
    table = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |"
    assert nvidia_smi.parse_versions(table) == nvidia_smi.DriverVersions("550.54.15", "12.4")
