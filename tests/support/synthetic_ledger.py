"""Seeded synthetic ledgers with one known effect, for testing what the report finds.

Every cell's wall time is lognormal around 100 s and it passes with probability 0.8, unless the
effect touches it: then its wall is ``WALL_FACTOR`` times longer and it passes with probability
0.2. The effect touches the cells of one harness (``harness``: the lock's first), of one task
(``task``: the batch's first in schedule order), of the first position in each (task, repeat)
block (``position``), or none (``none``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from runner.records.ledger import LedgerLine
from runner.records.schedule import Batch, Cell, build_schedule
from runner.report.order_effects import NO_ORDER_EFFECT, OrderTest, order_effects
from runner.spec.lock import Lock
from tests.support.ledger_factory import line_for

Effect = Literal["none", "harness", "task", "position"]
EFFECTS: tuple[Effect, ...] = ("none", "harness", "task", "position")
WALL_FACTOR = 3.0
WALL_SIGMA = 0.3
PASS_RATE = 0.8
PASS_RATE_TOUCHED = 0.2


def touched(cell: Cell, batch: Batch, harness_ids: list[str], effect: Effect) -> bool:
    if effect == "harness":
        return cell.harness == harness_ids[0]
    if effect == "task":
        return cell.task == batch.cells[0].task
    if effect == "position":
        return (cell.position - 1) % len(harness_ids) == 0
    return False


def synthetic_ledger(
    batch: Batch, harness_ids: list[str], effect: Effect, seed: int
) -> list[LedgerLine]:
    rng = np.random.default_rng(seed)
    lines = []
    for cell in batch.cells:
        hit = touched(cell, batch, harness_ids, effect)
        wall = 100.0 * (WALL_FACTOR if hit else 1.0) * float(rng.lognormal(0.0, WALL_SIGMA))
        passes = rng.random() < (PASS_RATE_TOUCHED if hit else PASS_RATE)
        lines.append(line_for(cell, outcome="pass" if passes else "fail", wall=round(wall, 3)))
    return lines


def detects_position(test: OrderTest) -> bool:
    """The order verdict claims a position effect (either wording)."""
    return test.verdict != NO_ORDER_EFFECT and test.by_position is not None


def position_p_values(
    lock: Lock, effect: Effect, seeds: range
) -> dict[Literal["pass", "wall_seconds"], list[float]]:
    """Per outcome, the order test's p-value by position on a synthetic ledger with ``effect``
    for each seed, the seeds taking the lock's batches in turn (a schedule that cannot tell
    position from task gives none)."""
    schedule = build_schedule(lock)
    harness_ids = [harness.id for harness in lock.harnesses]
    found: dict[Literal["pass", "wall_seconds"], list[float]] = {"pass": [], "wall_seconds": []}
    for seed in seeds:
        batch = schedule.batches[seed % len(schedule.batches)]
        lines = synthetic_ledger(batch, harness_ids, effect, seed)
        for test in order_effects(batch, lines, harness_ids, frozenset()).tests:
            if test.by_position is not None:
                found[test.outcome].append(test.by_position.p_value)
    return found


def order_detection_rate(
    lock: Lock, effect: Effect, seeds: range
) -> dict[Literal["pass", "wall_seconds"], float]:
    """Per outcome, the share of seeds whose order verdict claims a position effect on a
    synthetic ledger with ``effect``, the seeds taking the lock's batches in turn. With any
    effect but ``position`` it is the verdict's false-positive rate."""
    schedule = build_schedule(lock)
    harness_ids = [harness.id for harness in lock.harnesses]
    claims: dict[Literal["pass", "wall_seconds"], int] = {"pass": 0, "wall_seconds": 0}
    for seed in seeds:
        batch = schedule.batches[seed % len(schedule.batches)]
        lines = synthetic_ledger(batch, harness_ids, effect, seed)
        for test in order_effects(batch, lines, harness_ids, frozenset()).tests:
            claims[test.outcome] += detects_position(test)
    return {outcome: count / len(seeds) for outcome, count in claims.items()}
