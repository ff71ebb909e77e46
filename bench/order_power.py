"""The order test's power: on seeded synthetic ledgers (tests/support/synthetic_ledger.py) whose
first position in each block passes with 0.2 instead of 0.8 and takes 3x the wall time, the share
on which the test by position finds it, at ALPHA / m for m = 1 to 4 order tests Holm-corrected
together: the table behind runner.report.simulated.ORDER_POWER, per design (harnesses x tasks x
repeats: the lock's, its repeats set to each given).

    python bench/order_power.py [LOCK] [SEEDS] [REPEATS ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from runner.report.simulated import MAX_ORDER_TESTS
from runner.report.stats import ALPHA
from runner.spec.lock import load_lock
from tests.support.synthetic_ledger import position_p_values

DEFAULT_LOCK = Path(__file__).resolve().parents[1] / "locks" / "seed-54.toml"


def main(lock_path: Path, seeds: int, repeats: list[int]) -> int:
    base = load_lock(lock_path)
    for count in repeats:
        lock = base.model_copy(update={"repeats": count})
        design = (len(lock.harnesses), len(lock.tasks.ids), count)
        found = position_p_values(lock, "position", range(seeds))
        print(f"design {design}, {seeds} seeds: power at ALPHA / m, m = 1..{MAX_ORDER_TESTS}")
        for outcome, p_values in found.items():
            power = [
                sum(p <= ALPHA / m for p in p_values) / max(len(p_values), 1)
                for m in range(1, MAX_ORDER_TESTS + 1)
            ]
            print(f"  {outcome}: ({', '.join(f'{rate:.2f}' for rate in power)})")
    return 0


if __name__ == "__main__":
    lock_arg = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_LOCK
    seeds_arg = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    sys.exit(main(lock_arg, seeds_arg, [int(r) for r in sys.argv[3:]] or [3]))
