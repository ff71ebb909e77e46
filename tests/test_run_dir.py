"""Opening a run directory: a new one is stamped; a resume must match lock and schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.core.errors import InputError
from runner.run.run_dir import open_run


def test_new_then_resume_with_or_without_the_lock(seed_lock_path: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = open_run(seed_lock_path, run_dir)
    assert not first.resumed
    assert first.paths.lock.read_bytes() == seed_lock_path.read_bytes()
    again = open_run(seed_lock_path, run_dir)
    assert again.resumed and again.schedule.sha256 == first.schedule.sha256
    assert open_run(None, run_dir).schedule.sha256 == first.schedule.sha256


def test_resume_with_another_lock_is_refused(seed_lock_path: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    open_run(seed_lock_path, run_dir)
    other = tmp_path / "other.toml"
    other.write_text(seed_lock_path.read_text().replace("repeats = 3", "repeats = 2"))
    with pytest.raises(InputError, match="refusing to resume with another lock"):
        open_run(other, run_dir)


def test_tampered_schedule_is_refused(seed_lock_path: Path, tmp_path: Path) -> None:
    run = open_run(seed_lock_path, tmp_path / "run")
    run.paths.schedule.write_bytes(
        run.paths.schedule.read_bytes().replace(b'"schedule_seed":54', b'"schedule_seed":55')
    )
    with pytest.raises(InputError, match="refusing to resume"):
        open_run(seed_lock_path, tmp_path / "run")


def test_resume_needs_a_recorded_lock(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no lock recorded here"):
        open_run(None, tmp_path)
