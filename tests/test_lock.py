"""The lock: the shipped locks load, fingerprints are stable, every bad lock is one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import InputError, RunnerError
from runner.spec.lock import load_lock

CASES = json.loads((Path(__file__).parent / "bad_locks" / "cases.json").read_text())


def test_reference_lock_loads(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    assert [m.label for m in lock.models] == ["seal/glm-5.3", "seal/gpt-5.6-luna"]
    assert lock.tasks.ids == ("git-leak-recovery", "sqlite-db-truncate", "cancel-async-tasks")
    assert lock.tasks.commit == "d1f1920f2d817a831f466d0ff363ef795a9a3b00"
    assert [h.label for h in lock.harnesses] == ["Bare Pi", "Pi + OpenPI", "OMP"]
    assert (lock.repeats, lock.cell_deadline_seconds, lock.concurrency) == (3, 1800, 1)
    assert (lock.tools.bun, lock.tools.harbor) == ("1.3.14", "0.20.0")
    assert lock.harnesses[2].package.version == "17.2.12"


def test_fingerprint_is_stable_and_content_sensitive(seed_lock_path: Path, tmp_path: Path) -> None:
    first = load_lock(seed_lock_path).fingerprint
    reordered = tmp_path / "lock.toml"
    # Whitespace and comments are not content; a changed value is.
    reordered.write_text("# a comment\n" + seed_lock_path.read_text().replace(" = ", "="))
    assert load_lock(reordered).fingerprint == first
    reordered.write_text(seed_lock_path.read_text().replace("repeats = 3", "repeats = 2"))
    assert load_lock(reordered).fingerprint != first
    assert first.startswith("sha256:") and len(first) == 71


def test_demo_lock_uses_scripted_provider(repo: Path) -> None:
    lock = load_lock(repo / "locks" / "demo.toml")
    assert all(model.base_url.startswith("scripted://") for model in lock.models)


def _bad_lock(seed_lock_path: Path, tmp_path: Path, case: dict[str, Any]) -> Path:
    old, new = case["replace"]
    text = seed_lock_path.read_text()
    assert old in text, f"case {case['name']} no longer applies to the reference lock"
    path = tmp_path / f"{case['name']}.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_bad_lock_is_one_line_naming_file_and_field(
    seed_lock_path: Path, tmp_path: Path, case: dict[str, Any]
) -> None:
    path = _bad_lock(seed_lock_path, tmp_path, case)
    with pytest.raises(InputError) as raised:
        load_lock(path)
    # The whole message: the file, then the field's dotted path and pydantic's or the
    # validator's words, on one line; a key written where its variable's name belongs is not.
    assert str(raised.value) == f"{path}: {case['expect']}"
    if "secret" in case:
        assert case["secret"] not in str(raised.value)


@pytest.mark.parametrize("case", CASES[:4], ids=[case["name"] for case in CASES[:4]])
def test_cli_bad_lock_exit_2_without_traceback(
    seed_lock_path: Path, tmp_path: Path, case: dict[str, Any]
) -> None:
    path = _bad_lock(seed_lock_path, tmp_path, case)
    result = subprocess.run(
        [sys.executable, "-c", "from runner.cli.main import main; main()", "schedule", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    # stderr is that one line and nothing else (no traceback, no second word); stdout is empty.
    assert (result.stdout, result.stderr) == ("", f"runner: error: {path}: {case['expect']}\n")
    assert not (tmp_path / "schedule.json").exists()


def test_environment_inputs_ignore_what_the_guest_is_not_made_of(
    seed_lock_path: Path, tmp_path: Path
) -> None:
    base = load_lock(seed_lock_path)
    changed = tmp_path / "lock.toml"
    text = seed_lock_path.read_text()
    changed.write_text(text.replace("repeats = 3", "repeats = 1").replace("1800", "60"))
    assert load_lock(changed).environment_inputs == base.environment_inputs
    ids = 'ids = ["git-leak-recovery", "sqlite-db-truncate", "cancel-async-tasks"]\n'
    tolerant = ids + 'needs_network = { "git-leak-recovery" = "its build clones from GitHub" }\n'
    changed.write_text(text.replace(ids, tolerant))
    assert load_lock(changed).environment_inputs == base.environment_inputs
    changed.write_text(text.replace('bun = "1.3.14"', 'bun = "1.3.15"'))
    assert load_lock(changed).environment_inputs != base.environment_inputs


def test_environment_fingerprint_needs_the_resolution(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    with pytest.raises(RunnerError, match="its resolution was not loaded"):
        _ = lock.environment_fingerprint
    resolved = lock.with_environment("sha256:" + "e" * 64)
    assert resolved.for_model(lock.models[0].id).environment_fingerprint == "sha256:" + "e" * 64


def test_only_a_scripted_base_url_is_the_scripted_provider(seed_lock_path: Path) -> None:
    real = load_lock(seed_lock_path).models[0]
    assert not real.is_scripted
    assert real.model_copy(update={"base_url": "scripted://local"}).is_scripted
    # The scheme, not a mention of it, decides.
    assert not real.model_copy(update={"base_url": "https://scripted.example/"}).is_scripted


def test_a_task_that_needs_the_network_is_tolerated_everywhere_a_timing_one_under_tcg(
    seed_lock_path: Path,
) -> None:
    tasks = load_lock(seed_lock_path).tasks.model_copy(
        update={
            "timing_sensitive": ("cancel-async-tasks",),
            "needs_network": {"git-leak-recovery": "its build clones from GitHub"},
        }
    )
    network = {"git-leak-recovery": "needs the network: its build clones from GitHub"}
    assert tasks.tolerated(emulated=False) == network
    assert tasks.tolerated(emulated=True) == {
        "cancel-async-tasks": "timing-sensitive under emulation",
        **network,
    }
