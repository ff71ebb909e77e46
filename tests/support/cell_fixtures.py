"""Fixtures of the fast cell tests: a run dir in tmp_path and a real proxy on loopback.

A pytest plugin (tests/conftest.py names it); a test module that needs another ``paths`` or
``proxy`` defines its own, which wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.cells.cell import CellRunner
from runner.core.roots import REPO_ROOT
from runner.lab.transport import GuestTransport
from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths
from runner.spec.lock import Lock

# The scripted provider's "key": what the proxy swaps in for the cell's bearer.
SCRIPTED_KEYS = {"SCRIPTED_PROVIDER_KEY": "scripted-key-" + "k" * 24}


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run")


@pytest.fixture
def proxy(paths: RunPaths) -> Iterator[CredentialProxy]:
    with CredentialProxy(paths, keys=SCRIPTED_KEYS) as running:
        yield running


def runner_for(
    lock: Lock,
    paths: RunPaths,
    proxy: CredentialProxy,
    guest: GuestTransport,
    mirror_log: Path | None = None,
) -> CellRunner:
    """A cell runner on the repository's tasks with no reset between cells (a fake guest)."""
    return CellRunner(
        lock=lock,
        paths=paths,
        guest=guest,
        proxy=proxy,
        task_root=REPO_ROOT / "tasks",
        reset_guest=None,
        mirror_log=mirror_log,
    )
