"""Runner overhead per cell: the cell's wall time outside the agent, the verifier and Harbor's
own environment work (reset, bearer, config, copy-back, classification, ledger), from a run
directory's ledger. Target: <= 2 % of the cell's wall time and <= 10 s under TCG.

    python bench/runner_overhead.py RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from runner.ledger import Ledger
from runner.paths import RunPaths

INSIDE = ("agent", "verifier", "harbor_environment_setup", "harbor_agent_setup")


def main(run_dir: Path) -> int:
    lines = Ledger(RunPaths(run_dir)).lines()
    if not lines:
        print(f"{run_dir}: no finished cells")
        return 1
    print(f"{'cell':58} {'wall s':>8} {'overhead s':>10} {'%':>6}  runner phases")
    for line in lines:
        phases = line.phase_seconds
        overhead = line.wall_seconds - sum(phases.get(name, 0.0) for name in INSIDE)
        runner_phases = {k: v for k, v in phases.items() if k not in INSIDE and k != "harbor"}
        print(
            f"{line.cell_id:58} {line.wall_seconds:8.1f} {overhead:10.1f} "
            f"{100 * overhead / line.wall_seconds:6.1f}  {runner_phases}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
