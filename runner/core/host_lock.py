"""The host lock: the distributions the host venv is installed from, each pinned with its
files' hashes (locks/host/requirements.txt, written by scripts/lock-host.sh, installed by
scripts/setup-host.sh), and how the running environment differs from it.

The judge of a run (the statistics, the credential scan, the archive check) is this venv, so
every ``runner`` command checks it first: from the installed metadata alone (importlib.metadata,
no subprocess), a few milliseconds.
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from runner.core.roots import REPO_ROOT

HOST_LOCK = REPO_ROOT / "locks" / "host" / "requirements.txt"
# Set to 1: run on a venv that differs from the lock; the receipt records that it was set.
UNLOCKED_HOST_ENV = "FROZEN_BENCH_UNLOCKED_HOST"
# Installed from the checkout beside the lock (``--no-deps -e .``), so in no lock.
PROJECT = "frozen-bench-runner"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HEADER = re.compile(r"^(Name|Version): *(.+?) *$", re.MULTILINE)


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``PyYAML``, ``pyyaml``: one name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str) -> dict[str, str]:
    """Each pin of a hashed requirements file (``name==version \\``), by canonical name; the
    hash, comment and ``# via`` lines are skipped."""
    pins = (_PIN.match(line) for line in text.splitlines())
    return {canonical_name(pin[1]): pin[2] for pin in pins if pin}


@dataclass(frozen=True)
class Installed:
    version: str
    in_venv: bool  # in the venv's own site-packages (not a system site a venv may also see)


def _name_and_version(distribution: metadata.Distribution) -> tuple[str, str] | None:
    """From the metadata's header alone: ``distribution.metadata`` parses the whole file, long
    descriptions included (60 ms for the venv's 85 against 7 ms)."""
    text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
    headers = dict(_HEADER.findall(text.partition("\n\n")[0]))
    if "Name" not in headers or "Version" not in headers:  # an install broken half-way
        return None
    return headers["Name"], headers["Version"]


def installed_distributions() -> dict[str, Installed]:
    """Every distribution the running interpreter sees, by canonical name: the first on
    sys.path, the one ``import`` finds."""
    own_sites = {Path(sysconfig.get_path(kind)) for kind in ("purelib", "platlib")}
    found: dict[str, Installed] = {}
    for distribution in metadata.distributions():
        name_and_version = _name_and_version(distribution)
        if name_and_version is None:
            continue
        name, version = name_and_version
        site = Path(str(distribution.locate_file("")))
        found.setdefault(canonical_name(name), Installed(version, site in own_sites))
    return found


def lock_difference(locked: dict[str, str], installed: dict[str, Installed]) -> str | None:
    """How the environment differs from the lock, naming the first package (and counting the
    rest); None when every pin is installed at its version and the venv holds nothing else."""
    found: list[str] = []
    for name, version in sorted(locked.items()):
        have = installed.get(name)
        if have is None:
            found.append(f"{name} not installed, {version} locked")
        elif have.version != version:
            found.append(f"{name} {have.version} installed, {version} locked")
    unlocked = sorted(
        name
        for name, have in installed.items()
        if have.in_venv and name not in locked and name != PROJECT
    )
    found += [f"{name} {installed[name].version} installed, not in the lock" for name in unlocked]
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return found[0] + more


def host_difference(lock: Path = HOST_LOCK) -> str | None:
    """How the running environment differs from ``lock``; None when it holds exactly it."""
    if not lock.is_file():
        return "no host lock to check it against"
    return lock_difference(locked_versions(lock.read_text()), installed_distributions())


def unlocked_host() -> bool:
    """The operator asked to run on a venv that differs from the lock."""
    return os.environ.get(UNLOCKED_HOST_ENV) == "1"
