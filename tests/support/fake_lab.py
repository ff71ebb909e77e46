"""A lab for ``execute`` with no VM: its guest is a FakeTransport, resets are counted, every
audit passes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runner.freeze.manifest import FreezeManifest
from runner.lab.transport import GuestTransport
from runner.run.execute import run_task_derivations
from runner.run.run_dir import OpenRun
from runner.scan.guest_disk import DiskFindings
from runner.scan.scan import SecretKind
from runner.spec.task_derivation import TaskDerivation
from runner.verify.report import VerifyReport
from tests.support.fake_transport import FakeTransport

FAKE_FREEZE = "sha256:" + "0" * 64


@dataclass
class FakeLab:
    guest: FakeTransport
    proxy_port: int = 0  # any free loopback port
    resets: int = 0
    freeze: FreezeManifest | None = None  # a freeze manifest to keep in the run (none: none)

    def check(self, run: OpenRun) -> None:
        """The fake lab was provisioned and frozen for any lock."""

    def transport(self) -> GuestTransport:
        return self.guest

    def reset(self, guest: GuestTransport | None = None) -> object:
        self.resets += 1
        return None

    def audit(self, evidence: Path) -> VerifyReport:
        return VerifyReport(
            lab="fake",
            freeze_manifest_sha256=FAKE_FREEZE,
            checked_at=datetime.now(UTC),
            seconds=0.0,
            evidence=str(evidence),
            checks=("fake:guest",),
        )

    def scan_disk(
        self,
        guest: GuestTransport,
        secrets_by_kind: Mapping[SecretKind, tuple[str, ...]],
        own_bearer: str | None = None,
    ) -> DiskFindings:
        """The fake guest's disk holds nothing: one changed file scanned, clean."""
        return DiskFindings(files=1, bytes=0, leaks=(), failures=())

    def unjudged_tasks(self) -> dict[str, str]:
        return {}

    def frozen_manifests(self) -> tuple[FreezeManifest | None, bytes | None]:
        return self.freeze, None

    def tasks(self, run: OpenRun) -> tuple[TaskDerivation, ...]:
        return run_task_derivations(run)

    @contextmanager
    def package_mirror(self, resolution_file: Path) -> Iterator[Path | None]:
        """The fake lab has no package mirror."""
        yield None
