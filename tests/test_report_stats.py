"""The report's statistics: hand-checked values of the stats module, and the stats section the
receipt derives from the reference ledger and from ledgers built to break it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest
from scipy.stats import binom

from runner.records.ledger import LedgerLine
from runner.records.schedule import Cell, Schedule, build_schedule
from runner.report import stats
from runner.report.paired import PairedComparison, PassComparison, with_holm
from runner.report.receipt import BatchReceipt, Receipt, build_receipt
from runner.report.write import render_markdown
from runner.spec.lock import load_lock
from tests.support.ledger_factory import line_for
from tests.test_reference_report import reference_receipt  # noqa: F401  (fixture)
from tests.test_report_cli import reference_run, runner_cli

TOTALS: stats.CoverageMethod = "ratio of totals"


def batch_of(receipt: Receipt, batch: str) -> BatchReceipt:
    return next(b for b in receipt.batches if b.batch == batch)


def paired(receipt: Receipt, batch: str, subject: str, baseline: str) -> PairedComparison:
    found = batch_of(receipt, batch).stats
    assert found is not None
    return next(c for c in found.comparisons if (c.subject, c.baseline) == (subject, baseline))


def build(
    seed_lock_path: Path,
    outcome: Callable[[Cell], str] = lambda cell: "pass",
    wall: Callable[[Cell], float] = lambda cell: 10.0,
) -> Receipt:
    lock = load_lock(seed_lock_path)
    schedule: Schedule = build_schedule(lock)
    lines: list[LedgerLine] = [
        line_for(cell, outcome=outcome(cell), wall=wall(cell)) for cell in schedule.cells
    ]
    return build_receipt(lock, schedule, lines, "clean", "passed")


# --- the stats module against hand-checked values -------------------------------------------


def test_wilson_interval_of_seven_of_nine() -> None:
    proportion = stats.wilson(7, 9)
    assert proportion.interval is not None
    assert (round(proportion.interval.low, 3), round(proportion.interval.high, 3)) == (0.453, 0.937)
    assert stats.wilson(0, 0).interval is None


def test_holm_against_hand_checked_examples() -> None:
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx((0.03, 0.06, 0.06))
    # sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, max(0.06, 0.04); capped at 1
    assert stats.holm([0.04, 0.01, 0.03, 0.005]) == pytest.approx((0.06, 0.03, 0.06, 0.02))
    assert stats.holm([0.6, 0.9]) == pytest.approx((1.0, 1.0))


def test_exact_mcnemar_is_the_binomial_of_b_of_b_plus_c() -> None:
    assert stats.mcnemar_exact(3, 0) == pytest.approx(0.25)  # 2 x 0.5^3
    assert stats.mcnemar_exact(5, 2) == pytest.approx(58 / 128)  # 2 x (1 + 7 + 21) / 2^7
    assert stats.mcnemar_exact(2, 5) == stats.mcnemar_exact(5, 2)
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_detectable_difference_has_the_stated_power() -> None:
    # 9 pairs: p <= 0.05 needs b >= 6 of 6 discordant (2 x 0.5^6 = 0.031; 5 gives 0.0625)
    difference = stats.detectable_difference(9)
    assert difference is not None
    assert binom.sf(5, 9, difference) == pytest.approx(stats.POWER)
    assert stats.detectable_difference(5) is None  # 2 x 0.5^5 = 0.0625: never significant
    assert stats.detectable_difference(200) < difference  # type: ignore[operator]


def test_detectable_difference_takes_holm_s_alpha(reference_receipt: Receipt) -> None:  # noqa: F811
    # 3 pairs of harnesses: Holm's strictest step is 0.05 / 3, which needs b >= 7 of 7
    # (2 x 0.5^7 = 0.016; 6 gives 0.031), so 9 pairs need d = 0.82 for 80 % power, not 0.73
    difference = stats.detectable_difference(9, stats.ALPHA / 3)
    assert difference is not None and round(difference, 2) == 0.82
    assert binom.sf(6, 9, difference) == pytest.approx(stats.POWER)
    comparison = paired(reference_receipt, "luna", "openpi", "omp").passes
    assert comparison.detectable_difference == pytest.approx(difference)
    assert comparison.detectable_alpha == pytest.approx(stats.ALPHA / 3)
    text = render_markdown(reference_receipt)
    assert "by enumeration" not in text and "cannot be told from none" not in text
    assert "a lower bound on the pass-rate difference" in text


def test_paired_bootstrap_keeps_pairs_together() -> None:
    baseline = [1.0, 5.0, 2.0, 40.0, 3.0, 8.0, 100.0, 7.0, 9.0]
    subject = [2 * value for value in baseline]
    ratio = stats.cluster_bootstrap(stats.ratio_of(stats.total), [subject, baseline], TOTALS)
    assert ratio.value == pytest.approx(2.0) and ratio.clusters == 9
    assert ratio.interval is not None and ratio.all_equal
    assert (ratio.interval.low, ratio.interval.high) == pytest.approx((2.0, 2.0))
    spread = stats.cluster_bootstrap(stats.ratio_of(stats.total), [baseline, subject], TOTALS)
    assert spread.interval is not None and spread.all_equal
    assert stats.cluster_bootstrap(stats.median, [[]], TOTALS).value is None
    zero_baseline = stats.cluster_bootstrap(
        stats.ratio_of(stats.median), [[1, 2, 3], [0, 0, 0]], "ratio of medians"
    )
    assert zero_baseline.value is None and zero_baseline.interval is None


# --- the reference ledger ---------------------------------------------------------------------


def test_reference_pass_rates_carry_wilson_intervals(reference_receipt: Receipt) -> None:  # noqa: F811
    luna = batch_of(reference_receipt, "luna").stats
    assert luna is not None
    rates = {g.harness: g.passes for g in luna.harnesses}
    interval = rates["openpi"].interval
    assert interval is not None
    assert (round(interval.low, 3), round(interval.high, 3)) == (0.453, 0.937)
    assert rates["omp"].successes == 4 and rates["omp"].n == 9
    assert len(luna.harness_tasks) == 9
    assert "| Pi + OpenPI | 7/9 = 0.778 [0.453, 0.937] |" in render_markdown(reference_receipt)


def test_luna_openpi_vs_omp_has_its_mcnemar_p(reference_receipt: Receipt) -> None:  # noqa: F811
    comparison = paired(reference_receipt, "luna", "openpi", "omp").passes
    assert (comparison.subject_passed, comparison.baseline_passed) == (7, 4)
    assert (comparison.subject_only, comparison.baseline_only) == (3, 0)
    assert comparison.p_value == pytest.approx(0.25)
    assert comparison.p_holm == pytest.approx(0.75)  # 3 pairs: 0.25, 0.25, 1 -> 3 x 0.25
    text = render_markdown(reference_receipt)
    assert (
        "| Pi + OpenPI vs OMP | 9 | 7 | 4 | +0.333 | 3 | 0 | 0.250 | 0.750 | 0.82 (alpha 0.0167) |"
        in text
    )


def test_glm_token_ratio_has_its_interval(reference_receipt: Receipt) -> None:  # noqa: F811
    glm = batch_of(reference_receipt, "glm")
    tokens = next(
        c
        for c in glm.comparisons
        if (c.metric, c.subject, c.baseline) == ("provider_tokens", "openpi", "omp")
    )
    assert tokens.interval is not None and tokens.clusters == 9
    assert tokens.interval.low <= tokens.ratio <= tokens.interval.high
    assert round(tokens.ratio, 2) == 0.15
    text = render_markdown(reference_receipt)
    # A percentile bootstrap over 9 clusters covers about 0.85 (runner.report.simulated): the
    # report states that and no longer calls it a 95 % CI.
    assert tokens.coverage is not None and tokens.coverage < stats.SIMULATED_FLOOR
    assert (
        "Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI); "
        "interval of the ratio [0.15, 0.15] (covers 0.85 at 9 clusters, simulated) (9 clusters; "
        "percentile bootstrap of (task, repeat) clusters (scipy.stats.bootstrap), seed 13, 9999 "
        "resamples)"
    ) in text
    assert "95 % CI of the ratio" not in text


def test_each_pair_is_compared_once(reference_receipt: Receipt) -> None:  # noqa: F811
    for batch in reference_receipt.batches:
        pairs = [(c.metric, frozenset((c.subject, c.baseline))) for c in batch.comparisons]
        assert len(pairs) == len(set(pairs))
        assert batch.stats is not None
        assert len(batch.stats.comparisons) == len(list(combinations(batch.harnesses, 2)))
    text = render_markdown(reference_receipt)
    assert "OMP vs Pi + OpenPI" not in text and "Bare Pi vs Pi + OpenPI" not in text


def test_tokens_not_returned_stay_not_returned(reference_receipt: Receipt) -> None:  # noqa: F811
    luna = batch_of(reference_receipt, "luna").stats
    assert luna is not None
    assert all(g.provider_tokens.value is None for g in luna.harnesses)
    ratios = [r for c in luna.comparisons for r in c.median_ratios]
    assert all(r.ratio.value is None for r in ratios if r.metric == "provider_tokens")
    text = render_markdown(reference_receipt)
    assert "| OMP | 4/9 = 0.444 [0.189, 0.733] | 200.4 [200.4, 200.4] | not returned |" in text


def test_sensitivity_to_indeterminate_cells(reference_receipt: Receipt) -> None:  # noqa: F811
    # GLM Bare Pi has one indeterminate cell: excluded, its pair leaves the comparison
    comparison = paired(reference_receipt, "glm", "openpi", "bare-pi")
    assert comparison.passes.pairs == 9
    assert comparison.passes_without_indeterminate.pairs == 8
    assert comparison.passes_without_indeterminate.indeterminate == "excluded"
    assert "excluded: 7/8 vs 7/8" in render_markdown(reference_receipt)


def test_reference_run_shows_no_order_effect(reference_receipt: Receipt) -> None:  # noqa: F811
    for batch in reference_receipt.batches:
        assert batch.stats is not None
        assert [p.position for p in batch.stats.order.positions] == [1, 2, 3]
        assert {t.verdict for t in batch.stats.order.tests} == {"no order effect detected"}


# --- ledgers built to break it ----------------------------------------------------------------


def test_p_value_follows_the_pairs_not_the_totals(seed_lock_path: Path) -> None:
    """OpenPI 7/9 and OMP 4/9 in both ledgers; only which (task, repeat) each passes differs."""
    schedule = build_schedule(load_lock(seed_lock_path))
    blocks = list(dict.fromkeys((c.task, c.repeat) for c in schedule.batch("luna").cells))

    def outcomes(omp_passes: set[int]) -> Callable[[Cell], str]:
        def outcome(cell: Cell) -> str:
            index = blocks.index((cell.task, cell.repeat))
            passes = {"openpi": index < 7, "omp": index in omp_passes}.get(cell.harness, True)
            return "pass" if passes else "fail"

        return outcome

    nested = paired(build(seed_lock_path, outcomes({0, 1, 2, 3})), "luna", "openpi", "omp")
    crossed = paired(build(seed_lock_path, outcomes({0, 1, 7, 8})), "luna", "openpi", "omp")
    for comparison in (nested, crossed):
        assert (comparison.passes.subject_passed, comparison.passes.baseline_passed) == (7, 4)
    assert (nested.passes.subject_only, nested.passes.baseline_only) == (3, 0)
    assert nested.passes.p_value == pytest.approx(0.25)
    assert (crossed.passes.subject_only, crossed.passes.baseline_only) == (5, 2)
    assert crossed.passes.p_value == pytest.approx(58 / 128)


def test_a_position_effect_is_reported(seed_lock_path: Path) -> None:
    def wall(cell: Cell) -> float:
        # The first cell of every block is ten times slower, whatever its harness.
        return (100.0 if cell.position % 3 == 1 else 10.0) + cell.position % 5

    receipt = build(seed_lock_path, wall=wall)
    glm = batch_of(receipt, "glm").stats
    assert glm is not None
    wall = next(t for t in glm.order.tests if t.outcome == "wall_seconds")
    assert wall.by_position is not None and wall.by_position.p_value < 0.01
    # One Holm correction over both outcomes of both batches, and a verdict in lower case.
    assert wall.tests == 4 and wall.p_holm == pytest.approx(4 * wall.by_position.p_value)
    assert wall.verdict == "order effect detected"
    text = render_markdown(receipt)
    assert "wall time: **order effect detected**" in text
    assert "ORDER EFFECT" not in text and "explains more than harness" not in text
    # Its power against a stated effect, simulated for this design at Holm's strictest step.
    assert wall.power == 0.94
    assert (
        "power 0.94 against the first position of each block taking 3x the wall time "
        "(simulated, 3 harnesses x 3 tasks x 3 repeats, at alpha 0.05 / 4)" in text
    )


def test_order_tests_share_one_holm_correction_across_outcomes_and_batches(
    reference_receipt: Receipt,  # noqa: F811
) -> None:
    tests = [t for b in reference_receipt.batches if b.stats for t in b.stats.order.tests]
    raw = [t.by_position.p_value for t in tests if t.by_position is not None]
    assert len(raw) == 4 and all(t.tests == 4 for t in tests)
    assert [t.p_holm for t in tests] == pytest.approx(list(stats.holm(raw)))
    text = render_markdown(reference_receipt)
    assert "pass/fail: **no order effect detected**" in text
    assert (
        "power 0.25 against the first position of each block passing with 0.2 instead of " in text
    )


def test_a_design_without_simulated_power_says_so(seed_lock_path: Path) -> None:
    lock = load_lock(seed_lock_path).model_copy(update={"repeats": 4})
    schedule = build_schedule(lock)
    lines = [line_for(cell, wall=float(cell.position % 7)) for cell in schedule.cells]
    text = render_markdown(build_receipt(lock, schedule, lines, "clean", "passed"))
    assert "power not simulated for 3 harnesses x 3 tasks x 4 repeats with 4 order tests" in text


def test_the_detectable_difference_is_at_each_pair_s_own_holm_step() -> None:
    """9 pairs: the pair with the smallest p is tested at 0.05 / 3 (needs 0.82), the next at
    0.05 / 2, the last at 0.05 (needs 0.73), not all at the strictest step."""
    assert stats.holm_alphas([0.01, 0.5, 0.2]) == pytest.approx((0.05 / 3, 0.05, 0.05 / 2))
    comparisons = [
        PassComparison(
            indeterminate="as fail",
            pairs=9,
            subject_passed=passed,
            baseline_passed=0,
            difference=passed / 9,
            subject_only=passed,
            baseline_only=0,
            p_value=stats.mcnemar_exact(passed, 0),
            p_holm=0.0,
            detectable_difference=None,
        )
        for passed in (6, 1, 3)
    ]
    found = [round(c.detectable_difference or 0, 2) for c in with_holm(comparisons)]
    assert found == [0.82, 0.73, 0.82]
    last = stats.detectable_difference(9, 0.05)
    assert last is not None and binom.sf(5, 9, last) == pytest.approx(stats.POWER)


def test_stats_are_seeded(seed_lock_path: Path) -> None:
    def wall(cell: Cell) -> float:
        return float((cell.position * 37) % 23)

    first, second = build(seed_lock_path, wall=wall), build(seed_lock_path, wall=wall)
    assert first.model_dump() == second.model_dump()


# --- run directories and receipts from before the stats section -------------------------------


def test_report_on_a_run_dir_from_before_the_stats(seed_lock_path: Path, tmp_path: Path) -> None:
    paths = reference_run(seed_lock_path, tmp_path / "run", secrets.token_urlsafe(24))
    old_lines = []
    for raw in paths.ledger.read_text().splitlines():
        line = json.loads(raw)
        del line["artifacts"], line["phase_seconds"]  # fields a first ledger did not have
        old_lines.append(json.dumps(line))
    paths.ledger.write_text("\n".join(old_lines) + "\n")
    result = runner_cli("report", str(paths.run_dir))
    assert result.returncode == 0, result.stderr
    receipt = json.loads(paths.receipt.read_text())
    assert receipt["batches"][1]["stats"]["comparisons"][1]["passes"]["p_value"] == 0.25
    assert "### Paired comparisons" in paths.report_md.read_text()
    page = paths.report_html.read_text()
    assert "<h3>Paired comparisons</h3>" in page and 'class="state-not-run"' not in page
    assert f'href="trials/{json.loads(old_lines[0])["cell_id"]}/"' in page


def test_an_old_receipt_still_loads(reference_receipt: Receipt) -> None:  # noqa: F811
    old = reference_receipt.model_dump(mode="json")
    for batch in old["batches"]:
        del batch["stats"]
        for comparison in batch["comparisons"]:
            del comparison["interval"], comparison["clusters"]
    loaded = Receipt.model_validate(old)
    assert all(batch.stats is None for batch in loaded.batches)
    text = render_markdown(loaded)
    assert "Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI)\n" in text
    assert "### Paired comparisons" not in text
