"""Whole numbers as users type them, in ASCII digits. str.isdigit() alone also accepts
'²', which int() refuses (a traceback), and '١٢', which int() reads as 12."""

from __future__ import annotations


def is_number(text: str) -> bool:
    """`text` is a whole number written in ASCII digits, nothing else (no sign, no space)."""
    return text.isascii() and text.isdigit()


def ranges(text: str) -> list[tuple[int, int]] | None:
    """`0,4-7` as [(0, 0), (4, 7)]: whole numbers, single or as ranges, low before high;
    None where it is not that. Not expanded: the caller bounds them first."""
    found = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not is_number(low) or (dash and not (is_number(high) and int(high) >= int(low))):
            return None
        found.append((int(low), int(high if dash else low)))
    return found
