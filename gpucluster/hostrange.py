"""Host ranges as HPC people write them: `gpu[01-16]`, `node[1-4,7]`, `r[1-2]n[1-3]`.

`expand` turns a pattern into names (zero padding kept); `fold` does the reverse for
display, grouping names that differ only in one trailing number.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from typing import TypeVar

from gpucluster.errors import GpuclusterError, HostRangeError
from gpucluster.numerals import is_number

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_MAX_EXPANSION = 100_000  # a typo like node[1-999999999] must not eat the memory
_TOO_MANY = f"at most {_MAX_EXPANSION:,} hosts; is a digit extra?"
K = TypeVar("K", bound=Hashable)


def _expand_set(body: str, pattern: str) -> list[str]:
    """`01-03,7` -> ['01', '02', '03', '7']; the width of the lower bound is kept."""
    values: list[str] = []
    for raw_part in body.split(","):
        part = raw_part.strip()
        if not part:
            raise HostRangeError(f"empty element in host range {pattern!r}",
                                 "remove the extra comma")
        if "-" in part:
            low, _, high = part.partition("-")
            if not (is_number(low) and is_number(high)):
                raise HostRangeError(
                    f"bad range {part!r} in {pattern!r}", "digits, like [01-16]"
                )
            if int(low) > int(high):
                raise HostRangeError(f"range {part!r} in {pattern!r} goes backwards",
                                     f"[{high}-{low}]")
            if len(values) + int(high) - int(low) >= _MAX_EXPANSION:
                raise HostRangeError(f"host range {pattern!r} expands to too many names", _TOO_MANY)
            width = len(low) if low.startswith("0") else 0
            values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
        elif is_number(part):
            values.append(part)
        else:
            raise HostRangeError(f"bad element {part!r} in {pattern!r}",
                                 "digits, like [1,3,5-8]")
        if len(values) > _MAX_EXPANSION:
            raise HostRangeError(f"host range {pattern!r} expands to too many names", _TOO_MANY)
    return values


def expand(pattern: str) -> list[str]:
    """Expand every bracket group of `pattern`, left to right, in order."""
    if "[" not in pattern and "]" not in pattern:
        return [pattern]
    match = _BRACKET.search(pattern)
    if match is None:
        raise HostRangeError(f"unbalanced brackets in host range {pattern!r}",
                             "close each [ with ], e.g. node[1-4]")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    if "[" in head or "]" in head:
        raise HostRangeError(f"unbalanced brackets in host range {pattern!r}",
                             "close each [ with ], e.g. node[1-4]")
    values, rests = _expand_set(match.group(1), pattern), expand(tail)
    if len(values) * len(rests) > _MAX_EXPANSION:  # counted before anything is built
        raise HostRangeError(f"host range {pattern!r} expands to too many names", _TOO_MANY)
    return [head + value + rest for value in values for rest in rests]


def hosts_option(patterns: str) -> list[str]:
    """A `--hosts` value's names, in order; a typo, or a value naming nothing (`-w
    "$NODES"` with the variable unset: never "every host"), is a one-line error."""
    try:
        wanted = expand_list(patterns)
    except HostRangeError as error:
        raise GpuclusterError(f"--hosts {patterns!r}: {error.reason} (fix: {error.fix})"
                              ) from None
    if not wanted:
        raise GpuclusterError(f"--hosts {patterns!r} names no host (fix: a host list such as "
                              f"node[1-2], or no --hosts for every host)")
    return wanted


def expand_list(patterns: str) -> list[str]:
    """Expand a comma-separated list of patterns (`gpu[01-04],login1`), keeping order."""
    names: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(patterns + ","):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            piece = patterns[start:i].strip()
            if piece:
                names.extend(expand(piece))
            start = i + 1
    if depth != 0:  # else `node[1-` was never a piece of its own, and named no host
        raise HostRangeError(f"unbalanced brackets in host range {patterns!r}",
                             "close each [ with ], e.g. node[1-4]")
    return list(dict.fromkeys(names))


_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def spans(numbers: list[int], width: int = 0) -> str:
    """Sorted [1, 2, 3, 7] -> '1-3,7', each number padded to `width`."""
    found: list[str] = []
    run_start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        low, high = str(run_start).zfill(width), str(previous).zfill(width)
        found.append(low if run_start == previous else f"{low}-{high}")
        if number is not None:
            run_start = previous = number
    return ",".join(found)


def fold(names: Iterable[str]) -> str:
    """Fold names into range form: node1,node2,node3,gpu07 -> gpu07,node[1-3]."""
    plain: list[str] = []
    # (prefix, suffix) -> {width: numbers}; width 0 means "written without padding".
    numbered: dict[tuple[str, str], dict[int, list[int]]] = {}
    for name in dict.fromkeys(names):
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.append(name)
            continue
        prefix, digits, suffix = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        numbered.setdefault((prefix, suffix), {}).setdefault(width, []).append(int(digits))
    parts = list(plain)
    for (prefix, suffix), by_width in numbered.items():
        # gpu09 and gpu10 belong together: an unpadded number as wide as a padded
        # group joins it.
        for width in [w for w in by_width if w]:
            fits = [n for n in by_width.get(0, []) if len(str(n)) == width]
            by_width[width].extend(fits)
            by_width[0] = [n for n in by_width.get(0, []) if n not in fits]
        for width, unsorted in by_width.items():
            if not unsorted:
                continue
            numbers = sorted(set(unsorted))
            if len(numbers) == 1:
                parts.append(f"{prefix}{str(numbers[0]).zfill(width)}{suffix}")
            else:
                parts.append(f"{prefix}[{spans(numbers, width)}]{suffix}")
    return ",".join(sorted(parts))


def hosts_by(pairs: Iterable[tuple[K, str]]) -> dict[K, list[str]]:
    """(what, host) pairs -> what -> its hosts, in order of first appearance: what many
    nodes share, said once for a folded host list."""
    grouped: dict[K, list[str]] = {}
    for key, host in pairs:
        grouped.setdefault(key, []).append(host)
    return grouped
