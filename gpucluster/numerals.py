"""Whole numbers as users type them, in ASCII digits. str.isdigit() alone also accepts
'²', which int() refuses (a traceback), and '١٢', which int() reads as 12."""

from __future__ import annotations


def is_number(text: str) -> bool:
    """`text` is a whole number written in ASCII digits, nothing else (no sign, no space)."""
    return text.isascii() and text.isdigit()
