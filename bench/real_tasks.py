"""A lock of real tasks end to end, the way a new user runs it (``scripts/lab.sh``), and the
figures a note gives: each step's wall time, the freeze's oracle table (task, reward, seconds,
why not 1), each task's cells and how many tasks the lab judged.

    python bench/real_tasks.py [--lock locks/tb20.toml] [--lab tb20] [--run-dir DIR]

The sixteen Terminal-Bench 2.0 tasks of locks/tb20.toml are this bench, not CI: under QEMU TCG
each image build and oracle takes minutes. lab.sh's output is passed through as it comes; the
summary is printed at the end and written beside the run (``<run dir>.bench.json``). Nothing
here is a pass/fail test; it exits with lab.sh's status.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.core.text_table import text_table
from runner.freeze.manifest import OracleScore
from runner.freeze.record import load_freeze
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths

# What the summary keeps of each cell's ledger line.
CELL_FIELDS = {"cell_id", "task", "model", "outcome", "failure_class", "reason", "wall_seconds"}
# scripts/lab.sh's step header: "== <step> (<UTC time> UTC; the step before took <n> s)".
_STEP = re.compile(r"^== (?P<step>.+) \(\S+ UTC; the step before took (?P<seconds>\d+) s\)$")


def run_lab(lock: Path, lab: str, run_dir: Path) -> tuple[int, dict[str, int]]:
    """lab.sh's exit status and each step's wall time (the seconds its next header gives)."""
    environment = {**os.environ, "LOCK": str(lock), "LAB": lab, "RUN_DIR": str(run_dir)}
    steps: dict[str, int] = {}
    step = None
    with subprocess.Popen(
        ["bash", "scripts/lab.sh"], cwd=REPO_ROOT, env=environment, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ) as lab_sh:  # fmt: skip
        assert lab_sh.stdout is not None
        for line in lab_sh.stdout:
            sys.stdout.write(line)
            if header := _STEP.match(line.rstrip("\n")):
                if step is not None:
                    steps[step] = int(header["seconds"])
                step = header["step"]
    return lab_sh.returncode, steps


def oracle_scores(lab: str) -> tuple[OracleScore, ...]:
    """The freeze's oracle scores (none: the lab was not frozen)."""
    try:
        manifest, _ = load_freeze(lab)
    except RunnerError:
        return ()
    return manifest.oracle


def ledger_lines(run_dir: Path) -> list[LedgerLine]:
    paths = RunPaths(run_dir)
    return Ledger(paths).lines() if paths.ledger.is_file() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=Path("locks/tb20.toml"))
    parser.add_argument("--lab", default="tb20")
    parser.add_argument("--run-dir", type=Path)
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = args.run_dir or REPO_ROOT / "runs" / f"{args.lock.stem}-{stamp}"
    started = time.monotonic()
    status, steps = run_lab(args.lock, args.lab, run_dir)
    wall = round(time.monotonic() - started)
    scores, lines = oracle_scores(args.lab), ledger_lines(run_dir)
    judged = sum(score.judges for score in scores)
    print(f"\nwall {wall} s; steps (s): " + ", ".join(f"{k} {v}" for k, v in steps.items()))
    rows = [
        (s.task, f"{s.reward:g}", f"{s.seconds:.0f}",
         "" if s.judges else s.tolerated or s.harbor_said or s.verifier_last_lines)
        for s in scores
    ]  # fmt: skip
    print("\n".join(text_table(("task", "reward", "seconds", "why not 1"), rows)))
    outcomes = Counter(f"{line.outcome} ({line.failure_class or 'agent'})" for line in lines)
    print(f"tasks judged: {judged} of {len(scores)}; cells: {dict(outcomes)}")
    found = {
        "lock": str(args.lock), "lab": args.lab, "exit": status, "wall_seconds": wall,
        "steps": steps, "tasks_judged": judged,
        "oracles": [score.model_dump(mode="json") for score in scores],
        "cells": [line.model_dump(mode="json", include=CELL_FIELDS) for line in lines],
    }  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{run_dir}.bench.json").write_text(json.dumps(found, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
