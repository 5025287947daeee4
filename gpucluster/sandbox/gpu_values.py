"""What a simulated GPU's query values become while it works, or with a clock slowdown
staged: the capture's idle values, moved as a real GPU's move (see docs/sandbox.md)."""

from __future__ import annotations

import re

from gpucluster import clock_events
from gpucluster.sandbox.gpu_load import GpuProcess

_NUMBER_WITH_UNIT = re.compile(r"^(-?[\d.]+) ?(MiB|W|%|MHz|C|ms|KiB|GiB)$")

# nvidia-smi's names of the reasons DCGM names otherwise
_REASON_FIELDS = {"clocks_setting": "applications_clocks_setting", "power_cap": "sw_power_cap",
                  "hw_thermal": "hw_thermal_slowdown", "sw_thermal": "sw_thermal_slowdown",
                  "hw_power_brake": "hw_power_brake_slowdown"}


def strip_unit(value: str) -> str:
    match = _NUMBER_WITH_UNIT.match(value)
    return match.group(1) if match else value


def loaded(values: dict[str, str], index: int, apps: list[GpuProcess],
           busy: list[int]) -> dict[str, str]:
    """The capture's idle values with this GPU's processes' memory and load on top."""
    used = sum(p.used_mib for p in apps if p.gpu == index)
    if not used and not busy[index]:
        return {}
    total = int(float(strip_unit(values["memory.total"])))
    idle_used = int(float(strip_unit(values["memory.used"])))
    memory_used = min(total, idle_used + used)
    idle_power = float(strip_unit(values["power.draw"]))
    limit = float(strip_unit(values.get("power.limit", values["power.draw"])))
    power = idle_power + (limit - idle_power) * 0.8 * busy[index] / 100
    temperature = int(strip_unit(values["temperature.gpu"])) + busy[index] * 45 // 100
    return {"utilization.gpu": f"{busy[index]} %", "memory.used": f"{memory_used} MiB",
            "memory.free": f"{total - memory_used} MiB", "temperature.gpu": str(temperature),
            "power.draw": f"{power:.2f} W", "power.draw.instant": f"{power:.2f} W",
            **memory_and_clocks(values, busy[index])}


def clock_events_of(values: dict[str, str], busy: int,
                    slowdown: str | None) -> dict[str, str]:
    """The active reasons: gpu_idle while idle (as the idle captures have it), and the
    staged slowdown, which holds a working GPU's SM clock at half its maximum (a hardware
    slowdown halves it or more) or at 80% (software's)."""
    mask = (0 if busy else clock_events.bit("gpu_idle")) | (
        clock_events.bit(slowdown) if slowdown else 0)
    shown = {"clocks_event_reasons.active": f"0x{mask:016X}"}
    for bit, name in clock_events.CLOCK_EVENTS.items():
        field = f"clocks_event_reasons.{_REASON_FIELDS.get(name, name)}"
        if field in values:
            shown[field] = "Active" if mask & bit else "Not Active"
    maximum = strip_unit(values.get("clocks.max.sm", ""))
    if busy and slowdown and maximum.isdigit():
        share = 0.5 if slowdown.startswith("hw_") else 0.8
        shown["clocks.current.sm"] = f"{int(int(maximum) * share)} MHz"
    return shown


def memory_and_clocks(values: dict[str, str], busy: int) -> dict[str, str]:
    """A working GPU boosts its SM clock to the maximum, as every loaded capture shows
    (345 to 1980 MHz on the H100 and H200), its HBM warms (8 C at full load there) and
    its memory is read or written about a tenth of the time."""
    moved = {}
    if busy and "clocks.max.sm" in values:
        moved["clocks.current.sm"] = values["clocks.max.sm"]
    idle_memory_temp = strip_unit(values.get("temperature.memory", ""))
    if idle_memory_temp.isdigit():  # N/A on GDDR boards
        moved["temperature.memory"] = str(int(idle_memory_temp) + busy * 8 // 100)
    if strip_unit(values.get("utilization.memory", "")).isdigit():
        moved["utilization.memory"] = f"{busy // 10} %"
    return moved
