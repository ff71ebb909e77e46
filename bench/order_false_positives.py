"""The order verdict's false-positive rate: the share of seeded synthetic ledgers
(tests/support/synthetic_ledger.py) with no position effect (none, a harness effect, a task
effect) on which the report claims one, per outcome; and, beside it, how often it finds a real
position effect. Target: <= 0.06 at alpha 0.05 over 200 seeds.

    python bench/order_false_positives.py [LOCK] [SEEDS]
"""

from __future__ import annotations

import sys
from pathlib import Path

from runner.report.stats import ALPHA
from runner.spec.lock import load_lock
from tests.support.synthetic_ledger import EFFECTS, order_detection_rate

DEFAULT_LOCK = Path(__file__).resolve().parents[1] / "locks" / "seed-54.toml"


def main(lock_path: Path, seeds: int) -> int:
    lock = load_lock(lock_path)
    print(f"{lock_path.name}, {seeds} seeds, alpha {ALPHA}: share claiming a position effect")
    print(f"{'effect':10} {'pass/fail':>10} {'wall time':>10}")
    for effect in EFFECTS:
        rates = order_detection_rate(lock, effect, range(seeds))
        print(f"{effect:10} {rates['pass']:10.3f} {rates['wall_seconds']:10.3f}")
    return 0


if __name__ == "__main__":
    lock_arg = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_LOCK
    sys.exit(main(lock_arg, int(sys.argv[2]) if len(sys.argv) > 2 else 200))
