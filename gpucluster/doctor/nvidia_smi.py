"""Parsers for nvidia-smi output, tolerant of what real drivers print.

Handles `[N/A]`, bare `N/A`, `[Requested functionality has been deprecated]`,
`[Not Supported]`, values with or without units (`nounits`), extra and missing columns
(columns are matched by header name), several CSV blocks (one per field, when a combined
query failed on an older driver), empty output, and the renamed version fields of
drivers 610+ (`KMD Version`, `CUDA UMD Version`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

# What holds the clocks down: every driver takes the old name (one from 535 on may head
# its column with the new one)
THROTTLE_REASONS, EVENT_REASONS = "clocks_throttle_reasons.active", "clocks_event_reasons.active"
# The fields doctor queries, all known to --query-gpu since the 5xx drivers; an older
# driver that lacks one fails the combined query, and the probe asks field by field.
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total",
    "persistence_mode", "mig.mode.current", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "fabric.state", "fabric.status",
    THROTTLE_REASONS,
)
APP_FIELDS = ("gpu_bus_id", "pid", "process_name", "used_gpu_memory")
DRIVER_FAILURE_MARKERS = (
    "couldn't communicate with the NVIDIA driver",
    "NVIDIA-SMI has failed",
    "No devices were found",
    "Driver/library version mismatch",
)
_MISSING = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Requested functionality has been "
                      r"deprecated|Insufficient Permissions|GPU requires reset)\]?$", re.I)
_UNIT_SUFFIX = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|W|%|MHz|C|ms|bytes)?$")
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it; None where the driver reports nothing."""

    index: int
    name: str | None
    uuid: str | None
    bus_id: str | None
    driver: str | None
    memory_total_mib: int | None
    persistence: bool | None
    mig_enabled: bool | None
    ecc_enabled: bool | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    retired_pages_pending: bool | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    fabric_state: str | None
    fabric_status: str | None
    clock_events: int | None = None  # bitmask: gpucluster.clock_events


@dataclass(frozen=True)
class DriverVersions:
    driver: str | None
    cuda: str | None  # the newest CUDA the driver supports


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    bus_id: str | None
    used_mib: int | None


def value(raw: str | None) -> str | None:
    """A cell with N/A-like placeholders turned into None."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or _MISSING.match(text):
        return None
    return text


def number(raw: str | None) -> int | None:
    """`81559 MiB`, `81559`, `35.5 W` -> the integer part; None when not a number."""
    text = value(raw)
    if text is None:
        return None
    match = _UNIT_SUFFIX.match(text)
    return int(float(match.group(1))) if match else None


def bitmask(raw: str | None) -> int | None:
    """`0x0000000000000040` -> 64."""
    text = value(raw)
    try:
        return int(text, 16) if text is not None else None
    except ValueError:
        return None


def flag(raw: str | None) -> bool | None:
    """Enabled/Disabled, Yes/No, Active/Not Active, 1/0 -> bool."""
    text = value(raw)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("enabled", "yes", "active", "1", "true", "on"):
        return True
    if lowered in ("disabled", "no", "not active", "0", "false", "off"):
        return False
    return None


def parse_csv_blocks(text: str) -> list[list[dict[str, str]]]:
    """Every CSV block (a header line, then rows) as rows keyed by unit-less header name."""
    blocks: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    lines = [line for line in text.splitlines() if line.strip()]
    for raw_cells in csv.reader(lines, skipinitialspace=True):
        cells = [c.strip() for c in raw_cells]
        if cells and _looks_like_header(cells):
            header = [_HEADER_UNIT.sub("", c) for c in cells]
            blocks.append([])
            continue
        if header is None or not blocks:
            continue  # rows before any header: error text, not data
        blocks[-1].append(dict(zip(header, cells, strict=False)))
    return blocks


def _looks_like_header(cells: list[str]) -> bool:
    known = {*QUERY_FIELDS, *APP_FIELDS, EVENT_REASONS, "timestamp", "gpu_name", "gpu_uuid",
             "gpu_serial",
             "count", "serial"}
    return any(_HEADER_UNIT.sub("", c) in known for c in cells)


def parse_gpus(text: str) -> list[Gpu]:
    """GPUs from `--query-gpu=...--format=csv[,nounits]`, merging per-field blocks by index."""
    merged: dict[int, dict[str, str]] = {}
    for block in parse_csv_blocks(text):
        for position, row in enumerate(block):
            index = number(row.get("index"))
            key = index if index is not None else position
            merged.setdefault(key, {}).update(row)
    return [_gpu(index, row) for index, row in sorted(merged.items())]


def _gpu(index: int, row: dict[str, str]) -> Gpu:
    return Gpu(
        index=index,
        name=value(row.get("name")),
        uuid=value(row.get("uuid")),
        bus_id=value(row.get("pci.bus_id")),
        driver=value(row.get("driver_version")),
        memory_total_mib=number(row.get("memory.total")),
        persistence=flag(row.get("persistence_mode")),
        mig_enabled=flag(row.get("mig.mode.current")),
        ecc_enabled=flag(row.get("ecc.mode.current")),
        ecc_uncorrected_volatile=number(row.get("ecc.errors.uncorrected.volatile.total")),
        ecc_uncorrected_aggregate=number(row.get("ecc.errors.uncorrected.aggregate.total")),
        retired_pages_pending=flag(row.get("retired_pages.pending")),
        remapped_rows_pending=flag(row.get("remapped_rows.pending")),
        remapped_rows_failure=flag(row.get("remapped_rows.failure")),
        fabric_state=value(row.get("fabric.state")),
        fabric_status=value(row.get("fabric.status")),
        clock_events=bitmask(row.get(EVENT_REASONS, row.get(THROTTLE_REASONS))),
    )


def parse_versions(text: str) -> DriverVersions:
    """From `nvidia-smi --version`, `-q` or the default table; 610+ names included."""
    driver = re.search(r"(?:DRIVER version|Driver Version|KMD Version)\s*:\s*([\d.]+)", text)
    cuda = re.search(r"(?:CUDA UMD Version|CUDA Version)\s*:\s*([\d.]+)", text)
    return DriverVersions(driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def parse_processes(text: str) -> list[GpuProcess]:
    """Compute processes from `--query-compute-apps=gpu_bus_id,pid,process_name,used_memory`."""
    processes = []
    for block in parse_csv_blocks(text):
        for row in block:
            pid = number(row.get("pid"))
            if pid is None:
                continue
            processes.append(GpuProcess(pid, value(row.get("process_name")) or "?",
                                        value(row.get("gpu_bus_id")),
                                        number(row.get("used_gpu_memory"))))
    return processes


def driver_failure(output: str, exit_code: int) -> str | None:
    """The driver's complaint when nvidia-smi could not talk to it; None when it could."""
    for marker in DRIVER_FAILURE_MARKERS:
        if marker in output:
            return next(line.strip() for line in output.splitlines() if marker in line)
    if exit_code != 0:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        return lines[0] if lines else f"nvidia-smi exited with {exit_code}"
    return None
