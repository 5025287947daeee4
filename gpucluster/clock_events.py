"""NVML's clock event reasons: the bitmask nvidia-smi reports as
`clocks_event_reasons.active` (`clocks_throttle_reasons.active` before driver 535, a name
newer drivers still take), which says what holds a GPU's clocks below what it asks for.
Named as DCGM exporter names them (its `clock_event` label). No imports: the sandbox's
simulated nvidia-smi uses it too, and starts on every call."""

from __future__ import annotations

CLOCK_EVENTS = {
    0x1: "gpu_idle", 0x2: "clocks_setting", 0x4: "power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# What slows a working GPU for a reason outside the job (heat, the power supply, the
# board): a straggler's cause. Running at the power cap is how a busy GPU works.
SLOWDOWNS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# What a user does about each, for top's summary line
REMEDIES = {
    "hw_thermal": "too hot: check the node's cooling and airflow",
    "sw_thermal": "too hot: check the node's cooling and airflow",
    "hw_power_brake": "the power supply applied its brake: check the node's PSUs",
    "hw_slowdown": "heat or power: `nvidia-smi -q -d PERFORMANCE` on the node says which",
}
# What `sandbox up --clock-slowdown` stages
STAGEABLE = (*SLOWDOWNS, "power_cap")


def names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENTS.items() if mask & bit]


def bit(name: str) -> int:
    return next(b for b, n in CLOCK_EVENTS.items() if n == name)


def slowdowns(mask: int | None) -> list[str]:
    return [n for n in names(mask) if n in SLOWDOWNS] if mask is not None else []
