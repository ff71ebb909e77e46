"""A ledger with the totals published for the reference run: the receipt and the report must
derive the published comparisons from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.core.canonical import canonical_json
from runner.records.ledger import Ledger
from runner.report.receipt import Receipt, build_receipt
from runner.report.write import render_markdown
from runner.spec.lock import load_lock
from tests.support.ledger_factory import new_run_dir
from tests.support.reference_ledger import PUBLISHED, write_reference_ledger


@pytest.fixture
def reference_receipt(seed_lock_path: Path, tmp_path: Path) -> Receipt:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    write_reference_ledger(paths, schedule)
    lock = load_lock(paths.lock)
    return build_receipt(lock, schedule, Ledger(paths).lines(), "clean", "passed")


def comparison(receipt: Receipt, batch: str, metric: str, subject: str, baseline: str) -> float:
    """Percent difference of subject vs baseline; the receipt states each pair once, in one
    direction, so the other direction is its inverse."""
    found = next(b for b in receipt.batches if b.batch == batch).comparisons
    for c in found:
        if (c.metric, c.subject, c.baseline) == (metric, subject, baseline):
            return c.percent_difference
        if (c.metric, c.subject, c.baseline) == (metric, baseline, subject):
            return (1 / c.ratio - 1) * 100
    raise LookupError((batch, metric, subject, baseline))


def test_totals_match_published(reference_receipt: Receipt) -> None:
    for batch in reference_receipt.batches:
        for group in batch.harnesses:
            outcomes, wall, tokens, posts, attempts = PUBLISHED[(batch.batch, group.key)]
            t = group.totals
            assert (t.passed, t.failed, t.indeterminate) == outcomes
            assert t.wall_seconds == pytest.approx(wall, abs=1e-6)
            assert t.provider_tokens == tokens
            assert (t.physical_posts, t.logical_attempts) == (posts, attempts)
    glm, luna = reference_receipt.batches
    assert glm.status == "completed_with_indeterminate"
    assert luna.status == "completed"
    assert reference_receipt.status == "completed_with_indeterminate"
    assert {g.key: g.totals.unattributed_provider_post_requests for g in luna.harnesses}[
        "omp"
    ] == 18


def test_receipt_file_keeps_its_extra_posts_key(reference_receipt: Receipt) -> None:
    written = canonical_json(reference_receipt)
    luna = json.loads(written)["batches"][1]
    omp = next(group for group in luna["harnesses"] if group["key"] == "omp")
    assert omp["totals"]["extra_posts"] == 18
    assert Receipt.model_validate_json(written) == reference_receipt


def test_published_comparisons(reference_receipt: Receipt) -> None:
    r = reference_receipt
    # OpenPI uses 84.7 % fewer tokens than OMP (OMP = 6.56x OpenPI)
    assert round(comparison(r, "glm", "provider_tokens", "openpi", "omp"), 1) == -84.7
    omp_vs_openpi = comparison(r, "glm", "provider_tokens", "omp", "openpi")
    assert round(1 + omp_vs_openpi / 100, 2) == 6.56
    # OpenPI +32.9 % tokens vs Bare Pi
    assert round(comparison(r, "glm", "provider_tokens", "openpi", "bare-pi"), 1) == 32.9
    # Luna: OpenPI 58.2 % fewer physical requests, 36.2 % less wall than OMP
    assert round(comparison(r, "luna", "physical_posts", "openpi", "omp"), 1) == -58.2
    assert round(comparison(r, "luna", "wall_seconds", "openpi", "omp"), 1) == -36.2
    # OpenPI wall +1.9 % vs Bare Pi
    assert round(comparison(r, "luna", "wall_seconds", "openpi", "bare-pi"), 1) == 1.9
    # Luna returned no usage: no token comparison is invented for it
    luna = r.batches[1]
    assert not [c for c in luna.comparisons if c.metric == "provider_tokens"]


def test_markdown_states_published_figures(reference_receipt: Receipt) -> None:
    text = render_markdown(reference_receipt)
    assert "Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI)" in text
    assert "Pi + OpenPI vs Bare Pi, tokens: +32.9 %" in text
    assert "Pi + OpenPI vs OMP, physical POSTs: -58.2 %" in text
    assert "Pi + OpenPI vs OMP, wall time: -36.2 %" in text
    assert "Pi + OpenPI vs Bare Pi, wall time: +1.9 %" in text
    assert "| OMP | 4 | 5 | 0 | 1,803.368 | not returned | 110 | 92 | 18 |" in text
    assert "| Bare Pi | 7 | 1 | 1 | 2,647.724 | 249,625 | 94 | 94 | 0 |" in text
    assert "| 0 | 110 |" not in text  # a missing token count is never shown as 0
    assert "d1f1920f2d817a831f466d0ff363ef795a9a3b00" in text
    assert reference_receipt.identities.schedule_sha256 in text
