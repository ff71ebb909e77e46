"""Nearest available version: what a fail-closed line suggests instead of a missing pin."""

from __future__ import annotations

import re
from collections.abc import Iterable

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+.*)?$")


def _numbers(version: str) -> tuple[int, int, int] | None:
    match = _SEMVER.match(version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def nearest_version(wanted: str, available: Iterable[str]) -> str | None:
    """The release closest to ``wanted``: same major first, then same minor, then patch distance.

    Pre-releases are only offered when the wanted version is one or nothing else exists. Ties go
    to the newer version (it is the one a person would move to).
    """
    target = _numbers(wanted)
    candidates = [v for v in available if _numbers(v) is not None]
    if target is None or not candidates:
        return None
    releases = [v for v in candidates if "-" not in v.split("+")[0]]
    if releases and "-" not in wanted:
        candidates = releases

    def distance(version: str) -> tuple[int, int, int, tuple[int, int, int]]:
        numbers = _numbers(version)
        assert numbers is not None
        gaps = tuple(abs(a - b) for a, b in zip(numbers, target, strict=True))
        negated = (-numbers[0], -numbers[1], -numbers[2])
        return (gaps[0], gaps[1], gaps[2], negated)

    return min(candidates, key=distance)
