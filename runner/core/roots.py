"""Where the tool's own files live on the controller: the repository and the host cache.

The cache root is ``<repo>/.cache`` unless ``$FROZEN_BENCH_CACHE`` names another directory;
every directory under it is owned by one paths object (cache.paths.CachePaths, lab.state.LabPaths,
images.paths.StorePaths, ...), and each of those asks this module for the root.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FROZEN_BENCH_CACHE"


def _repository_root() -> Path:
    """The checkout this package runs from; for an installed wheel, the working directory.

    A lock's relative paths (tasks, ``file:`` packages) and the default cache are relative to
    the repository, so a wheel-installed ``runner`` is run from the repository it acts on.
    """
    source_tree = Path(__file__).resolve().parents[2]
    return source_tree if (source_tree / "pyproject.toml").is_file() else Path.cwd()


REPO_ROOT = _repository_root()


def cache_root() -> Path:
    """The host cache directory: ``$FROZEN_BENCH_CACHE``, else ``<repo>/.cache``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else REPO_ROOT / ".cache"
