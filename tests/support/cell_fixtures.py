"""Fixtures of the fast cell tests: a run dir in tmp_path and a real proxy on loopback.

A pytest plugin (tests/conftest.py names it); a test module that needs another ``paths`` or
``proxy`` defines its own, which wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths

# The scripted provider's "key": what the proxy swaps in for the cell's bearer.
SCRIPTED_KEYS = {"SCRIPTED_PROVIDER_KEY": "scripted-key-" + "k" * 24}


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run")


@pytest.fixture
def proxy(paths: RunPaths) -> Iterator[CredentialProxy]:
    with CredentialProxy(paths, keys=SCRIPTED_KEYS) as running:
        yield running
