"""The analysis of a ledger (runner.report.analysis) on ledgers built to contradict it: an estimate
must lie inside its own interval, whatever cells are missing or lack a value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runner.core.files import read_model, write_model
from runner.core.models import updated
from runner.freeze.manifest import FreezeManifest, OracleScore
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule, build_schedule
from runner.report import stats
from runner.report.analysis import (
    Comparison,
    batch_stats,
    compare,
    harness_pairs,
    unjudged_by_ledger,
)
from runner.report.batch_sections import describe
from runner.report.document import Paragraph, Strong
from runner.report.evidence import load_run
from runner.report.ledger_cells import cells_by_harness
from runner.report.receipt import SCRIPTED_PROVIDER_NOTE, build_receipt
from runner.report.stats import Estimate, Interval
from runner.report.stats_sections import these_tasks_only
from runner.report.write import render_markdown
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


def test_a_median_gets_its_exact_order_statistic_interval() -> None:
    """3 values: the range, which covers the median with probability 1 - 2 x 0.5^3 = 0.75; 7
    values: the range (0.984), not the percentile bootstrap's [X(2), X(6)] (0.875); 9 values:
    [X(2), X(8)] (0.961)."""
    assert stats.order_statistic_coverage(3, 1) == pytest.approx(0.75)
    assert stats.order_statistic_coverage(7, 2) == pytest.approx(0.875)
    three = stats.median_estimate([4.0, 1.0, 9.0])
    assert (three.value, three.coverage, three.interval) == (4.0, 0.75, Interval(low=1, high=9))
    assert not three.labelled_confidence
    assert stats.median_estimate([4.0]).interval is None
    seven = stats.median_estimate([float(v) for v in range(7)])
    assert seven.interval == Interval(low=0, high=6) and seven.labelled_confidence
    assert seven.coverage == pytest.approx(1 - 2 * 0.5**7)
    nine = stats.median_estimate([float(v) for v in range(9)])
    assert nine.interval == Interval(low=1, high=7) and nine.coverage == pytest.approx(0.9609375)
    ratio = stats.cluster_bootstrap(
        stats.ratio_of(stats.total), [[1, 2], [2, 3]], "ratio of totals"
    )
    assert ratio.value == pytest.approx(3 / 5) and ratio.interval is None


def test_equal_values_say_so_instead_of_a_zero_width_interval(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    lines = [line_for(cell, wall=42.0) for cell in schedule.cells]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert "| Bare Pi | 9/9 = 1.000 [0.701, 1.000] | 42.0 (all 9 values equal) |" in text
    assert "[42.0, 42.0]" not in text


def test_the_harness_task_table_states_what_its_intervals_cover(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path)
    schedule = build_schedule(lock)
    lines = [line_for(cell, wall=10.0 + cell.repeat) for cell in schedule.cells]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert (
        "| Bare Pi · git-leak-recovery | 3/3 = 1.000 [0.439, 1.000] | "
        "12.0 [11.0, 13.0] (covers 0.750 at 3 values, exact) |" in text
    )
    assert "median wall s [95 % CI]" not in text


def test_a_ratio_over_too_few_clusters_has_no_interval() -> None:
    openpi = [cell for cell in GLM.cells if cell.harness == "openpi"]
    lines = [line_for(cell) for cell in GLM.cells if cell not in openpi[2:]]
    labels = {h.id: h.label for h in LOCK.harnesses}
    wall = comparisons(lines)[("wall_seconds", "openpi", "bare-pi")]
    assert wall.interval is None
    assert describe(wall, labels, stats.Methods()).endswith(
        "; no interval (2 clusters: too few to bootstrap)"
    )


def test_a_ratio_over_3_clusters_states_its_simulated_coverage() -> None:
    openpi = [cell for cell in GLM.cells if cell.harness == "openpi"]
    lines = [
        line_for(cell, wall=10.0 + cell.repeat + cell.position % 4)
        for cell in GLM.cells
        if cell not in openpi[3:]
    ]
    labels = {h.id: h.label for h in LOCK.harnesses}
    wall = comparisons(lines)[("wall_seconds", "openpi", "bare-pi")]
    assert wall.interval is not None and wall.coverage == 0.715
    assert "(covers 0.71 at 3 clusters, simulated) (3 clusters;" in describe(
        wall, labels, stats.Methods()
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


def test_a_median_s_interval_is_inside_the_data() -> None:
    """An order-statistic interval of a median lies inside the data's range; a basic bootstrap's
    (2 x estimate - percentiles) of this skewed sample would reach below its minimum."""
    skewed = [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 50.0, 60.0, 70.0]
    estimate = stats.median_estimate(skewed)
    assert estimate.value == 1.0 and estimate.interval == Interval(low=1.0, high=60.0)
    assert estimate.coverage_from == "exact" and estimate.labelled_confidence


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
    assert "| 1 | 6/6 = 1.000 [0.610, 1.000] | 10.0 (all 9 values equal) | 9 (6 judged) |" in text


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


# --- the task as the cluster (#35 item 2) ------------------------------------------------------


def test_the_clustered_standard_error_of_a_task_every_harness_fails() -> None:
    """9/12 over 4 tasks of 3 repeats, one task failed every time: clustered by task the
    standard error is 0.25, the binomial 0.125, a design effect of 4."""
    found = stats.task_clustered(
        [3, 3, 3, 0], [3, 3, 3, 3], [1.0] * 9 + [0.0] * 3, "pass rate over tasks"
    )
    assert found.estimate.value == pytest.approx(0.75)
    assert found.standard_error == pytest.approx(0.25)
    assert found.independent_standard_error == pytest.approx(0.125)
    assert found.design_effect == pytest.approx(4.0)
    assert found.estimate.coverage == 0.807 and not found.estimate.labelled_confidence


def failed_task_ledger() -> list[LedgerLine]:
    """GLM: every harness fails its first task in every repeat, and Bare Pi one more cell."""
    task = GLM.cells[0].task
    bare = next(c for c in GLM.cells if c.harness == "bare-pi" and c.task != task)
    return [
        line_for(cell, outcome="fail" if cell.task == task or cell == bare else "pass")
        for cell in GLM.cells
    ]


def test_the_report_gives_each_rate_and_difference_with_the_task_as_the_cluster() -> None:
    lines = failed_task_ledger()
    found = batch_stats(LOCK, GLM, lines, harness_pairs(LOCK.harnesses), unjudged_by_ledger(lines))
    openpi = next(g for g in found.harnesses if g.harness == "openpi")
    assert openpi.clustered is not None and openpi.clustered.design_effect == pytest.approx(4.5)
    assert openpi.clustered.standard_error == pytest.approx(1 / 3)
    paired = next(c for c in found.comparisons if (c.subject, c.baseline) == ("openpi", "bare-pi"))
    assert sorted((t.pairs, t.subject_only, t.baseline_only) for t in paired.by_task) == [
        (3, 0, 0),
        (3, 0, 0),
        (3, 1, 0),
    ]
    assert paired.difference_over_tasks is not None
    assert paired.difference_over_tasks.estimate.value == pytest.approx(1 / 9)
    text = render_markdown(build_receipt(LOCK, SCHEDULE, lines, "clean", "passed"))
    assert "| Pi + OpenPI | 3 | 6/9 = 0.667 [0.354, 0.879] | 0.667 [" in text
    assert "(covers 0.75 at 3 tasks, simulated) | 0.333 | 0.157 | 4.50 |" in text
    assert "**These conclusions hold for these 3 tasks only**" in text
    assert "Assumes: McNemar, the (task, repeat) pairs independent" in text
    assert f"{GLM.cells[0].task}: 3, 0, 0, 0, 0" in text


def test_pass_at_k_and_pass_hat_k() -> None:
    assert stats.pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3) / C(5,3)
    assert stats.pass_hat_k(5, 4, 3) == pytest.approx(4 / 10)  # C(4,3) / C(5,3)
    assert (stats.pass_at_k(3, 1, 3), stats.pass_hat_k(3, 2, 3)) == (1.0, 0.0)
    assert stats.pass_at_k(2, 2, 3) is None
    lines = failed_task_ledger()
    found = batch_stats(LOCK, GLM, lines, harness_pairs(LOCK.harnesses), unjudged_by_ledger(lines))
    openpi = next(g for g in found.harnesses if g.harness == "openpi")
    assert openpi.repeated is not None
    assert (openpi.repeated.k, openpi.repeated.tasks) == (3, 3)
    assert openpi.repeated.pass_at_k == pytest.approx(2 / 3)
    assert openpi.repeated.pass_hat_k == pytest.approx(2 / 3)
    text = render_markdown(build_receipt(LOCK, SCHEDULE, lines, "clean", "passed"))
    assert "| n clusters | pass@3 | pass^3 |" in text


def test_a_run_of_one_task_says_its_conclusions_hold_for_that_task_only() -> None:
    lines = failed_task_ledger()
    stats = batch_stats(LOCK, GLM, lines, harness_pairs(LOCK.harnesses), unjudged_by_ledger(lines))
    task = GLM.cells[0].task
    one_task = [group for group in stats.harness_tasks if group.task == task]
    (paragraph,) = these_tasks_only(updated(stats, harness_tasks=tuple(one_task)))
    assert isinstance(paragraph, Paragraph)
    assert paragraph.text[0] == Strong("These conclusions hold for this task only")
