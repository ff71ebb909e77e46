"""Builds ledger lines and run directories for tests from a schedule and published totals."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runner.core.canonical import canonical_json
from runner.core.files import write_atomic
from runner.records.ledger import LedgerLine, cell_coordinates, unattributed_provider_post_requests
from runner.records.paths import RunPaths
from runner.records.schedule import Cell, Schedule, build_schedule
from runner.spec.lock import load_lock

START = datetime(2026, 5, 29, 12, 0, tzinfo=UTC)


def line_for(
    cell: Cell,
    *,
    outcome: str = "pass",
    wall: float = 10.0,
    tokens: int | None = 100,
    posts: int = 2,
    attempts: int = 2,
    attempt: int = 1,
) -> LedgerLine:
    started = START + timedelta(minutes=cell.position)
    return LedgerLine(
        **cell_coordinates(cell),
        attempt=attempt,
        outcome=outcome,  # type: ignore[arg-type]
        reason={"pass": "reward 1", "fail": "reward 0"}.get(outcome, "deadline passed"),
        started_at=started,
        ended_at=started + timedelta(seconds=wall),
        wall_seconds=wall,
        provider_tokens=tokens,
        physical_posts=posts,
        logical_attempts=attempts,
        unattributedProviderPostRequests=unattributed_provider_post_requests(posts, attempts),
    )


def new_run_dir(lock_path: Path, run_dir: Path) -> tuple[RunPaths, Schedule]:
    paths = RunPaths(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock_path, paths.lock)
    schedule = build_schedule(load_lock(lock_path))
    write_atomic(paths.schedule, canonical_json(schedule))
    return paths, schedule


def split(total: float, parts: int, *, integer: bool) -> list[float]:
    """``total`` over ``parts`` cells; the remainder goes to the first cell."""
    if integer:
        whole = int(total) // parts
        return [whole + (int(total) - whole * parts if i == 0 else 0) for i in range(parts)]
    share = round(total / parts, 3)
    return [round(total - share * (parts - 1), 3) if i == 0 else share for i in range(parts)]
