"""Runner overhead per cell, from a run directory's ledger: the runner's own phases (reset,
bearer, kill, copy-back, classification and ledger) against the cell's wall time, and beside
it Harbor's own time outside the agent and the verifier. Target for the runner's share:
<= 2 % of the cell's wall time and <= 10 s under TCG.

    python bench/runner_overhead.py RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from runner.records.ledger import Ledger
from runner.records.paths import RunPaths

HARBOR_PHASES = ("agent", "verifier", "harbor_environment_setup", "harbor_agent_setup")
# "harbor" is the whole Harbor process in the guest (its phases above happen inside it).
RUNNER_PHASES = ("reset", "bearer", "kill", "copy_back", "classify")


def main(run_dir: Path) -> int:
    lines = Ledger(RunPaths(run_dir)).lines()
    if not lines:
        print(f"{run_dir}: no finished cells")
        return 1
    print(f"{'cell':52} {'wall s':>7} {'runner s':>8} {'%':>5} {'harbor rest s':>13}  phases")
    for line in lines:
        phases = line.phase_seconds
        runner = sum(phases.get(name, 0.0) for name in RUNNER_PHASES)
        # Harbor's own work outside agent and verifier (its start-up, compose, copy of logs)
        harbor_rest = phases.get("harbor", 0.0) - sum(phases.get(n, 0.0) for n in HARBOR_PHASES)
        print(
            f"{line.cell_id:52} {line.wall_seconds:7.1f} {runner:8.1f} "
            f"{100 * runner / line.wall_seconds:5.1f} {harbor_rest:13.1f}  {phases}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
