"""The executor takes the models' keys out of its own environment before anything runs: no child
process inherits them, and ansible-runner (which records its whole environment as evidence)
never sees one. Found by the credential scan of a real run: the preflight audit's `command`
artifact held the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.core.errors import InputError
from runner.run.execute import take_provider_keys
from runner.spec.lock import Lock, load_lock

REPO = Path(__file__).resolve().parent.parent
DEMO = load_lock(REPO / "locks" / "demo.toml")
SEED = load_lock(REPO / "locks" / "seed-54.toml")


def test_scripted_models_share_one_made_up_key_absent_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCRIPTED_PROVIDER_KEY", raising=False)
    keys = take_provider_keys(DEMO)
    assert list(keys) == ["SCRIPTED_PROVIDER_KEY"]  # both demo models name it
    assert len(keys["SCRIPTED_PROVIDER_KEY"]) >= 32


def test_a_real_key_leaves_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEAL_API_KEY", "sk-real-0123456789")  # both seed models name it
    assert take_provider_keys(SEED) == {"SEAL_API_KEY": "sk-real-0123456789"}
    assert "SEAL_API_KEY" not in os.environ


def test_a_missing_real_key_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    lock: Lock = SEED
    for model in lock.models:
        monkeypatch.delenv(model.key_env, raising=False)
    with pytest.raises(InputError, match=f"host variable {lock.models[0].key_env} is not set"):
        take_provider_keys(lock)
