"""The cells of a run in schedule order, each with its ledger line (None: not run) and that
line as ``cells.jsonl`` holds it: what the HTML report's timeline and cells table show. The
renderers only format these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import Cell, Schedule

CellState = Literal["pass", "fail", "indeterminate", "not run"]
CELL_STATES: tuple[CellState, ...] = ("pass", "fail", "indeterminate", "not run")


@dataclass(frozen=True)
class RecordedLine:
    """A ledger line, its line number in cells.jsonl and its text there."""

    line: LedgerLine
    number: int
    raw: str


@dataclass(frozen=True)
class RunCell:
    cell: Cell
    recorded: RecordedLine | None

    @property
    def state(self) -> CellState:
        return "not run" if self.recorded is None else self.recorded.line.outcome


def recorded_lines(paths: RunPaths) -> dict[str, RecordedLine]:
    """Each ledger line by cell id, with its raw text (``Ledger.lines`` validates every line)."""
    lines = Ledger(paths).lines()
    raws = paths.ledger.read_text().splitlines() if lines else []
    return {
        line.cell_id: RecordedLine(line, number, raw)
        for number, (line, raw) in enumerate(zip(lines, raws, strict=True), start=1)
    }


def run_cells(paths: RunPaths, schedule: Schedule) -> dict[str, tuple[RunCell, ...]]:
    """Per batch id, its scheduled cells in schedule order with what the ledger recorded."""
    recorded = recorded_lines(paths)
    return {
        batch.id: tuple(RunCell(cell, recorded.get(cell.id)) for cell in batch.cells)
        for batch in schedule.batches
    }
