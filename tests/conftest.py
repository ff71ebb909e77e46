from __future__ import annotations

from pathlib import Path

import pytest

# Session fixtures of the real-VM tier (vm_lab, frozen_lab), the Harbor venv, the cell tests'.
pytest_plugins = [
    "tests.support.vm_fixtures",
    "tests.support.harbor_venv",
    "tests.support.cell_fixtures",
]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def seed_lock_path() -> Path:
    return REPO / "locks" / "seed-54.toml"
