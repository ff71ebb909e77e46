"""A task's own reference solution through Harbor's oracle agent, run again and again in a
frozen lab: how often it scores 1 here, and how long it takes. For timing-sensitive tasks
(cancel-async-tasks sends SIGINT 0.5 s after start) this is what emulation does to them.

The lab's package mirror serves the verifiers (as at the freeze); the lab is reset to its freeze
afterwards. Nothing here is a pass/fail test; it prints what was measured.

    python bench/oracle_runs.py --lab NAME --lock LOCK --task cancel-async-tasks [--runs 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runner.freeze.reset import reset_lab
from runner.lab.mirror import lab_mirror
from runner.lab.oracle_run import ORACLE_TRIALS, run_oracle
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import SshTransport
from runner.spec.resolution import load_resolved_lock, resolution_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    lab = load_lab_state(LabPaths.for_lab(args.lab))
    lock = load_resolved_lock(args.lock)
    scores = []
    try:
        with (
            lab_mirror(args.lab, resolution_path(args.lock, lock)),
            SshTransport.for_lab(lab).connect(60) as guest,
        ):
            for number in range(1, args.runs + 1):
                run = run_oracle(guest, args.task)
                output = ORACLE_TRIALS / f"oracle-{args.task}" / "verifier" / "test-stdout.txt"
                failed = guest.exec(f"grep -h '^FAILED' {output}", timeout=60).stdout.split()
                tests = sorted(name for name in failed if "::" in name)
                said = f"; {run.harbor_said}" if run.harbor_said else ""
                print(f"run {number}: {run.outcome()}{said}; failed: {tests}")
                if run.reward is not None:  # no result: the run says nothing of the task
                    scores.append(run.reward == 1)
                guest.check(f"rm -rf {ORACLE_TRIALS}", timeout=120)
    finally:
        reset_lab(args.lab)
    print(f"{args.task} on lab {args.lab} ({lab.acceleration.kind}): {sum(scores)} of "
          f"{len(scores)} oracle runs with a verdict scored 1 ({args.runs} run)")  # fmt: skip


if __name__ == "__main__":
    main()
