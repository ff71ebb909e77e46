"""Where the tool's own files live on the controller: the repository and the host cache.

The cache root is ``<repo>/.cache`` unless ``$FROZEN_BENCH_CACHE`` names another directory;
every directory under it is owned by one paths object (cache.paths.CachePaths, lab.state.LabPaths,
images.paths.StorePaths, ...), and each of those asks this module for the root.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FROZEN_BENCH_CACHE"


_SOURCE_TREE = Path(__file__).resolve().parents[2]
# The package runs from a checkout (an editable install, PYTHONPATH), not an installed wheel.
FROM_CHECKOUT = (_SOURCE_TREE / "pyproject.toml").is_file()
# The checkout this package runs from; for an installed wheel, the working directory. A lock's
# relative paths (tasks, ``file:`` packages) and the default cache are relative to the
# repository, so a wheel-installed ``runner`` is run from the repository it acts on.
REPO_ROOT = _SOURCE_TREE if FROM_CHECKOUT else Path.cwd()


def cache_root() -> Path:
    """The host cache directory: ``$FROZEN_BENCH_CACHE``, else ``<repo>/.cache``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else REPO_ROOT / ".cache"
