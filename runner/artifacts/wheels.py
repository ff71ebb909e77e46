"""Harbor and its dependencies as wheels for the guest's CPython and architecture.

pip chooses them (``install --dry-run --report`` with the guest's platform tags and Python
version); its report gives each wheel's PyPI URL and sha256, checked when it is downloaded.
Only wheels: the guest has no compiler and no network, so a dependency published only as a
source distribution fails closed here, naming it.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import aiohttp

from runner.artifacts.fetch import Wanted
from runner.artifacts.http import get_json
from runner.artifacts.plan import Plan, Planned
from runner.artifacts.tools import PIP, ToolFailed, pip_env, run_tool
from runner.artifacts.versions import nearest_version
from runner.spec.platform import GuestPlatform

GUEST_PYTHON = "3.13"  # Debian trixie's python3
_PYPI_JSON = "https://pypi.org/pypi/{name}/json"
_NO_WHEEL = re.compile(r"No matching distribution found for (\S+)")


async def plan_wheels(requirement: str, platform: GuestPlatform, glibc_minor: int) -> Plan:
    plan = Plan()
    python_tag = "cp" + GUEST_PYTHON.replace(".", "")
    platforms = [
        arg for tag in platform.wheel_platforms(glibc_minor) for arg in ("--platform", tag)
    ]
    with tempfile.TemporaryDirectory(prefix="pip-report-") as workdir:
        report_path = Path(workdir) / "report.json"
        try:
            await run_tool(
                [
                    *PIP, "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--target", str(Path(workdir) / "target"), "--report", str(report_path),
                    "--only-binary=:all:", "--python-version", GUEST_PYTHON,
                    "--implementation", "cp", "--abi", python_tag, "--abi", "abi3",
                    "--abi", "none", *platforms, requirement,
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
                kind="wheel",
                name=metadata["name"],
                version=metadata["version"],
                wanted=Wanted(url, url.rsplit("/", 1)[-1], sha256="sha256:" + sha256),
            )
        )
    return plan


async def pypi_problem(session: aiohttp.ClientSession, name: str, version: str) -> str | None:
    """None when PyPI has ``name==version``, else what to write after the name."""
    project = await get_json(session, _PYPI_JSON.format(name=name), "application/json")
    if project is None:
        return "not on PyPI (no project of that name)"
    releases = {number for number, files in project["releases"].items() if files}
    if version in releases:
        return None
    nearest = nearest_version(version, releases)
    return "not on PyPI" + (f"; nearest: {nearest}" if nearest else "")


async def harbor_pin_problem(session: aiohttp.ClientSession, harbor: str) -> list[str]:
    problem = await pypi_problem(session, "harbor", harbor)
    return [] if problem is None else [f"pypi:harbor=={harbor}: {problem}"]
