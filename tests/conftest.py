from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# Session fixtures of the real-VM tier (vm_lab, frozen_lab), the Harbor venv, the cell tests',
# the registries' recorded answers, the credential proxy's.
pytest_plugins = [
    "tests.support.vm_fixtures",
    "tests.support.harbor_venv",
    "tests.support.cell_fixtures",
    "tests.support.recorded_registry",
    "tests.support.proxy_fixtures",
]

REPO = Path(__file__).resolve().parent.parent
# Upstream git repositories these machines cannot reach, read from the bundles beside the
# repository (../shared/sources/README.md) by git's own URL rewriting in the environment, so
# every git the runner (or a runner subprocess) starts picks it up. The locks keep the real URLs.
OPENPI_URL = "https://github.com/tt-a1i/openpi.git"
OPENPI_BUNDLE = REPO.parent / "shared" / "sources" / "openpi-v0.3.0.bundle"
TASKS_URL = "https://github.com/laude-institute/terminal-bench-2.git"
TASKS_BUNDLE = REPO.parent / "shared" / "sources" / "terminal-bench-2.1-subset.bundle"
TB20_URL = "https://github.com/yujianll/skill-usage.git"
TB20_BUNDLE = REPO.parent / "shared" / "sources" / "terminal-bench-2.0-subset.bundle"


@pytest.fixture(scope="session", autouse=True)
def git_sources() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GIT_CONFIG_COUNT", "3")
        patch.setenv("GIT_CONFIG_KEY_0", f"url.{OPENPI_BUNDLE}.insteadOf")
        patch.setenv("GIT_CONFIG_VALUE_0", OPENPI_URL)
        patch.setenv("GIT_CONFIG_KEY_1", f"url.{TASKS_BUNDLE}.insteadOf")
        patch.setenv("GIT_CONFIG_VALUE_1", TASKS_URL)
        patch.setenv("GIT_CONFIG_KEY_2", f"url.{TB20_BUNDLE}.insteadOf")
        patch.setenv("GIT_CONFIG_VALUE_2", TB20_URL)
        yield


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def seed_lock_path() -> Path:
    return REPO / "locks" / "seed-54.toml"
