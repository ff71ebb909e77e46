"""The schedule: 54 cells for the reference lock, balanced positions, the same bytes every time."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from runner.records.schedule import Schedule, build_schedule, is_balanced, position_counts
from runner.spec.lock import load_lock


def test_reference_schedule_shape(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    assert len(schedule.cells) == 54
    assert [len(batch.cells) for batch in schedule.batches] == [27, 27]
    assert len({cell.id for cell in schedule.cells}) == 54
    for batch in schedule.batches:
        assert batch.lock_fingerprint == lock.for_model(batch.model).fingerprint
        assert Counter(cell.harness for cell in batch.cells) == {
            "bare-pi": 9,
            "openpi": 9,
            "omp": 9,
        }
        assert is_balanced(batch, 3)
        for counter in position_counts(batch, 3).values():
            assert counter == {0: 3, 1: 3, 2: 3}
        # every (task, repeat) block holds each harness once, contiguously
        for start in range(0, 27, 3):
            block = batch.cells[start : start + 3]
            assert len({(c.task, c.repeat) for c in block}) == 1
            assert {c.harness for c in block} == {"bare-pi", "openpi", "omp"}
    assert schedule.batches[0].lock_fingerprint != schedule.batches[1].lock_fingerprint


def test_seed_shuffles_task_order(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    orders = {
        tuple(
            dict.fromkeys(
                c.task
                for c in build_schedule(lock.model_copy(update={"schedule_seed": seed}))
                .batches[0]
                .cells
                if c.repeat == 1
            )
        )
        for seed in range(12)
    }
    assert len(orders) > 1


def test_cell_ids_name_every_coordinate(seed_lock_path: Path) -> None:
    cell = build_schedule(load_lock(seed_lock_path)).cells[0]
    assert cell.id == f"{cell.batch}-001-{cell.task}-r{cell.repeat}-{cell.harness}"


def test_same_lock_same_bytes_and_hash(seed_lock_path: Path, tmp_path: Path) -> None:
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / f"{run}.json"
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                "from runner.cli.main import main; main()",
                "schedule",
                str(seed_lock_path),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "54 cells written" in result.stdout
        outputs.append((out.read_bytes(), result.stdout.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1]
    data, hash_line = outputs[0]
    schedule = Schedule.model_validate_json(data)
    assert hash_line == f"schedule sha256: {schedule.sha256}"
    import hashlib

    assert schedule.sha256 == "sha256:" + hashlib.sha256(data).hexdigest()
