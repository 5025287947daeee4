"""Small helpers for the words of messages, shared by the core and the views."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`3 nodes`, `1 node`: a one-server cluster is where many users start."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
