"""The ledger: append-only, fsynced lines; resume skips finished cells and keeps interrupted
attempts as evidence without counting them; reconciliation fails closed."""

from __future__ import annotations

import pytest

from runner.core.canonical import sha256_digest
from runner.core.errors import InputError, RunnerError
from runner.records.ledger import Ledger, LedgerLine, chain_seed, check_chain
from runner.report.receipt import build_receipt
from runner.spec.lock import load_lock
from tests.support.ledger_factory import line_for, new_run_dir


def test_append_and_reload(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    ledger = Ledger(paths)
    first = ledger.append(line_for(schedule.cells[0]))
    assert ledger.lines() == [first]
    assert first.previous_sha256 == chain_seed(schedule)  # the first link: the run's identity
    raw = paths.ledger.read_text()
    assert raw.endswith("\n") and '"unattributedProviderPostRequests":0' in raw
    with pytest.raises(RunnerError, match="already in the ledger"):
        ledger.append(first)
    assert ledger.lines() == [first]


def test_unattributed_posts_must_match_counts(seed_lock_path, tmp_path) -> None:
    _, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    good = line_for(schedule.cells[0], posts=5, attempts=3)
    assert good.unattributed_provider_post_requests == 2
    data = good.model_dump(by_alias=True)
    data["unattributedProviderPostRequests"] = 0
    with pytest.raises(ValueError, match="unattributedProviderPostRequests"):
        LedgerLine.model_validate(data)


def test_resume_skips_finished_and_keeps_interrupted_attempt(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    ledger = Ledger(paths)
    done, interrupted, *_rest = schedule.cells
    ledger.begin_attempt(done)
    ledger.finish(line_for(done))
    ledger.begin_attempt(interrupted)  # ... and the runner is killed here

    resumed = Ledger(paths)  # a new process
    pending = resumed.pending(schedule.cells)
    assert pending[0] == interrupted and done not in pending
    assert len(pending) == len(schedule.cells) - 1
    record = resumed.begin_attempt(interrupted)
    assert record.attempt == 2
    history = resumed.attempts(interrupted.id)
    assert [(r.attempt, r.status) for r in history] == [(1, "interrupted"), (2, "started")]
    resumed.finish(line_for(interrupted, attempt=2))
    assert [r.status for r in resumed.attempts(interrupted.id)] == ["interrupted", "finished"]
    assert [r.status for r in resumed.attempts(done.id)] == ["finished"]
    # one sample per cell, never two
    assert [line.cell_id for line in resumed.lines()] == [done.id, interrupted.id]


def test_torn_last_line_is_kept_as_evidence_and_cell_reruns(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    ledger = Ledger(paths)
    ledger.append(line_for(schedule.cells[0]))
    torn = line_for(schedule.cells[1]).model_dump_json(by_alias=True)[:40]
    with paths.ledger.open("a") as handle:
        handle.write(torn)  # killed mid-write: no newline
    assert ledger.repair_torn_tail()
    assert [line.cell_id for line in ledger.lines()] == [schedule.cells[0].id]
    fragments = list(paths.attempts_dir.glob("torn-ledger-tail-*.txt"))
    assert len(fragments) == 1 and fragments[0].read_text() == torn
    assert not ledger.repair_torn_tail()


def test_corrupt_complete_line_is_one_clear_error(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    Ledger(paths).append(line_for(schedule.cells[0]))
    with paths.ledger.open("a") as handle:
        handle.write('{"cell_id": "x"}\n')
    with pytest.raises(InputError, match=r"cells.jsonl:2: "):
        Ledger(paths).lines()


def test_fewer_physical_posts_than_logical_attempts_fails_closed(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    lines = [line_for(cell) for cell in schedule.cells]
    lines[5] = line_for(schedule.cells[5], posts=3, attempts=4)
    receipt = build_receipt(load_lock(paths.lock), schedule, lines, "clean", "passed")
    glm, luna = receipt.batches
    assert glm.status == "failed_closed"
    assert any("3 physical POSTs < 4 logical attempts" in r for r in glm.reasons)
    assert luna.status == "completed"
    assert receipt.status == "failed_closed"


def test_posts_the_proxy_could_not_send_cover_logical_attempts(seed_lock_path, tmp_path) -> None:
    """An unreachable provider: the harness's attempt ended on the proxy's 502, no POST sent."""
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    lines = [line_for(cell) for cell in schedule.cells]
    lines[5] = line_for(schedule.cells[5], posts=1).model_copy(update={"unsent_posts": 1})
    lines[6] = line_for(schedule.cells[6], posts=1, attempts=4).model_copy(
        update={"unsent_posts": 2}
    )
    assert lines[5].reconciles and not lines[6].reconciles
    receipt = build_receipt(load_lock(paths.lock), schedule, lines, "clean", "passed")
    reasons = [reason for batch in receipt.batches for reason in batch.reasons]
    assert reasons == [f"{lines[6].cell_id}: 1 physical POSTs + 2 unsent < 4 logical attempts"]


def test_missing_cells_or_evidence_fail_closed(seed_lock_path, tmp_path) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    lock = load_lock(paths.lock)
    lines = [line_for(cell) for cell in schedule.cells]
    assert build_receipt(lock, schedule, lines, "clean", "passed").status == "completed"
    partial = build_receipt(lock, schedule, lines[:-1], "clean", "passed")
    assert partial.batches[1].reasons == ("1 of 27 cells have no ledger line",)
    for scan, verify in (("leaks", "passed"), ("missing", "passed"), ("clean", "failed")):
        receipt = build_receipt(lock, schedule, lines, scan, verify)  # type: ignore[arg-type]
        assert receipt.status == "failed_closed"


def test_the_chain_links_every_line_and_an_old_ledger_is_unchained(
    seed_lock_path, tmp_path
) -> None:
    paths, schedule = new_run_dir(seed_lock_path, tmp_path / "run")
    ledger = Ledger(paths)
    first, second = (ledger.append(line_for(cell)) for cell in schedule.cells[:2])
    raw = paths.ledger.read_bytes().splitlines()
    assert second.previous_sha256 == sha256_digest(raw[0])
    chain = ledger.chain()
    assert chain is not None and (chain.state, chain.lines) == ("intact", 2)
    assert chain.head == sha256_digest(raw[1]) and chain.seed == first.previous_sha256
    # A line from before the chain keeps its bytes (a late field left out at its default).
    old = line_for(schedule.cells[2])
    assert "previous_sha256" not in old.model_dump_json()
    assert check_chain(old.model_dump_json().encode(), chain.seed).state == "unchained"
    swapped = b"\n".join([raw[1], raw[0]])
    assert check_chain(swapped, chain.seed).broken_at == (
        f"cells.jsonl line 1 ({second.cell_id}): previous_sha256 is not the chain's seed"
    )
