"""report.html: the report's blocks (``runner.report.document``, the same the Markdown formats),
its plots and every cell of the run in schedule order, each linked to its trial directory and
its ledger line. A static page (Jinja2, autoescaped): no script, no external URL, readable
offline from the run directory."""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from runner.core.files import read_model, write_atomic
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule
from runner.report import plots
from runner.report.document import Block, Code, Emphasis, Heading, Strong, Text
from runner.report.formats import fmt_tokens
from runner.report.receipt import Receipt
from runner.report.run_cells import CELL_STATES, RunCell, run_cells


@dataclass(frozen=True)
class Image:
    src: str  # relative to report.html
    alt: str


def html_text(text: Text) -> Markup:
    """Runs of text, each escaped; ``Code``, ``Strong`` and ``Emphasis`` runs in their
    elements."""

    def run(part: str) -> Markup:
        if isinstance(part, Code):
            return Markup("<code>{}</code>").format(part)
        if isinstance(part, Strong):
            return Markup("<strong>{}</strong>").format(part)
        if isinstance(part, Emphasis):
            return Markup("<em>{}</em>").format(part)
        return escape(part)

    return Markup("").join(run(part) for part in text)


def html_cell(cell: str) -> Markup:
    return html_text((cell,))


def trial_link(paths: RunPaths, run_cell: RunCell) -> str:
    return paths.relative(paths.trial(run_cell.cell.id)) + "/"


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("runner.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["text"] = html_text
    env.filters["cell"] = html_cell
    env.filters["tokens"] = fmt_tokens
    return env


def images(paths: RunPaths) -> tuple[Image, ...]:
    return (
        Image(paths.relative(paths.report_pass_rates_png), "pass rate per harness"),
        Image(paths.relative(paths.report_png), "wall time and provider tokens per harness"),
        Image(paths.relative(paths.report_timeline_png), "cells in schedule order by outcome"),
    )


def split_at_batches(blocks: list[Block]) -> tuple[list[Block], list[Block]]:
    """The run's own section, and the batch sections from their first heading: the plots are
    shown between the two."""
    first = next((i for i, b in enumerate(blocks) if isinstance(b, Heading) and b.level == 2), None)
    at = len(blocks) if first is None else first
    return blocks[:at], blocks[at:]


def render_html(
    paths: RunPaths,
    receipt: Receipt,
    blocks: list[Block],
    cells: dict[str, tuple[RunCell, ...]],
) -> str:
    head, batch_sections = split_at_batches(blocks)
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            title=f"Benchmark report: {receipt.identities.lock_name}",
            head=head,
            batch_sections=batch_sections,
            images=images(paths),
            batches=receipt.batches,
            cells=cells,
            states=CELL_STATES,
            colours=plots.STATE_COLOURS,
            trial_link=lambda run_cell: trial_link(paths, run_cell),
            ledger=paths.relative(paths.ledger),
        )
    )


def write_html(paths: RunPaths, receipt: Receipt, blocks: list[Block]) -> None:
    """report.html and its plots under report-files/ (report.png is written beside it)."""
    cells = run_cells(paths, read_model(paths.schedule, Schedule))
    plots.pass_rates(receipt, paths.report_pass_rates_png)
    plots.timeline(receipt, cells, paths.report_timeline_png)
    write_atomic(paths.report_html, render_html(paths, receipt, blocks, cells).encode())
