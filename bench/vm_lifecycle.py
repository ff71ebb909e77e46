"""Lab lifecycle timings on this machine: deploy to SSH, no-change deploy, teardown, rebuild.

    python bench/vm_lifecycle.py [--lab bench]

Starts from no lab (a teardown first, not timed). Target: teardown <= 5 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from runner.lab import REPO_ROOT

TEARDOWN_TARGET_SECONDS = 5.0


def timed(argv: list[str], lab: str) -> float:
    started = time.monotonic()
    subprocess.run(
        argv, cwd=REPO_ROOT, env={**os.environ, "LAB": lab}, check=True, stdout=subprocess.DEVNULL
    )
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="bench")
    lab = parser.parse_args().lab
    deploy = ["pyinfra", "-y", "inventory/local.py", "deploy.py"]
    teardown = ["runner", "teardown", "--lab", lab]

    timed(teardown, lab)
    results = {
        "deploy to SSH (cold lab, cached image)": timed(deploy, lab),
        "deploy again (no change)": timed(deploy, lab),
        "teardown": timed(teardown, lab),
    }
    timed(deploy, lab)
    results["rebuild (teardown + deploy to SSH)"] = timed(["runner", "rebuild", "--lab", lab], lab)
    timed(teardown, lab)

    for name, seconds in results.items():
        print(f"{name:<42} {seconds:7.1f} s")
    within = results["teardown"] <= TEARDOWN_TARGET_SECONDS
    print(f"teardown target <= {TEARDOWN_TARGET_SECONDS:.0f} s: {'met' if within else 'MISSED'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
