"""OMP and Bare Pi on an x86_64 guest, end to end: deploy lab LAB, freeze it, execute the lock.

    python bench/omp_x86_64_cell.py [--lab x86] [--lock locks/omp-x86_64.toml] [--run-dir DIR]
                                    [--dry-run]

Starts a VM (run it by hand when the hypervisor is free; --dry-run only prints the steps).
Prints each step's wall time, then every cell's outcome, reason, wall time and phases from the
run's ledger. Exit status: that of the first failing step, else 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from runner.core.roots import REPO_ROOT
from runner.records.ledger import LedgerLine
from runner.records.paths import RunPaths


def steps(lock: str, lab: str, run_dir: str) -> list[tuple[str, list[str]]]:
    return [
        ("resolve (recorded artifacts)", ["runner", "resolve", lock]),
        ("image, lab VM and guest", ["pyinfra", "-y", "inventory/local.py", "deploy.py"]),
        ("freeze", ["runner", "freeze", "--lab", lab, "--lock", lock]),
        ("execute", ["runner", "execute", lock, "--run-dir", run_dir, "--lab", lab]),
    ]


def cell_lines(lines: Iterable[LedgerLine]) -> list[str]:
    return [
        f"{line.harness:10} {line.task:20} {line.outcome:13} {line.wall_seconds:8.1f} s  "
        f"{line.reason}  phases: "
        + " ".join(f"{name}={seconds:.1f}" for name, seconds in line.phase_seconds.items())
        for line in lines
    ]


def read_ledger(run_dir: Path) -> list[LedgerLine]:
    ledger = RunPaths(run_dir).ledger
    if not ledger.is_file():
        return []
    text = ledger.read_text().splitlines()
    return [LedgerLine.model_validate_json(line) for line in text if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="x86")
    parser.add_argument("--lock", default="locks/omp-x86_64.toml")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    parser.add_argument("--run-dir", default=f"runs/omp-x86_64-{stamp}")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    args = parser.parse_args(argv)
    env = {**os.environ, "LAB": args.lab, "LOCK": args.lock}
    for title, command in steps(args.lock, args.lab, args.run_dir):
        print(f"== {title}: LAB={args.lab} LOCK={args.lock} {' '.join(command)}", flush=True)
        if args.dry_run:
            continue
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, check=False)
        print(f"   {title}: {time.monotonic() - started:.1f} s (exit {done.returncode})")
        if done.returncode != 0 and title != "execute":
            return done.returncode
    if args.dry_run:
        return 0
    run_dir = REPO_ROOT / args.run_dir
    for line in cell_lines(read_ledger(run_dir)) or ["no cell finished"]:
        print(line)
    print(f"report: {run_dir}/report.md")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
