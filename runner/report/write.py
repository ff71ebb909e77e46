"""``runner report RUN_DIR``: derive receipt.json (signed), report.md, report.png and report.html
(with its plots, runner.report.html_page) from a run directory; the document both renderers
format is every section in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from runner.core.files import write_atomic, write_model
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.run_tasks import RunTasks
from runner.report.batch_sections import batch_section
from runner.report.document import Block
from runner.report.egress_summary import CellEgress, egress_section, refused_egress
from runner.report.evidence import first_requests, load_run, read_run_tasks
from runner.report.html_page import write_html
from runner.report.judge import running_judge
from runner.report.markdown import markdown
from runner.report.plots import wall_and_tokens
from runner.report.receipt import Receipt
from runner.report.run_sections import (
    failure_class_section,
    mirror_files_section,
    prompt_overhead,
    run_section,
    task_section,
)
from runner.report.signing import OperatorKey


def write_report(run_dir: Path) -> Receipt:
    paths = RunPaths(run_dir)
    key = OperatorKey.default()
    receipt = load_run(paths, signed_by=key.public, judge=running_judge())
    blocks = report_blocks(paths, receipt)
    write_model(paths.receipt, receipt)
    write_atomic(paths.receipt_signature, key.sign(paths.receipt.read_bytes()))
    write_atomic(paths.receipt_public_key, f"{key.public}\n".encode())
    write_atomic(paths.report_md, markdown(blocks).encode())
    wall_and_tokens(receipt, paths.report_png)
    write_html(paths, receipt, blocks)
    return receipt


def report_blocks(paths: RunPaths, receipt: Receipt) -> list[Block]:
    """The report's document: the receipt and what the run's files add to it."""
    return document(receipt, first_requests(paths), refused_egress(paths), read_run_tasks(paths))


def document(
    receipt: Receipt,
    footprints: Mapping[str, Sequence[PromptFootprint]] | None = None,
    egress: Mapping[str, Sequence[CellEgress]] | None = None,
    tasks: RunTasks | None = None,
) -> list[Block]:
    """Every section of the report, in order: both renderers format these blocks.
    ``footprints`` are the first requests per harness label (``first_requests``, read from the
    run's ledger); without them the report has no prompt-overhead section. ``egress``, each
    harness's cells' refused egress (``refused_egress``, from the ledger too), likewise.
    ``tasks``: the run's tasks.json (``read_run_tasks``)."""
    blocks = run_section(receipt)
    if tasks is not None:
        blocks += task_section(tasks.tasks) + mirror_files_section(tasks.mirror_files)
    for batch in receipt.batches:
        blocks += batch_section(batch)
    blocks += failure_class_section(receipt)
    blocks += prompt_overhead(footprints or {})
    blocks += egress_section(egress or {})
    return blocks


def render_markdown(
    receipt: Receipt, footprints: Mapping[str, Sequence[PromptFootprint]] | None = None
) -> str:
    return markdown(document(receipt, footprints))
