"""CachePaths owns the host cache directory: no other code joins paths inside it.

<cache>/                         <repo>/.cache, or $FROZEN_BENCH_CACHE when set
    artifacts/
        sha256/<hex>             every artifact, named by the sha256 of its bytes
        integrity/<algo>/<hex>   an npm integrity digest -> "sha256:<hex>" of the same blob
        tmp/                     downloads and scratch work in flight
    bundles/<hex>                inputs digest -> "sha256:<hex>" of the bundle the guest deploy
                                 built from them (deploy/guest/bundles.py)
    tasks/<commit>/              a git task source checked out at the lock's commit
    apt/<suite>-<arch>/          apt's state for the guest's suite and architecture
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.core.roots import cache_root


@dataclass(frozen=True)
class CachePaths:
    root: Path

    @classmethod
    def default(cls) -> CachePaths:
        return cls(cache_root())

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def blob(self, hex_digest: str) -> Path:
        return self.artifacts / "sha256" / hex_digest

    def integrity_alias(self, algorithm: str, hex_digest: str) -> Path:
        return self.artifacts / "integrity" / algorithm / hex_digest

    @property
    def tmp(self) -> Path:
        return self.artifacts / "tmp"

    def bundle_index(self, inputs_digest: str) -> Path:
        return self.root / "bundles" / inputs_digest.removeprefix("sha256:")

    def task_checkout(self, commit: str) -> Path:
        return self.root / "tasks" / commit

    def apt_state(self, suite: str, deb_arch: str) -> Path:
        return self.root / "apt" / f"{suite}-{deb_arch}"
