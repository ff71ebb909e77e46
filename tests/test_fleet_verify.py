"""A fleet run's final verify: each batch audits the lab it ended on; the receipt's verdict is
"passed" only when every batch has its final audit and none drifted."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner.core.files import write_model
from runner.core.roots import REPO_ROOT
from runner.records.paths import RunPaths
from runner.records.schedule import build_schedule
from runner.report.evidence import verify_state
from runner.spec.lock import load_lock
from runner.verify.report import Drift, VerifyReport

SCHEDULE = build_schedule(load_lock(REPO_ROOT / "locks" / "demo-fleet.toml"))


def audit(paths: RunPaths, host: str, batch: str, drifted: bool = False) -> None:
    report = VerifyReport(
        lab=f"lab-{host}",
        freeze_manifest_sha256="sha256:" + "0" * 64,
        checked_at=datetime.now(UTC),
        seconds=1.0,
        evidence="elsewhere",
        checks=("dpkg:podman",),
        drifts=(Drift(check="dpkg:podman", expected="a", found="b"),) if drifted else (),
    )
    write_model(paths.host_verify(host, "final", batch), report)


@pytest.mark.parametrize(
    ("finals", "state"),
    [
        ((), "missing"),
        ((("a", "reference", False),), "missing"),  # batch wrong has none
        ((("a", "reference", False), ("b", "wrong", False)), "passed"),
        ((("a", "reference", False), ("a", "wrong", False)), "passed"),  # both ended on a
        ((("a", "reference", False), ("b", "wrong", True)), "failed"),
    ],
)
def test_every_batch_needs_a_passing_final_audit(tmp_path: Path, finals, state):  # type: ignore[no-untyped-def]
    paths = RunPaths(tmp_path)
    for host, batch, drifted in finals:
        audit(paths, host, batch, drifted)
    assert verify_state(paths, SCHEDULE) == state
