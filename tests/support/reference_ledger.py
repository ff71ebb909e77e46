"""The reference run's ledger: the published per-(batch, harness) totals split over its cells."""

from __future__ import annotations

from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule
from tests.support.ledger_factory import line_for, split

# (batch, harness): (pass, fail, indeterminate), wall s, tokens or None, POST, logical attempts
PUBLISHED = {
    ("glm", "bare-pi"): ((7, 1, 1), 2647.724, 249_625, 94, 94),
    ("glm", "openpi"): ((7, 2, 0), 1107.098, 331_851, 87, 87),
    ("glm", "omp"): ((7, 2, 0), 1081.746, 2_176_017, 106, 106),
    ("luna", "bare-pi"): ((7, 2, 0), 1129.885, None, 43, 43),
    ("luna", "openpi"): ((7, 2, 0), 1151.213, None, 46, 46),
    ("luna", "omp"): ((4, 5, 0), 1803.368, None, 110, 92),
}


def write_reference_ledger(paths: RunPaths, schedule: Schedule) -> None:
    ledger = Ledger(paths)
    for (batch, harness), (outcomes, wall, tokens, posts, attempts) in PUBLISHED.items():
        cells = [c for c in schedule.batch(batch).cells if c.harness == harness]
        kinds = ["pass"] * outcomes[0] + ["fail"] * outcomes[1] + ["indeterminate"] * outcomes[2]
        walls = split(wall, 9, integer=False)
        token_parts = split(tokens, 9, integer=True) if tokens is not None else [None] * 9
        post_parts = split(posts, 9, integer=True)
        attempt_parts = split(attempts, 9, integer=True)
        for cell, kind, w, t, p, a in zip(
            cells, kinds, walls, token_parts, post_parts, attempt_parts, strict=True
        ):
            ledger.append(line_for(cell, outcome=kind, wall=w, tokens=t, posts=p, attempts=a))
