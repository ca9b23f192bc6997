"""Segment file names: the first offset of the file's address space, 20-digit zero-padded decimal."""

from __future__ import annotations

NAME_DIGITS = 20


def name_for(start_offset: int) -> str:
    return f"{start_offset:020d}"


def parse(name: str) -> int:
    """Start offset of a segment name; ValueError for anything else (temp files, .broken copies)."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        raise ValueError(f"not a segment name: {name!r}")
    return int(name)
