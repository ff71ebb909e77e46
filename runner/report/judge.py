"""The judge of a run, as its receipt names it (``Identities.judge``): the runner's code and the
host venv it ran in, frozen by the host lock (runner.core.host_lock).

The report's statistics are computed by scipy and numpy under this Python: a reviewer who
recomputes them under other versions is told so by check-archive, not handed a broken archive.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata

from pydantic import Field

from runner.core.canonical import file_digest
from runner.core.host_lock import (
    HOST_LOCK,
    PROJECT,
    UNLOCKED_HOST_ENV,
    host_difference,
    unlocked_host,
)
from runner.core.models import FrozenModel, Sha256
from runner.core.roots import FROM_CHECKOUT, REPO_ROOT


class Judge(FrozenModel):
    runner: str = Field(
        description="`git <commit>` (`+ uncommitted changes` when the checkout had some), or "
        "`frozen-bench-runner <version>` installed from a wheel"
    )
    host_lock_sha256: Sha256 | None = Field(
        description="locks/host/requirements.txt's bytes (None: no lock beside the runner)"
    )
    python: str
    scipy: str
    numpy: str
    unlocked_host: str | None = Field(
        default=None,
        description=f"{UNLOCKED_HOST_ENV}=1 was set: how the venv differed from the lock",
    )

    def computing_versions(self) -> dict[str, str]:
        """The versions the report's statistics depend on, by name."""
        return {"Python": self.python, "scipy": self.scipy, "numpy": self.numpy}


def running_versions() -> dict[str, str]:
    """``Judge.computing_versions`` of this process (no import of scipy or numpy)."""
    return {
        "Python": platform.python_version(),
        "scipy": metadata.version("scipy"),
        "numpy": metadata.version("numpy"),
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
        )
    except OSError:  # no git on this host
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def runner_identity() -> str:
    """The runner's commit when it runs from a git checkout, else its installed version."""
    commit = _git("rev-parse", "HEAD") if FROM_CHECKOUT else None
    if commit is None:
        return f"{PROJECT} {metadata.version(PROJECT)}"
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"git {commit}" + (" + uncommitted changes" if changed else "")


def running_judge() -> Judge:
    versions = running_versions()
    unlocked = None
    if unlocked_host():
        unlocked = f"{UNLOCKED_HOST_ENV}=1: {host_difference() or 'the venv matched the lock'}"
    return Judge(
        runner=runner_identity(),
        host_lock_sha256=file_digest(HOST_LOCK) if HOST_LOCK.is_file() else None,
        python=versions["Python"],
        scipy=versions["scipy"],
        numpy=versions["numpy"],
        unlocked_host=unlocked,
    )
