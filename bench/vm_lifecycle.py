"""Lab lifecycle timings on this machine: deploy to SSH, no-change deploy, teardown, rebuild.

    python bench/vm_lifecycle.py [--lab bench]

Starts from no lab (a teardown first, not timed). Target: teardown <= 5 s.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from runner.lab.state import REPO_ROOT

TEARDOWN_TARGET_SECONDS = 5.0


def timed(argv: list[str], lab: str) -> tuple[float, str]:
    """Wall seconds of a command (including Python start-up and imports), and its stdout."""
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=REPO_ROOT,
        env={**os.environ, "LAB": lab},
        check=True,
        capture_output=True,
        text=True,
    )
    return time.monotonic() - started, done.stdout


def reported(stdout: str, step: str) -> float:
    """The seconds a runner verb printed for ``step`` (its own work, without start-up)."""
    match = re.search(rf"^{step}: ([\d.]+) s$", stdout, re.MULTILINE)
    return float(match[1]) if match else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="bench")
    lab = parser.parse_args().lab
    # The VM alone: the guest's software has its own bench (bench/provision.py).
    deploy = ["pyinfra", "-y", "--limit", "hypervisors", "inventory/local.py", "deploy.py"]
    teardown = ["runner", "teardown", "--lab", lab]

    timed(teardown, lab)
    results: dict[str, float] = {}
    results["deploy to SSH (cold lab, cached image), wall"] = timed(deploy, lab)[0]
    results["deploy again (no change), wall"] = timed(deploy, lab)[0]
    seconds, stdout = timed(teardown, lab)
    results["teardown, wall (runner start-up included)"] = seconds
    results["teardown, its own work"] = reported(stdout, "teardown")
    timed(deploy, lab)
    seconds, stdout = timed(["runner", "rebuild", "--lab", lab, "--limit", "hypervisors"], lab)
    results["rebuild, wall"] = seconds
    results["rebuild: teardown part"] = reported(stdout, "teardown")
    results["rebuild: deploy-to-SSH part"] = reported(stdout, "deploy")
    timed(teardown, lab)

    for name, value in results.items():
        print(f"{name:<46} {value:7.1f} s")
    within = results["teardown, its own work"] <= TEARDOWN_TARGET_SECONDS
    print(f"teardown target <= {TEARDOWN_TARGET_SECONDS:.0f} s: {'met' if within else 'MISSED'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
