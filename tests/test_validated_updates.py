"""A model updated in place of pydantic's ``model_copy(update=...)`` (runner.core.models.updated):
validated at the write, and otherwise the very model ``model_copy`` gave (its JSON, fields set
and private state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.core.canonical import canonical_json
from runner.core.errors import RunnerError
from runner.core.models import updated
from runner.records.ledger import AttemptRecord, Ledger, now
from runner.report.receipt import Totals
from runner.spec.lock import load_lock
from runner.spec.resolution import load_resolution, load_resolved_lock, resolution_path
from tests.support.ledger_factory import new_run_dir

REPO = Path(__file__).resolve().parent.parent
LOCKS = sorted((REPO / "locks").glob("*.toml"))


def _record() -> AttemptRecord:
    return AttemptRecord(cell_id="c1", attempt=1, status="started", started_at=now())


def test_a_misspelled_status_and_a_negative_attempt_are_refused_at_the_write() -> None:
    record = _record()
    with pytest.raises(RunnerError) as refused:
        updated(record, status="finshed", attempt=-3)
    assert str(refused.value) == (
        "AttemptRecord update: attempt: Input should be greater than or equal to 1 "
        "(and 1 more problem)"
    )
    with pytest.raises(RunnerError, match=r"AttemptRecord update: status: Input should be "):
        updated(record, status="finshed")
    with pytest.raises(RunnerError, match="AttemptRecord update: typo: unknown field"):
        updated(record, typo=1)


def test_the_ledger_refuses_a_bad_attempt_record_and_keeps_the_one_on_disk(
    seed_lock_path: Path, tmp_path: Path
) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    ledger = Ledger(paths)
    cell = schedule.cells[0]
    ledger.begin_attempt(cell)
    before = paths.attempt(cell.id, 1).read_bytes()
    with pytest.raises(RunnerError, match="AttemptRecord update: status"):
        ledger._update_attempt(cell.id, 1, {"status": "finshed"})
    assert paths.attempt(cell.id, 1).read_bytes() == before


@pytest.mark.parametrize("lock_path", LOCKS, ids=[path.stem for path in LOCKS])
def test_an_update_gives_what_model_copy_gave(lock_path: Path) -> None:
    """Every committed lock and its resolution, each field set again to its own value: the same
    canonical JSON, the same fields set (a late field left out of the JSON stays left out)."""
    lock = load_lock(lock_path)
    models = [lock, *lock.harnesses, lock.guest, lock.tools]
    resolution_file = resolution_path(lock_path, lock)
    if resolution_file.is_file():
        resolution = load_resolution(resolution_file, lock, lock_path)
        models += [resolution, *resolution.artifacts]
    for model in models:
        for name in type(model).model_fields:
            value = getattr(model, name)
            copied = model.model_copy(update={name: value})
            again = updated(model, **{name: value})
            assert canonical_json(again) == canonical_json(copied) == canonical_json(model)
            assert again.model_fields_set == copied.model_fields_set, (type(model), name)


def test_an_update_keeps_the_private_state_and_takes_a_field_by_its_name() -> None:
    lock = load_resolved_lock(REPO / "locks" / "demo.toml")
    narrowed = lock.for_model(lock.models[0].id)
    assert narrowed.models == lock.models[:1]
    assert narrowed.environment_fingerprint == lock.environment_fingerprint
    totals = Totals(
        cells=1, passed=1, failed=0, indeterminate=0, wall_seconds=1.0, provider_tokens=None,
        token_cells_returned=0, physical_posts=2, logical_attempts=2, extra_posts=0,
    )  # fmt: skip
    more = updated(totals, unattributed_provider_post_requests=3)
    assert more.model_dump(by_alias=True)["extra_posts"] == 3
