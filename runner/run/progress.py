"""The live view of a run: current cell, elapsed vs deadline, done/total, outcomes, ETA."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from rich.table import Table

from runner.records.ledger import LedgerLine
from runner.records.schedule import Cell


@dataclass
class RunProgress:
    total: int
    deadline_seconds: int
    done: list[LedgerLine] = field(default_factory=list)
    current: Cell | None = None
    current_started: float = 0.0

    def start(self, cell: Cell) -> None:
        self.current, self.current_started = cell, time.monotonic()

    def finish(self, line: LedgerLine) -> None:
        self.done.append(line)
        self.current = None

    def eta_seconds(self) -> float | None:
        if not self.done:
            return None
        mean = sum(line.wall_seconds for line in self.done) / len(self.done)
        return mean * (self.total - len(self.done))

    def __rich__(self) -> Table:
        outcomes = Counter(line.outcome for line in self.done)
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        if self.current is not None:
            elapsed = time.monotonic() - self.current_started
            table.add_row("cell", self.current.id)
            table.add_row("elapsed", f"{elapsed:,.0f} s of {self.deadline_seconds:,} s deadline")
        table.add_row("done", f"{len(self.done)}/{self.total}")
        table.add_row(
            "outcomes",
            f"pass {outcomes['pass']} · fail {outcomes['fail']} · "
            f"indeterminate {outcomes['indeterminate']}",
        )
        eta = self.eta_seconds()
        table.add_row("eta", "unknown" if eta is None else f"{eta / 60:,.1f} min")
        return table
