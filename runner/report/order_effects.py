"""Order effects: pass rate and wall time by a cell's position inside its (task, repeat) block,
tested against position and against harness by stratified permutation (``runner.report.stats``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runner.core.models import FrozenModel
from runner.records.ledger import LedgerLine
from runner.records.schedule import Batch
from runner.report import stats
from runner.report.ledger_cells import judged, pass_rate, values
from runner.report.stats import Estimate, PermutationTest, Proportion


class PositionStats(FrozenModel):
    position: int = Field(ge=1, description="position of the cell inside its (task, repeat) block")
    passes: Proportion
    wall_seconds: Estimate
    # Every cell at the position (the wall median's), judged or not; None in older receipts.
    cells: int | None = None


class OrderTest(FrozenModel):
    """Position against harness on one outcome. The cyclic Latin square ties task to position
    within a harness whenever a task keeps its place in the block across repeats, so each test
    permutes only within the strata of the other two factors (harness x task, position x task);
    ``separable`` of ``strata`` harness x task strata see more than one position. None of them:
    the schedule cannot tell position from task, and both tests are None (receipts written
    before the strata have neither count). ``p_holm``: the test by position Holm-corrected
    across the run's ``tests`` order tests (outcomes x batches), which the verdict reads;
    ``power``: its simulated power at Holm's strictest step on this ``design`` (harnesses,
    tasks, repeats), None when not simulated; all None in receipts written before them."""

    outcome: Literal["pass", "wall_seconds"]
    by_position: PermutationTest | None
    by_harness: PermutationTest | None
    verdict: str
    separable: int | None = None
    strata: int | None = None
    p_holm: float | None = None
    tests: int | None = None
    design: tuple[int, int, int] | None = None
    power: float | None = None


class OrderEffects(FrozenModel):
    positions: tuple[PositionStats, ...]
    tests: tuple[OrderTest, ...]


NOT_SEPARABLE = "cannot separate position from task for this schedule: no verdict"


NO_ORDER_EFFECT = "no order effect detected"


ORDER_EFFECT = "order effect detected"


def order_verdict(p_value: float) -> str:
    """On the test by position alone: H by harness comes from another permutation scheme, so
    the two H are not compared."""
    return ORDER_EFFECT if p_value < stats.ALPHA else NO_ORDER_EFFECT


def strata_of(*factors: list[int]) -> list[tuple[int, ...]]:
    """Each cell's stratum: its levels of the given factors together."""
    return list(zip(*factors, strict=True))


def order_test(
    outcome: Literal["pass", "wall_seconds"],
    data: list[float],
    positions: list[int],
    harnesses: list[int],
    tasks: list[int],
) -> OrderTest:
    harness_tasks = strata_of(harnesses, tasks)
    seen: dict[tuple[int, ...], set[int]] = {}
    for stratum, position in zip(harness_tasks, positions, strict=True):
        seen.setdefault(stratum, set()).add(position)
    separable = sum(len(found) > 1 for found in seen.values())
    if not separable:
        return OrderTest(
            outcome=outcome,
            by_position=None,
            by_harness=None,
            verdict=NOT_SEPARABLE,
            separable=0,
            strata=len(seen),
        )
    by_position = stats.stratified_permutation(data, positions, harness_tasks)
    by_harness = stats.stratified_permutation(data, harnesses, strata_of(positions, tasks))
    return OrderTest(
        outcome=outcome,
        by_position=by_position,
        by_harness=by_harness,
        verdict=order_verdict(by_position.p_value),
        separable=separable,
        strata=len(seen),
    )


def order_effects(
    batch: Batch, lines: list[LedgerLine], harness_ids: list[str], unjudged: frozenset[str]
) -> OrderEffects:
    """Pass rate (over the judged cells) and wall time by the cell's position inside its block
    (Latin square rows)."""
    width = len(harness_ids)
    cell_of = {cell.id: cell for cell in batch.cells}  # position and harness as scheduled
    task_ids = sorted({line.task for line in lines})

    def test(outcome: Literal["pass", "wall_seconds"], cells: list[LedgerLine]) -> OrderTest:
        scheduled = [cell_of[line.cell_id] for line in cells]
        return order_test(
            outcome,
            [float(line.outcome == "pass") for line in cells]
            if outcome == "pass"
            else values(cells, "wall_seconds"),
            [(cell.position - 1) % width + 1 for cell in scheduled],
            [harness_ids.index(cell.harness) for cell in scheduled],
            [task_ids.index(cell.task) for cell in scheduled],
        )

    at = {
        p: [line for line in lines if (cell_of[line.cell_id].position - 1) % width + 1 == p]
        for p in range(1, width + 1)
    }
    return OrderEffects(
        positions=tuple(
            PositionStats(
                position=position,
                passes=pass_rate(cells, unjudged),
                wall_seconds=stats.median_estimate(values(cells, "wall_seconds")),
                cells=len(cells),
            )
            for position, cells in at.items()
        ),
        tests=(
            test("pass", judged(lines, unjudged)),
            test("wall_seconds", lines),
        ),
    )
