"""Picking named things (doctor checks, provision steps) with --only / --skip lists."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from gpucluster.errors import GpuclusterError


def comma_list(value: str | None, option: str) -> list[str] | None:
    """`a, b,,c` -> ['a', 'b', 'c']; None when the option was not given. Given with no
    name in it (`--only "$STEPS"`, the variable unset) is an error: taken for not given,
    `provision --only ''` ran every step, the firewall's included."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise GpuclusterError(f"{option} {value!r} names nothing (fix: give names separated "
                              f"by commas, or leave {option} out)")
    return names


def select(known: Sequence[str], only: Sequence[str] | None, skip: Sequence[str] | None,
           what: str) -> list[str]:
    """The known names to use, in their own order; an unknown name is an error that
    lists the known ones."""
    unknown = [n for n in [*(only or []), *(skip or [])] if n not in known]
    if unknown:
        guesses = [g for n in unknown for g in difflib.get_close_matches(n, known, n=1)]
        fix = f" (fix: did you mean {', '.join(guesses)}?)" if guesses else ""
        raise GpuclusterError(f"unknown {what} {', '.join(unknown)}; known: "
                              f"{', '.join(known)}{fix}")
    wanted = set(only) if only else set(known)
    return [n for n in known if n in wanted and n not in set(skip or [])]
