"""What a resolver section found: artifacts to fetch, and lines for what its source lacks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.artifacts.fetch import Wanted
from runner.spec.resolution import ArtifactKind


@dataclass(frozen=True)
class Planned:
    """An artifact chosen by a resolver, not yet fetched."""

    kind: ArtifactKind
    name: str
    version: str
    wanted: Wanted
    harnesses: tuple[str, ...] = ()
    suite: str | None = None  # deb: the suite of the lock's archive it comes from
    images: tuple[str, ...] = ()  # base-deb: the built base images (BaseRecipe ids) it is in


@dataclass(frozen=True)
class PlannedTree:
    """A harness's npm lockfile, as npm wrote it."""

    harness: str
    sources: tuple[str, ...]
    lockfile: bytes
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    planned: list[Planned] = field(default_factory=list)
    trees: list[PlannedTree] = field(default_factory=list)
    # One line per artifact the sources do not have: "<artifact>: <what is wrong>".
    unavailable: list[str] = field(default_factory=list)

    def merge(self, other: Plan) -> None:
        self.planned.extend(other.planned)
        self.trees.extend(other.trees)
        self.unavailable.extend(other.unavailable)
