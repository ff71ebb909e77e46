"""A host venv with the lock's Harbor, for tests that load tasks and agents the way Harbor does.
Built once into ``<cache>/harbor-venv`` under core.roots.cache_root() (Harbor 0.20.0 needs
Python >= 3.12; the host's default is 3.11), reused afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.core.roots import cache_root
from runner.spec.lock import load_lock

REPO = Path(__file__).resolve().parents[2]
HARBOR_VENV = cache_root() / "harbor-venv"
HARBOR_PYTHON = HARBOR_VENV / "bin" / "python"


def _python_for_harbor() -> str:
    """The first Python >= 3.12 that really runs (pyenv's shims exist for versions that are
    not selected, and fail)."""
    candidates = [shutil.which(name) for name in ("python3.13", "python3.12")]
    candidates += sorted(map(str, Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3")))
    check = "import sys; assert sys.version_info >= (3, 12)"
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", check], capture_output=True).returncode == 0:
            return candidate
    pytest.fail("Harbor needs Python >= 3.12 on the host (python3.12 or python3.13)")


@pytest.fixture(scope="session")
def harbor_python() -> Path:
    version = load_lock(REPO / "locks" / "demo.toml").tools.harbor
    probe = [
        str(HARBOR_PYTHON),
        "-c",
        f"import importlib.metadata as m; assert m.version('harbor') == '{version}'",
    ]
    if HARBOR_PYTHON.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return HARBOR_PYTHON
    subprocess.run([_python_for_harbor(), "-m", "venv", "--clear", str(HARBOR_VENV)], check=True)
    # The machine's pip config caps some packages for its own Python; Harbor's venv is its own.
    environment = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    environment.pop("PIP_FIND_LINKS", None)
    subprocess.run(
        [str(HARBOR_PYTHON), "-m", "pip", "install", "-q", f"harbor=={version}"],
        check=True,
        env=environment,
    )
    return HARBOR_PYTHON
