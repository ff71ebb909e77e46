"""The result of one frozen-state audit (``runner verify``): does the guest match its freeze?"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from runner.core.models import FrozenModel


class Drift(FrozenModel):
    check: str  # what was compared, e.g. "dpkg:podman", "file:/usr/local/bin/node"
    expected: str
    found: str

    @property
    def line(self) -> str:
        return f"{self.check}: expected {self.expected}, found {self.found}"


class VerifyReport(FrozenModel):
    LATE_FIELDS = frozenset({"disk_paths", "disk_seconds"})

    schema_version: Literal[1] = 1
    lab: str
    freeze_manifest_sha256: str
    checked_at: datetime
    seconds: float
    # The ansible-runner private data dir of the audit: playbook, inventory, and its job events
    # (artifacts/<ident>/job_events/*.json), the evidence every check and drift comes from.
    evidence: str
    checks: tuple[str, ...]  # every check that ran, "<category>:<item>"
    drifts: tuple[Drift, ...] = ()
    # The disk read on the host (runner.verify.disk): paths compared, and the seconds it took
    # (None: the disk was not audited, as in the host's own audit of the tests).
    disk_paths: int = 0
    disk_seconds: float | None = None

    @property
    def passed(self) -> bool:
        return not self.drifts
