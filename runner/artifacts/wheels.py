"""Harbor and its dependencies as wheels for the guest's CPython and architecture.

pip chooses them (``install --dry-run --report`` with the guest's platform tags and Python
version) from the lock's ``tools.python_index`` (PyPI unless a test points it at a loopback
index); its report gives each wheel's URL and sha256, checked when it is downloaded.
Only wheels: the guest has no compiler and no network, so a dependency published only as a
source distribution fails closed here, naming it.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import aiohttp
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from runner.artifacts.fetch import Wanted
from runner.artifacts.http import get_json
from runner.artifacts.plan import Plan, Planned
from runner.artifacts.tools import PIP, ToolFailed, pip_env, run_tool
from runner.artifacts.versions import nearest_version
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import ArtifactKind

GUEST_PYTHON = "3.13"  # Debian trixie's python3
# PEP 691's JSON form of the simple API; PEP 700 adds the project's "versions".
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_NO_WHEEL = re.compile(r"No matching distribution found for (\S+)")


async def plan_wheels(
    requirements: tuple[str, ...],
    index: str,
    platform: GuestPlatform,
    glibc_minor: int,
    kind: ArtifactKind = "wheel",
    kept: tuple[str, ...] = (),
) -> Plan:
    """The wheels pip installs for ``requirements`` on the guest, as ``kind`` artifacts.
    ``kept`` (``name==version``, what an earlier resolution pinned) are pip constraints: each
    stays where the requirements still allow it; when they no longer can all hold together,
    pip chooses afresh. A project the requirements name is never held: the lock says it."""
    named = {canonicalize_name(Requirement(line).name) for line in requirements}
    kept = tuple(pin for pin in kept if canonicalize_name(Requirement(pin).name) not in named)
    if kept:
        try:
            return await _planned_wheels(requirements, index, platform, glibc_minor, kind, kept)
        except ToolFailed:
            pass  # the requirements moved past a kept pin: resolved afresh, every change listed
    return await _planned_wheels(requirements, index, platform, glibc_minor, kind, ())


async def _planned_wheels(
    requirements: tuple[str, ...],
    index: str,
    platform: GuestPlatform,
    glibc_minor: int,
    kind: ArtifactKind,
    kept: tuple[str, ...],
) -> Plan:
    plan = Plan()
    requirement = " ".join(requirements)
    python_tag = "cp" + GUEST_PYTHON.replace(".", "")
    platforms = [
        arg for tag in platform.wheel_platforms(glibc_minor) for arg in ("--platform", tag)
    ]
    with tempfile.TemporaryDirectory(prefix="pip-report-") as workdir:
        report_path = Path(workdir) / "report.json"
        constraints = Path(workdir) / "kept.txt"
        constraints.write_text("".join(f"{pin}\n" for pin in kept))
        try:
            await run_tool(
                [
                    *PIP, "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--target", str(Path(workdir) / "target"), "--report", str(report_path),
                    "--only-binary=:all:", "--python-version", GUEST_PYTHON,
                    "--implementation", "cp", "--abi", python_tag, "--abi", "abi3",
                    "--abi", "none", *platforms, "--index-url", index,
                    "--constraint", str(constraints), *requirements,
                ],
                f"pip wheels for {requirement}",
                env=pip_env(),
            )  # fmt: skip
        except ToolFailed as failure:
            missing = _NO_WHEEL.search(failure.stderr)
            if missing is None:
                raise
            plan.unavailable.append(
                f"pypi:{missing[1]}: no wheel for CPython {GUEST_PYTHON} on "
                f"manylinux {platform.arch} (needed by {requirement})"
            )
            return plan
        report = json.loads(report_path.read_text())
    for item in report["install"]:
        url: str = item["download_info"]["url"]
        sha256 = item["download_info"]["archive_info"]["hashes"]["sha256"]
        metadata = item["metadata"]
        plan.planned.append(
            Planned(
                kind=kind,
                name=metadata["name"],
                version=metadata["version"],
                wanted=Wanted(url, url.rsplit("/", 1)[-1], sha256="sha256:" + sha256),
            )
        )
    return plan


async def pypi_problem(
    session: aiohttp.ClientSession, index: str, name: str, version: str
) -> str | None:
    """None when the index has ``name==version``, else what to write after the name."""
    project = await get_json(session, f"{index.rstrip('/')}/{name}/", _SIMPLE_JSON)
    if project is None:
        return f"not on {index} (no project of that name)"
    releases = set(project.get("versions", ()))
    if version in releases:
        return None
    nearest = nearest_version(version, releases)
    return f"not on {index}" + (f"; nearest: {nearest}" if nearest else "")


async def harbor_pin_problem(session: aiohttp.ClientSession, harbor: str, index: str) -> list[str]:
    problem = await pypi_problem(session, index, "harbor", harbor)
    return [] if problem is None else [f"pypi:harbor=={harbor}: {problem}"]
