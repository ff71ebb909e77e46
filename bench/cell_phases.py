"""Where a cell's time goes: N cells of one lock, each phase's median and spread over them, and
the fixed cost (everything but the agent and the verifier) against the cell's wall time.

    python bench/cell_phases.py LOCK --lab LAB [--run-dir DIR]   # runs the lock's cells, then
    python bench/cell_phases.py --read RUN_DIR [RUN_DIR ...]      # only reads finished runs

Phases, in a cell's order (ledger phase_seconds; Harbor's own from its result.json, on the
guest's clock): reset, bearer, Harbor start-up (launch to trial start), environment setup,
agent setup, agent, verifier, Harbor teardown (last phase's end to trial end), "harbor gaps"
(the rest of Harbor's process: between its phases, and its exit), copy-back, egress read,
the guest disk's credential scan, classification, and "ledger" (the rest of the cell's wall:
writing its records).
Target (issue 15): fixed cost <= 50 s median per cell under TCG on a 2-core host.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import click

from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths

FIXED_TARGET_SECONDS = 50.0
MEASURED = ("agent", "verifier")  # what a cell measures; everything else is fixed cost
HARBOR_INSIDE = (
    "harbor_startup",
    "harbor_environment_setup",
    "harbor_agent_setup",
    "agent",
    "verifier",
    "harbor_teardown",
)
ROWS = (
    "reset",
    "bearer",
    *HARBOR_INSIDE,
    "harbor_gaps",
    "copy_back",
    "egress",
    "guest_scan",
    "classify",
    "ledger",
)


def phases_of(line: LedgerLine) -> dict[str, float]:
    """The cell's phases with the two remainders filled in: Harbor's time outside its phases
    and the cell's time outside every timed phase."""
    phases = dict(line.phase_seconds)
    harbor = phases.pop("harbor", 0.0)
    phases["harbor_gaps"] = harbor - sum(phases.get(name, 0.0) for name in HARBOR_INSIDE)
    phases["ledger"] = (
        line.wall_seconds
        - harbor
        - sum(phases.get(name, 0.0) for name in ROWS if name not in (*HARBOR_INSIDE, "harbor_gaps"))
    )
    phases["fixed"] = line.wall_seconds - sum(phases.get(name, 0.0) for name in MEASURED)
    phases["wall"] = line.wall_seconds
    return phases


def table(lines: list[LedgerLine]) -> str:
    cells = [phases_of(line) for line in lines]
    rows = [f"{'phase':26} {'median s':>9} {'min s':>7} {'max s':>7}   ({len(cells)} cells)"]
    for name in (*ROWS, "fixed", "wall"):
        values = [cell.get(name, 0.0) for cell in cells]
        rows.append(
            f"{name:26} {statistics.median(values):9.1f} {min(values):7.1f} {max(values):7.1f}"
        )
    fixed = statistics.median(cell["fixed"] for cell in cells)
    share = statistics.median(cell["fixed"] / cell["wall"] for cell in cells)
    verdict = "met" if fixed <= FIXED_TARGET_SECONDS else "NOT met"
    rows.append(
        f"fixed cost: median {fixed:.1f} s, {100 * share:.0f} % of a cell's wall "
        f"(target <= {FIXED_TARGET_SECONDS:.0f} s: {verdict})"
    )
    return "\n".join(rows)


def judged_lines(run_dirs: tuple[Path, ...]) -> list[LedgerLine]:
    lines = [line for run_dir in run_dirs for line in Ledger(RunPaths(run_dir)).lines()]
    return [line for line in lines if "harbor" in line.phase_seconds]


@click.command()
@click.argument("lock", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--lab", default="default", show_default=True)
@click.option("--run-dir", type=click.Path(path_type=Path), help="default: runs/phases-<lock>")
@click.option("--read", "read", multiple=True, type=click.Path(exists=True, path_type=Path))
def main(lock: Path | None, lab: str, run_dir: Path | None, read: tuple[Path, ...]) -> None:
    if not read:
        if lock is None:
            raise click.UsageError("give a LOCK to run, or --read RUN_DIR")
        run_dir = run_dir or Path("runs") / f"phases-{lock.stem}"
        command = ["runner", "execute", str(lock), "--run-dir", str(run_dir), "--lab", lab]
        subprocess.run(command, check=False)
        read = (run_dir,)
    lines = judged_lines(read)
    if not lines:
        sys.exit(f"{', '.join(map(str, read))}: no cell that ran Harbor")
    print(table(lines))


if __name__ == "__main__":
    main()
