"""The analysis of a ledger (runner.run.analysis) on ledgers built to contradict it: an estimate
must lie inside its own interval, whatever cells are missing or lack a value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runner.core.files import read_model, write_model
from runner.freeze.manifest import FreezeManifest, OracleScore
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule, build_schedule
from runner.run import stats
from runner.run.analysis import (
    Comparison,
    batch_stats,
    cells_by_harness,
    compare,
    harness_pairs,
    unjudged_by_ledger,
)
from runner.run.receipt import SCRIPTED_PROVIDER_NOTE, build_receipt
from runner.run.report import describe, load_run, render_markdown
from runner.run.stats import Estimate, Interval
from runner.spec.lock import Lock, load_lock
from runner.verify.report import VerifyReport
from tests.support.freeze_factory import manifest_of
from tests.support.ledger_factory import line_for, new_run_dir
from tests.test_report_cli import passed_verify

SEED_LOCK = Path(__file__).resolve().parents[1] / "locks" / "seed-54.toml"
LOCK: Lock = load_lock(SEED_LOCK)
SCHEDULE: Schedule = build_schedule(LOCK)
GLM = SCHEDULE.batch("glm")


def comparisons(lines: list[LedgerLine]) -> dict[tuple[str, str, str], Comparison]:
    found = compare(harness_pairs(LOCK.harnesses), cells_by_harness(lines))
    return {(c.metric, c.subject, c.baseline): c for c in found}


def test_a_ratio_of_totals_uses_the_cells_its_interval_resamples() -> None:
    """Every cell 1,000 tokens; Bare Pi returned them in 3 of its 9 cells."""
    bare = [cell for cell in GLM.cells if cell.harness == "bare-pi"]
    lines = [line_for(cell, tokens=None if cell in bare[3:] else 1000) for cell in GLM.cells]
    tokens = comparisons(lines)[("provider_tokens", "openpi", "bare-pi")]
    assert tokens.ratio == 1.0 and tokens.clusters == 3 and tokens.pairs == 9
    assert (tokens.subject_value, tokens.baseline_value) == (3000, 3000)


def test_a_ratio_of_totals_leaves_out_the_cells_one_harness_lacks() -> None:
    """Every wall 10 s; 6 of OpenPI's cells have no ledger line."""
    openpi = [cell for cell in GLM.cells if cell.harness == "openpi"]
    lines = [line_for(cell) for cell in GLM.cells if cell not in openpi[3:]]
    wall = comparisons(lines)[("wall_seconds", "openpi", "bare-pi")]
    assert wall.ratio == 1.0 and wall.clusters == 3 and wall.pairs == 3


def inside(value: float | None, estimate: Estimate) -> bool:
    interval = estimate.interval
    if value is None or interval is None:
        return True
    return interval.low - 1e-9 <= value <= interval.high + 1e-9


def random_ledger(seed: int) -> list[LedgerLine]:
    """GLM's cells with random values, about a fifth without a ledger line and a third without
    provider tokens; walls, tokens and POSTs skewed (lognormal), some of them 0."""
    rng = np.random.default_rng(seed)
    lines = []
    for cell in GLM.cells:
        if rng.random() < 0.2:
            continue
        tokens = None if rng.random() < 0.3 else int(rng.lognormal(7, 1.5) * (rng.random() > 0.1))
        posts = int(rng.lognormal(1.5, 1))
        lines.append(
            line_for(
                cell,
                wall=round(float(rng.lognormal(4, 1)), 3),
                tokens=tokens,
                posts=posts,
                attempts=posts,
            )
        )
    return lines


@pytest.mark.parametrize("seed", range(20))
def test_every_estimate_lies_inside_its_interval(seed: int) -> None:
    lines = random_ledger(seed)
    pairs = harness_pairs(LOCK.harnesses)
    for comparison in compare(pairs, cells_by_harness(lines)):
        assert comparison.interval is None or (
            comparison.interval.low - 1e-9 <= comparison.ratio <= comparison.interval.high + 1e-9
        ), comparison
    found = batch_stats(LOCK, GLM, lines, pairs, unjudged_by_ledger(lines))
    for group in (*found.harnesses, *found.harness_tasks):
        for estimate in (group.wall_seconds, group.provider_tokens, group.physical_posts):
            assert inside(estimate.value, estimate), (group.label, estimate)
    for paired in found.comparisons:
        for ratio in paired.median_ratios:
            assert inside(ratio.ratio.value, ratio.ratio), (paired.subject, ratio)
    for position in found.order.positions:
        assert inside(position.wall_seconds.value, position.wall_seconds), position


def test_a_small_sample_gets_its_range_and_the_range_s_coverage() -> None:
    """3 clusters: a percentile interval is [min, max] whatever it is called; it covers the
    median with probability 1 - 2 x 0.5^3."""
    assert stats.range_coverage(3) == pytest.approx(0.75)
    assert stats.range_coverage(2) == pytest.approx(0.5)
    three = stats.median_estimate([4.0, 1.0, 9.0])
    assert (three.value, three.coverage, three.interval) == (4.0, 0.75, Interval(low=1, high=9))
    assert stats.median_estimate([4.0]).interval is None
    nine = stats.median_estimate([float(v) for v in range(9)])
    assert nine.coverage is None and nine.interval is not None
    ratio = stats.cluster_bootstrap(stats.ratio_of(stats.total), [[1, 2, 3], [2, 3, 4]])
    assert ratio.value == pytest.approx(6 / 9) and ratio.interval is None


def test_the_harness_task_table_states_what_its_intervals_cover(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    lines = [line_for(cell, wall=10.0 + cell.repeat) for cell in schedule.cells]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert (
        "| Bare Pi · git-leak-recovery | 3/3 = 1.000 [0.439, 1.000] | 12.0 [11.0, 13.0]: " in text
    )
    assert "range of 3, covers the median with probability 0.75 |" in text
    assert "median wall s [95 % CI]" not in text


def test_a_ratio_over_too_few_clusters_has_no_interval() -> None:
    openpi = [cell for cell in GLM.cells if cell.harness == "openpi"]
    lines = [line_for(cell) for cell in GLM.cells if cell not in openpi[3:]]
    labels = {h.id: h.label for h in LOCK.harnesses}
    wall = comparisons(lines)[("wall_seconds", "openpi", "bare-pi")]
    assert wall.interval is None
    assert describe(wall, labels, stats.Methods()).endswith(
        "; no interval (3 clusters: too few to bootstrap)"
    )


def test_a_ratio_whose_baseline_median_is_0_says_so(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    lines = [
        line_for(cell, posts=0 if cell.harness == "bare-pi" else 3, attempts=0)
        for cell in schedule.cells
    ]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert (
        "| Pi + OpenPI vs Bare Pi | physical POSTs | undefined: the baseline's median is 0 | 9 |"
        in text
    )


def unjudged_ledger() -> list[LedgerLine]:
    """GLM, its first task unjudged: OpenPI's trial passed it once, Bare Pi's and OMP's never;
    every other cell passes."""
    task = GLM.cells[0].task
    lines = []
    for cell in GLM.cells:
        if cell.task != task:
            lines.append(line_for(cell))
            continue
        trial = "pass" if (cell.harness, cell.repeat) == ("openpi", 1) else "fail"
        line = line_for(cell, outcome="indeterminate")
        update = {
            "reason": "unjudged: its oracle scored 0",
            "failure_class": "unjudged_task",
            "trial_outcome": trial,
        }
        lines.append(line.model_copy(update=update))
    return lines


def test_an_unjudged_task_s_cells_leave_the_pass_rates() -> None:
    lines = unjudged_ledger()
    found = batch_stats(LOCK, GLM, lines, harness_pairs(LOCK.harnesses), unjudged_by_ledger(lines))
    rates = {g.harness: g for g in found.harnesses}
    assert (rates["openpi"].passes.successes, rates["openpi"].passes.n) == (6, 6)
    assert (rates["bare-pi"].passes.successes, rates["bare-pi"].passes.n) == (6, 6)
    openpi = rates["openpi"].unjudged
    assert openpi is not None and (openpi.cells, openpi.trial_passes) == (3, 1)
    assert (openpi.as_pass.successes, openpi.as_fail.successes, openpi.as_fail.n) == (9, 6, 9)
    paired = next(c for c in found.comparisons if (c.subject, c.baseline) == ("openpi", "bare-pi"))
    assert (paired.passes.pairs, paired.passes.p_value) == (6, 1.0)
    as_pass, as_fail = paired.passes_with_unjudged
    assert (as_pass.indeterminate, as_pass.pairs, as_pass.subject_passed) == (
        "unjudged as pass",
        9,
        9,
    )
    assert (as_fail.indeterminate, as_fail.pairs, as_fail.subject_passed) == (
        "unjudged as fail",
        9,
        6,
    )
    assert found.overruled == {
        "ended early": 0,
        "verifier_setup": 0,
        "no_model_request": 0,
        "unjudged": 9,
    }


def test_the_report_shows_unjudged_cells_apart(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    lines = unjudged_ledger() + [line_for(cell) for cell in schedule.batch("luna").cells]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert "| Pi + OpenPI | 6/6 = 1.000 [0.610, 1.000] |" in text
    assert "| Pi + OpenPI | 3 | 1 | 2 | 9/9 = 1.000 [0.701, 1.000] | 6/9 = 0.667 " in text
    assert "by rule: ended early: 0; verifier_setup: 0; unjudged: 9; no_model_request: 0." in text
    assert "unjudged as pass: 9/9 vs 9/9" in text and "unjudged as fail: 6/9 vs 6/9" in text


def test_a_median_s_interval_is_the_percentile_bootstrap_s() -> None:
    """A percentile interval of a median lies inside the data's range; a basic bootstrap's
    (2 x estimate - percentiles) of this skewed sample would reach below its minimum."""
    skewed = [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 50.0, 60.0, 70.0]
    estimate = stats.median_estimate(skewed)
    assert estimate.value == 1.0 and estimate.coverage is None and estimate.interval is not None
    assert 1.0 <= estimate.interval.low <= estimate.interval.high <= 70.0
    assert estimate.interval.high > 1.0


def test_the_permutation_stays_inside_its_strata() -> None:
    """Groups that never vary inside a stratum cannot be told from the strata: p = 1, however
    far apart they are (a permutation across strata would find them at p < 0.001)."""
    values = [float(v) for v in range(40)]
    groups = [0] * 20 + [1] * 20
    test = stats.stratified_permutation(values, groups, groups)
    assert test.statistic > 25 and test.p_value == 1.0
    mixed = stats.stratified_permutation(values, groups, [0] * 40)
    assert mixed.p_value < 0.001


def unjudged_run_dir(seed_lock_path: Path, run_dir: Path, lines: list[LedgerLine]) -> RunPaths:
    """A run dir holding ``lines`` (every batch's other cells passing) and a final verify."""
    paths, schedule = new_run_dir(seed_lock_path, run_dir)
    recorded = {line.cell_id for line in lines}
    others = [line_for(cell) for cell in schedule.cells if cell.id not in recorded]
    ledger = Ledger(paths)
    for line in lines + others:
        ledger.append(line)
    passed_verify(paths)
    return paths


def keep_freeze(paths: RunPaths, task: str, reward: float, audited: bool = True) -> None:
    """freeze.json whose oracle of ``task`` scored ``reward``; the final verify audited it."""
    collected = {"kernel": "6.12", "packages": {}, "images": [], "listening": []}
    oracle = (OracleScore(task=task, reward=reward, seconds=1.0),)
    freeze = manifest_of({}, collected).model_copy(update={"oracle": oracle})
    write_model(paths.freeze_manifest, freeze)
    if audited:
        final = read_model(paths.final_verify, VerifyReport)
        update = {"freeze_manifest_sha256": freeze.sha256}
        write_model(paths.final_verify, final.model_copy(update=update))


def test_a_timed_out_cell_of_an_unjudged_task_leaves_the_pass_rates() -> None:
    """The runner overrules only a pass or a fail of an unjudged task: the cell that timed out
    stays indeterminate, yet says no more of the harness than its overruled neighbours."""
    task = GLM.cells[0].task
    lines = [
        line_for(next(c for c in GLM.cells if c.id == line.cell_id), outcome="indeterminate")
        if (line.task, line.harness, line.repeat) == (task, "openpi", 1)
        else line
        for line in unjudged_ledger()
    ]
    receipt = build_receipt(LOCK, SCHEDULE, lines, "clean", "passed")
    found = receipt.batches[0].stats
    assert found is not None
    openpi = next(g for g in found.harnesses if g.harness == "openpi")
    assert (openpi.passes.successes, openpi.passes.n) == (6, 6)
    assert openpi.unjudged is not None and openpi.unjudged.cells == 3


def test_a_run_recorded_before_the_rule_takes_its_unjudged_task_from_freeze_json(
    seed_lock_path: Path, tmp_path: Path
) -> None:
    """Every cell passed (no line says unjudged); the kept freeze's oracle of the first task
    scored 0: none of that task's passes counts, in any outcome."""
    task = GLM.cells[0].task
    paths = unjudged_run_dir(seed_lock_path, tmp_path / "run", [])
    keep_freeze(paths, task, 0.0)
    receipt = load_run(paths)
    assert receipt.unjudged is not None and receipt.unjudged.tasks == (task,)
    found = receipt.batches[0].stats
    assert found is not None
    openpi = next(g for g in found.harnesses if g.harness == "openpi")
    assert (openpi.passes.successes, openpi.passes.n) == (6, 6)
    row = next(g for g in found.harness_tasks if (g.harness, g.task) == ("openpi", task))
    assert row.passes.n == 0
    text = render_markdown(receipt)
    assert f"Unjudged tasks, from freeze.json (the freeze the final verify audited): {task}" in text
    assert f"| Pi + OpenPI · {task} | unjudged: 3 cells left out |" in text


def test_a_run_dir_without_freeze_json_says_which_rule_named_the_unjudged_tasks(
    seed_lock_path: Path, tmp_path: Path
) -> None:
    paths = unjudged_run_dir(seed_lock_path, tmp_path / "run", unjudged_ledger())
    text = render_markdown(load_run(paths))
    assert (
        "Unjudged tasks, by the ledger (the run dir keeps no freeze.json): a task any of whose "
        f"cells the cell runner overruled as unjudged: {GLM.cells[0].task}." in text
    )


def test_a_freeze_json_the_final_verify_did_not_audit_fails_the_run_closed(
    seed_lock_path: Path, tmp_path: Path
) -> None:
    task = GLM.cells[0].task
    paths = unjudged_run_dir(seed_lock_path, tmp_path / "run", [])
    keep_freeze(paths, task, 0.0, audited=False)
    receipt = load_run(paths)
    assert receipt.status == "failed_closed"
    kept = read_model(paths.freeze_manifest, FreezeManifest).sha256
    assert f"freeze.json: its sha256 is {kept}, the final verify audited sha256:{'0' * 64}" in (
        receipt.reasons
    )
    text = render_markdown(receipt)
    assert f"Unjudged tasks, from freeze.json (no final verify audited it): {task};" in text


def test_the_position_table_counts_its_medians_cells_and_its_judged_ones() -> None:
    receipt = build_receipt(LOCK, SCHEDULE, unjudged_ledger(), "clean", "passed")
    text = render_markdown(receipt)
    assert "cells)" not in text.split("### Order effects")[1].split("Test:")[0]
    assert "| 1 | 6/6 = 1.000 [0.610, 1.000] | 10.0 [10.0, 10.0] | 9 (6 judged) |" in text


def test_the_scripted_provider_note_is_on_the_batch_that_used_it(seed_lock_path: Path) -> None:
    glm = next(model for model in LOCK.models if model.id == "glm")
    scripted = glm.model_copy(update={"base_url": "scripted://local"})
    models = tuple(scripted if model.id == "glm" else model for model in LOCK.models)
    lock = LOCK.model_copy(update={"models": models})
    lines = [line_for(cell) for cell in SCHEDULE.cells]
    text = render_markdown(build_receipt(lock, SCHEDULE, lines, "clean", "passed"))
    run, glm_section, luna_section = text.split("\n## Batch ")
    assert "OFFLINE SCRIPTED PROVIDER" not in run + luna_section
    assert f"> {SCRIPTED_PROVIDER_NOTE}" in glm_section
    assert "| harness · task (scripted provider) |" in glm_section
    assert "(scripted provider)" not in luna_section
