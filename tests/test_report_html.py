"""report.html of the reference run, rendered in headless Chromium: the markdown's tables, the
plots loaded, every cell linked to its trial directory and its ledger line."""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import pytest
from markupsafe import escape

from runner.core.files import read_model
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule
from runner.report.document import Table
from runner.report.evidence import first_requests, load_run
from runner.report.html_page import render_html
from runner.report.receipt import SCRIPTED_PROVIDER_NOTE, Receipt
from runner.report.run_cells import run_cells
from runner.report.signing import OperatorKey
from runner.report.write import document, write_report
from tests.support.browser import chromium, parse, render
from tests.test_report_cli import reference_run, runner_cli

PNG = b"\x89PNG\r\n\x1a\n"
TAB_GREEN = (44, 160, 44)  # the pass-rate bars: only in pass-rates.png
TAB_ORANGE = (255, 127, 14)  # the token bars: only in report.png


@pytest.fixture(scope="module")
def reported_once(seed_lock_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference run reported once per module (its report takes seconds)."""
    run_dir = tmp_path_factory.mktemp("reported") / "run"
    paths = reference_run(seed_lock_path, run_dir, secrets.token_urlsafe(24))
    result = runner_cli("report", str(paths.run_dir))
    assert result.returncode == 0, result.stderr
    assert f"wrote {paths.report_html}" in result.stdout
    return run_dir


@pytest.fixture
def reported(reported_once: Path, tmp_path: Path) -> RunPaths:
    """A copy of the reported run of this test's own, to change as it likes."""
    return RunPaths(Path(shutil.copytree(reported_once, tmp_path / "run", symlinks=True)))


def test_report_html_renders_in_chromium(reported: RunPaths, tmp_path: Path) -> None:
    if chromium() is None:
        pytest.skip("no headless Chromium (scripts/setup-host.sh installs it)")
    rendered = render(reported.report_html, tmp_path / "report-html.png")
    print(f"screenshot: {rendered.screenshot}")
    colours = rendered.colours()
    assert len(colours) > 50, "the screenshot is (nearly) one colour"
    assert colours.get(TAB_GREEN, 0) > 10_000 and colours.get(TAB_ORANGE, 0) > 10_000
    assert rendered.console_errors == []
    dom = rendered.page
    assert dom.tables[3][0][:3] == [
        "harness",
        "pass rate [Wilson 95 % CI]",
        "median wall s [interval]",
    ]
    assert "7/9 = 0.778 [0.453, 0.937]" in dom.tables[3][1]
    assert len(dom.images) == 3
    for src in dom.images:
        image = reported.run_dir / src
        assert image.read_bytes().startswith(PNG), src
        assert image in rendered.requested, f"Chromium did not load {src}"


def test_html_has_every_table_of_the_markdown(reported: RunPaths) -> None:
    # receipt.json keeps its keys sorted, the tables lock order; the judge is the one it names
    judge = read_model(reported.receipt, Receipt).identities.judge
    receipt = load_run(reported, signed_by=OperatorKey.default().public, judge=judge)
    blocks = document(receipt, first_requests(reported))
    tables = [block for block in blocks if isinstance(block, Table)]
    page = parse(reported.report_html.read_text())
    shared = page.tables[: len(tables)]
    assert [rows[0] for rows in shared] == [list(table.headers) for table in tables]
    assert [rows[1:] for rows in shared] == [[list(row) for row in t.rows] for t in tables]
    assert len(page.tables) == len(tables) + len(receipt.batches)  # + a cells table per batch
    assert "| 7/9 = 0.778 [0.453, 0.937] |" not in reported.report_html.read_text()


def test_every_cell_links_its_trial_and_ledger_line(reported: RunPaths) -> None:
    text = reported.report_html.read_text()
    page = parse(text)
    raw_lines = reported.ledger.read_text().splitlines()
    assert len(raw_lines) == 54
    for number, raw in enumerate(raw_lines, start=1):
        cell_id = json.loads(raw)["cell_id"]
        assert f"cell-{cell_id}" in page.ids
        assert f"trials/{cell_id}/" in page.links
        assert f"cells.jsonl line {number}</summary><pre>{escape(raw)}</pre>" in text
    assert not [link for link in page.links if "://" in link]  # nothing from the network
    assert "<script" not in text


def test_cells_not_run_are_shown_missing_and_text_is_escaped(reported: RunPaths) -> None:
    lines = reported.ledger.read_text().splitlines()
    first = json.loads(lines[0]) | {"reason": "<b>reward</b> & 0"}
    reported.ledger.write_text("\n".join([json.dumps(first), *lines[1:-2]]) + "\n")
    write_report(reported.run_dir)
    text = reported.report_html.read_text()
    assert text.count('class="state-not-run"') == 2
    assert "&lt;b&gt;reward&lt;/b&gt; &amp; 0" in text and "<b>reward" not in text
    assert "Status: <strong>failed_closed</strong>" in text


def test_plots_are_the_same_bytes_for_the_same_run(reported: RunPaths) -> None:
    files = (reported.report_png, reported.report_pass_rates_png, reported.report_timeline_png)
    before = [path.read_bytes() for path in files]
    write_report(reported.run_dir)
    assert [path.read_bytes() for path in files] == before
    assert all(b"matplotlib" not in data for data in before)  # no Software key


def test_the_scripted_provider_is_stated(reported: RunPaths) -> None:
    receipt = load_run(reported)
    ids = receipt.identities.model_copy(update={"provider_note": SCRIPTED_PROVIDER_NOTE})
    scripted = receipt.model_copy(update={"identities": ids})
    cells = run_cells(reported, read_model(reported.schedule, Schedule))
    text = render_html(reported, scripted, document(scripted, first_requests(reported)), cells)
    assert f"<blockquote>{SCRIPTED_PROVIDER_NOTE}</blockquote>" in text
    assert "OFFLINE SCRIPTED PROVIDER" not in reported.report_html.read_text()


def test_the_prompt_overhead_is_a_table_of_both_reports(reported: RunPaths) -> None:
    lines = reported.ledger.read_text().splitlines()
    footprint = {
        "api_path": "/v1/messages",
        "tool_names": ["read", "bash"],
        "system_prompt_bytes": 1234,
        "tool_definitions_bytes": 5678,
    }
    first = json.loads(lines[0]) | {"first_request": footprint}
    reported.ledger.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    receipt = write_report(reported.run_dir)
    label = next(
        group.label
        for batch in receipt.batches
        for group in batch.harnesses
        if group.key == first["harness"]
    )
    assert (
        "## Harness prompt overhead (first request of each cell)\n\n"
        "| harness | cells | tools | system prompt bytes | tool definitions bytes | tool names |\n"
        "|---|---:|---:|---:|---:|---|\n"
        f"| {label} | 1 | 2 | 1,234 | 5,678 | bash, read |\n"
    ) in reported.report_md.read_text()
    text = reported.report_html.read_text()
    assert "<h2>Harness prompt overhead (first request of each cell)</h2>" in text
    tables = parse(text).tables
    overhead = tables[len(tables) - len(receipt.batches) - 1]  # the cells tables come last
    assert overhead[1:] == [[label, "1", "2", "1,234", "5,678", "bash, read"]]
