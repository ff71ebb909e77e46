"""Running the host's package tools (apt, npm, pip): a failure becomes one line, never a trace."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from runner.core.errors import RunnerError

PIP = (sys.executable, "-m", "pip")
_NOISE = re.compile(r"complete log of this run|npm error code ")


class ToolFailed(RunnerError):
    """A package tool refused; the message carries its own last error line."""

    def __init__(self, what: str, stderr: str) -> None:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        # The first line saying what went wrong: not npm's "error code" or "complete log" lines.
        errors = [
            line
            for line in lines
            if ("error" in line.lower() or line.startswith("E:")) and not _NOISE.search(line)
        ]
        super().__init__(f"{what}: {(errors or lines or ['failed with no message'])[0]}")
        self.stderr = stderr


async def run_tool(
    args: Sequence[str],
    what: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> str:
    """Run a tool to completion and return its stdout; ``what`` names the step in errors."""
    returncode, stdout, stderr = await _run(args, env, cwd)
    if returncode != 0:
        raise ToolFailed(what, stderr)
    return stdout


async def run_tool_unchecked(
    args: Sequence[str], *, env: Mapping[str, str] | None = None
) -> tuple[str, bool]:
    """A tool whose refusal is an answer (apt's unmet dependencies): stdout and stderr, and
    whether it exited 0."""
    returncode, stdout, stderr = await _run(args, env, None)
    return stdout + stderr, returncode == 0


async def _run(
    args: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    stdout, stderr = await process.communicate()
    return process.returncode or 0, stdout.decode(), stderr.decode(errors="replace")


def pip_env() -> dict[str, str]:
    """The environment for pip: the host's CA settings, but none of its indexes or constraints.

    A machine-wide pip.conf may add local indexes, find-links or a constraints file; the guest's
    wheels must come from PyPI alone and be chosen for the guest, not for this host.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if "PIP_CERT" in os.environ:
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    return env


async def tool_version(args: Sequence[str], what: str) -> str:
    """The first line a tool prints for its version (``apt 2.6.1 (amd64)`` -> that line)."""
    return (await run_tool(args, what)).strip().splitlines()[0]
