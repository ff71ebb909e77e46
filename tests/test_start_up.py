"""Start-up apart from work (each cell's agent phase split at its first model request, in the
ledger and per harness in the report) and the harness's compiled cache (the lock's field, the
run script's reading, what the receipt says held; a warm cache planned, copied in, counted)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

import pytest

from runner.cells.cell import start_up
from runner.core.roots import REPO_ROOT
from runner.guest.agent_plan import (
    CONTAINER,
    SCRIPT_OPTIONS,
    AgentPlan,
    CompiledCacheReading,
    install_script,
    run_script,
    then_record_cgroup,
    warm_script,
)
from runner.lab.harbor_result import HarborTrialResult
from runner.proxy.models import ProxyCellCounts, RequestLogEntry
from runner.records.ledger import LedgerLine
from runner.records.schedule import build_schedule
from runner.report.markdown import markdown
from runner.report.receipt import build_receipt, compiled_caches
from runner.report.write import document
from runner.spec.lock import Lock, load_lock
from tests.support.ledger_factory import line_for

SEED_ARM64 = REPO_ROOT / "locks" / "seed-arm64.toml"
AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def lock() -> Lock:
    return load_lock(SEED_ARM64)


def entry(seconds: float, outcome: str = "forwarded") -> RequestLogEntry:
    return RequestLogEntry(
        cell_id="c",
        started_at=AT + timedelta(seconds=seconds),
        method="POST",
        path="/v1/chat/completions",
        outcome=outcome,  # type: ignore[arg-type]
        status=200 if outcome == "forwarded" else 401,
        request_bytes=10,
        response_bytes=10,
        duration_ms=5,
    )


def counts(*entries: RequestLogEntry) -> ProxyCellCounts:
    return ProxyCellCounts(
        cell_id="c",
        model="m",
        provider="offline-scripted",
        opened_at=AT,
        closed_at=AT + timedelta(minutes=5),
        physical_posts=len(entries),
        rejected_requests=0,
        usage_returned=True,
        requests=entries,
    )


def harbor(started: float | None, finished: float | None) -> HarborTrialResult:
    def at(seconds: float | None) -> str | None:
        return None if seconds is None else (AT + timedelta(seconds=seconds)).isoformat()

    return HarborTrialResult.model_validate(
        {"agent_execution": {"started_at": at(started), "finished_at": at(finished)}}
    )


def test_the_agent_phase_splits_at_the_first_model_request() -> None:
    # A refused request (wrong bearer) at 2 s is not the harness asking the model.
    split = start_up(harbor(1.0, 100.0), counts(entry(40.0), entry(2.0, "rejected"), entry(30.5)))
    assert (split.to_first_request, split.after_first_request) == (29.5, 69.5)


@pytest.mark.parametrize(
    ("result", "records"),
    [
        (None, counts(entry(3.0))),
        (harbor(None, 9.0), counts(entry(3.0))),
        (harbor(1.0, 9.0), counts()),
        (harbor(1.0, 9.0), counts(entry(3.0, "rejected"))),
        (harbor(1.0, 9.0), None),
    ],
)
def test_no_split_without_an_agent_phase_or_a_model_request(
    result: HarborTrialResult | None, records: ProxyCellCounts | None
) -> None:
    split = start_up(result, records)
    assert (split.to_first_request, split.after_first_request) == (None, None)


def test_a_split_without_the_phase_s_end_keeps_its_start_up() -> None:
    split = start_up(harbor(1.0, None), counts(entry(4.0)))
    assert (split.to_first_request, split.after_first_request) == (3.0, None)


def test_old_ledger_lines_load_and_new_ones_omit_what_they_do_not_record(lock: Lock) -> None:
    cell = build_schedule(lock).cells[0]
    line = line_for(cell)
    text = line.model_dump_json(by_alias=True)
    for name in ("stand_in", "time_to_first_request_seconds", "compiled_cache"):
        assert name not in text
    assert LedgerLine.model_validate_json(text) == line
    recorded = line.model_copy(
        update={
            "time_to_first_request_seconds": 12.5,
            "compiled_cache": CompiledCacheReading(entries_before=0, entries_after=3),
        }
    )
    again = LedgerLine.model_validate_json(recorded.model_dump_json(by_alias=True))
    assert again.time_to_first_request_seconds == 12.5
    assert again.compiled_cache == CompiledCacheReading(entries_before=0, entries_after=3)


def lines_with_start_up(lock: Lock, before: int = 0) -> list[LedgerLine]:
    """Every cell of the lock: Bare Pi starts in 2-4 s and compiles nothing, Pi + OpenPI in
    60-62 s compiling cold (or warm, with ``before`` entries)."""
    lines = []
    for cell in build_schedule(lock).cells:
        openpi = cell.harness == "pi-openpi"
        startup = (60.0 if openpi else 2.0) + cell.repeat - 1
        cache = CompiledCacheReading(
            entries_before=before if openpi else 0, entries_after=5 * openpi
        )
        lines.append(
            line_for(cell).model_copy(
                update={
                    "time_to_first_request_seconds": startup,
                    "agent_after_first_request_seconds": 30.0 + cell.repeat,
                    "compiled_cache": cache,
                }
            )
        )
    return lines


def test_the_report_gives_start_up_and_work_medians_per_harness(lock: Lock) -> None:
    schedule = build_schedule(lock)
    receipt = build_receipt(lock, schedule, lines_with_start_up(lock), "clean", "passed")
    batch = receipt.batches[0]
    assert batch.requests is not None
    medians = {
        group.label: [figure.spread.median for figure in group.start_up] for group in batch.requests
    }
    assert medians == {"Bare Pi": [3.0, 32.0], "Pi + OpenPI": [61.0, 32.0]}
    text = markdown(document(receipt))
    assert "Start-up apart from work per harness" in text
    rows = [r for r in text.splitlines() if r.startswith("| Pi + OpenPI | 9 | 0 | 61.0")]
    row = "| Pi + OpenPI | 9 | 0 | 61.0 [60.0-62.0] (60.0-62.0) | 32.0 [31.0-33.0] (31.0-33.0) |"
    assert rows == [row, row]  # one table per batch


def test_the_receipt_names_the_compiled_caches_asked_and_held(lock: Lock) -> None:
    schedule = build_schedule(lock)
    lines = lines_with_start_up(lock, before=5)
    receipt = build_receipt(lock, schedule, lines, "clean", "passed")
    assert receipt.compiled_caches is not None
    held = {cache.harness: (cache.asked, cache.held) for cache in receipt.compiled_caches}
    assert held == {"bare-pi": ("cold", "nothing compiled"), "pi-openpi": ("warm", "warm")}
    assert receipt.status == "completed"
    text = markdown(document(receipt))
    assert (
        "| harness pi-openpi compiled cache | asked warm; held warm (18 cells recorded) |" in text
    )


@pytest.mark.parametrize(("asked", "before", "held"), [("cold", 5, "warm"), ("warm", 0, "cold")])
def test_caches_held_other_than_asked_fail_the_receipt_closed(
    lock: Lock, asked: str, before: int, held: str
) -> None:
    openpi = lock.harnesses[1].model_copy(update={"compiled_cache": asked})
    asking = lock.model_copy(update={"harnesses": (lock.harnesses[0], openpi)})
    lines = lines_with_start_up(asking, before=before)
    receipt = build_receipt(asking, build_schedule(asking), lines, "clean", "passed")
    assert receipt.status == "failed_closed"
    assert (
        f"harness pi-openpi: compiled caches asked {asked}; held {held} (18 cells recorded)"
        in receipt.reasons
    )


def test_a_lock_without_the_field_is_cold_by_default_and_says_so() -> None:
    demo = load_lock(REPO_ROOT / "locks" / "demo.toml")
    (first, *_) = compiled_caches(demo, [])
    assert (first.asked, first.default, first.held) == ("cold", True, "not recorded")
    assert first.line == "asked cold (the default, cold); held not recorded (0 cells recorded)"
    cells = [c for c in build_schedule(demo).cells if c.harness == "pi-openpi"]
    mixed = [
        line_for(cell).model_copy(
            update={"compiled_cache": CompiledCacheReading(entries_before=n, entries_after=1)}
        )
        for n, cell in enumerate(cells[:2])
    ]
    assert len(mixed) == 2
    assert compiled_caches(demo, mixed)[1].held == "mixed"
    assert compiled_caches(demo, mixed[:1])[1].held == "cold"


@pytest.mark.parametrize("cached", [1, None], ids=["warm", "no-cache-yet"])
def test_the_run_script_reads_the_compiled_cache_around_the_harness(
    lock: Lock, tmp_path: Path, cached: int | None
) -> None:
    """The lines as the script has them, under its own shell options (Harbor's pipefail among
    them): with a cache of one entry, and with no cache directory at all (a cold cell, where a
    failing count once ended the script with ls's exit 2 before the harness started)."""
    plan = AgentPlan(
        harness=lock.harnesses[1],
        model=lock.models[0],
        runtime_version="22.23.5",
        artifacts_dir="/bench/artifacts",
        proxy_base_url="http://10.0.2.100:8080",
    )
    script = run_script(plan, "go")
    assert str(CONTAINER.compiled_cache) in script
    assert (
        script.index("cache_before=")
        < script.index(str(plan.command))
        < script.index("cache_after=")
    )
    if cached is not None:
        (tmp_path / "jiti").mkdir()
        (tmp_path / "jiti" / "old.cjs").write_text("")
    reading = tmp_path / "compiled-cache.json"
    lines = [
        line.replace(str(CONTAINER.compiled_cache), str(reading)) for line in script.splitlines()
    ]
    before = next(line for line in lines if line.startswith("cache_before="))
    after = [line for line in lines if line.startswith(("cache_after=", "printf '{\"entries"))]
    # The "harness" compiles 2 files and exits 4.
    jiti = tmp_path / "jiti"
    harness = f"(mkdir -p {jiti}; touch {jiti}/a.cjs {jiti}/b.cjs; exit 4)"
    body = then_record_cgroup(harness, PurePosixPath(tmp_path / "cgroup.json"), after=tuple(after))
    done = subprocess.run(
        ["bash", "-c", "\n".join([lines[0], before, *body])],
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert lines[0] == SCRIPT_OPTIONS
    assert done.returncode == 4
    held = cached or 0
    assert CompiledCacheReading.model_validate_json(reading.read_text()) == CompiledCacheReading(
        entries_before=held, entries_after=held + 2
    )


def _plan(lock: Lock, compiled_cache: str, artifacts_dir: str = "/bench/artifacts") -> AgentPlan:
    return AgentPlan(
        harness=lock.harnesses[1].model_copy(update={"compiled_cache": compiled_cache}),
        model=lock.models[0],
        runtime_version=lock.tools.node,
        artifacts_dir=artifacts_dir,
        proxy_base_url="http://10.0.2.100:8080",
    )


def _before_count(script: str) -> list[str]:
    """The run script's lines from its sessions dir to its count of the cache before the harness."""
    lines = script.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("mkdir -p /logs/agent/"))
    last = next(n for n, line in enumerate(lines) if line.startswith("cache_before="))
    return lines[first + 1 : last + 1]


def test_a_warm_harness_starts_from_the_frozen_cache_and_a_cold_one_from_none(
    lock: Lock, tmp_path: Path
) -> None:
    """Run as the script has them: a warm harness's compiled files (in the read-only artifacts)
    copied where its jiti looks, so the reading says warm; a cold harness's script copies none."""
    artifacts = tmp_path / "artifacts"
    frozen = artifacts / "compiled" / "pi-openpi" / "jiti"
    frozen.mkdir(parents=True)
    for name in ("a.cjs", "b.mjs", ".hidden.cjs"):
        (frozen / name).write_text(name)
    counted = {}
    for cache in ("warm", "cold"):
        lines = _before_count(run_script(_plan(lock, cache, str(artifacts)), "go"))
        tmp = tmp_path / f"tmp-{cache}"
        tmp.mkdir()
        done = subprocess.run(
            ["bash", "-c", "\n".join([SCRIPT_OPTIONS, *lines, 'echo "$cache_before"'])],
            env={"TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        counted[cache] = (int(done.stdout), len(lines))
    assert counted == {"warm": (3, 3), "cold": (0, 1)}
    assert (tmp_path / "tmp-warm" / "jiti" / ".hidden.cjs").read_text() == ".hidden.cjs"


def test_the_warm_script_configures_as_a_cell_then_starts_the_harness_on_help(
    lock: Lock,
) -> None:
    plan = _plan(lock, "warm")
    script = warm_script(plan)
    run = run_script(plan, "go")
    configure = run[: run.index("mkdir -p /logs/agent/sessions")].splitlines()
    for part in (install_script(plan).splitlines(), configure):
        assert "\n".join(part[len(plan.exports) + 1 :]) in script
    assert script.splitlines()[-1] == f"{plan.command} --help > /dev/null"
    assert "TMPDIR" not in script  # the caller's: where jiti's files go


def test_a_warm_lock_plans_one_warm_script_per_warm_harness(lock: Lock) -> None:
    from deploy.guest.plan import Bundle, TaskImage, warm_caches

    trees = tuple(
        Bundle(f"harness-{h.id}", f"sha256:{h.id}", f"/opt/bench/harnesses/{h.id}", "x")
        for h in lock.harnesses
    )
    images = tuple(TaskImage(t, f"bench-task-{t}", "/c", "sha256:x", 60.0) for t in "ab")
    cold = lock.harnesses[1].model_copy(update={"compiled_cache": "cold"})
    assert (
        warm_caches(lock.model_copy(update={"harnesses": (lock.harnesses[0], cold)}), trees, images)
        == ()
    )
    (cache,) = warm_caches(lock, trees, images)  # the committed lock: Pi + OpenPI warm
    assert (cache.harness, cache.image) == ("pi-openpi", "bench-task-a")
    assert cache.script == warm_script(_plan(lock, "warm"))
    assert cache.dest == "/opt/bench/compiled/pi-openpi"
    other_tree = (trees[0], Bundle("harness-pi-openpi", "sha256:new", "/t", "x"))
    assert warm_caches(lock, other_tree, images)[0].digest != cache.digest
    # A task whose build may fail here (tasks.needs_network) is no image to warm in.
    unbuilt = (TaskImage("a", "bench-task-a", "/c", "sha256:x", 60.0, "needs the network"),)
    (cache,) = warm_caches(lock, trees, (*unbuilt, images[1]))
    assert cache.image == "bench-task-b"


def test_report_html_and_receipt_of_a_run_carry_both(tmp_path: Path) -> None:
    from runner.records.ledger import Ledger
    from runner.report.write import write_report
    from runner.scan.scan import scan_run
    from tests.support.ledger_factory import new_run_dir
    from tests.test_report_cli import passed_verify

    paths, _ = new_run_dir(SEED_ARM64, tmp_path / "run")
    ledger = Ledger(paths)
    for line in lines_with_start_up(load_lock(SEED_ARM64), before=5):  # Pi + OpenPI warm
        ledger.append(line)
    passed_verify(paths)
    scan_run(paths, {"provider_key": ["k" * 24]})
    receipt = write_report(paths.run_dir)
    assert receipt.status == "completed"
    html = paths.report_html.read_text()
    assert "Start-up apart from work per harness" in html
    assert "61.0 [60.0-62.0] (60.0-62.0)" in html
    assert "asked warm; held warm (18 cells recorded)" in html
    assert "seeded stand-in (model steady)" in html and "seeded stand-in (model wander)" in html
    saved = paths.receipt.read_text()
    assert '"compiled_caches"' in saved and '"nothing compiled"' in saved


def test_warm_caches_make_another_environment_of_the_same_resolution(lock: Lock) -> None:
    """Asking for warm compiled caches re-resolves nothing (no artifact changes, so no floating
    pin moves), yet a guest frozen with them is another guest: its environment fingerprint is
    not the cold one's, and a lock that asks for none keeps its resolution's."""
    from runner.spec.resolution import load_resolution, load_resolved_lock, resolution_path

    cold = lock.harnesses[1].model_copy(update={"compiled_cache": "cold"})
    cold_lock = lock.model_copy(update={"harnesses": (lock.harnesses[0], cold)})
    assert cold_lock.environment_inputs == lock.environment_inputs
    resolved = "sha256:" + "5" * 64
    cold_fingerprint = cold_lock.with_environment(resolved).environment_fingerprint
    assert cold_fingerprint == resolved
    assert lock.with_environment(resolved).environment_fingerprint not in (resolved, "")
    # The committed lock asks for warm caches and loads with its committed resolution.
    loaded = load_resolved_lock(SEED_ARM64)
    assert loaded.harnesses[1].compiled_cache == "warm"
    recorded = load_resolution(resolution_path(SEED_ARM64, lock), lock)
    assert (
        loaded.environment_fingerprint
        == lock.with_environment(recorded.environment_fingerprint).environment_fingerprint
    )
    assert loaded.environment_fingerprint != recorded.environment_fingerprint
