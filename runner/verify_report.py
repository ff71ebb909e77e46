"""The result of one frozen-state audit (``runner verify``): does the guest match its freeze?"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from runner.lock import FrozenModel


class Drift(FrozenModel):
    check: str  # what was compared, e.g. "dpkg:podman", "file:/usr/local/bin/node"
    expected: str
    found: str


class VerifyReport(FrozenModel):
    schema_version: Literal[1] = 1
    freeze_manifest_sha256: str
    checked_at: datetime
    checks: int
    drifts: tuple[Drift, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.drifts
