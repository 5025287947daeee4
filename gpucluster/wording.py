"""Small helpers for the words of messages, shared by the core and the views."""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.hostrange import spans

WARNING = "warning: "  # a progress line (on_phase) that starts so is one to heed


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`3 nodes`, `1 node`: a one-server cluster is where many users start."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def ranks_named(numbers: Iterable[int]) -> str:
    """`rank 3`, `ranks 0-2,4`: global ranks as the views name them."""
    held = sorted(numbers)
    return f"{'rank' if len(held) == 1 else 'ranks'} {spans(held)}"


def endpoint(address: str, port: int) -> str:
    """`10.0.0.1:22`, `[fd00::1]:22`: an IPv6 address in brackets, so the port stays apart."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def size(count: int) -> str:
    """Bytes in binary units, one decimal where it says something: `7.2 KiB`, `64 KiB`,
    `286.1 MiB`."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= factor:
            return f"{count / factor:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} B"


def ago(seconds: float) -> str:
    """An age in its largest whole unit: 7d, 12h, 30m, 45s."""
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length:.0f}{unit}"
    return f"{seconds:.0f}s"
