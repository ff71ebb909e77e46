"""Refused egress in the report: per harness, what the guest's firewall refused during its cells
(runner.lab.egress, the ledger's ``egress_refused``), and each cell that had any.

Evidence of hermeticity beside the verdicts, never part of them. A cell whose line has no record
(written before the field, or the firewall could not be read) is counted as not recorded, never
as "nothing refused"; a run none of whose cells has a record gets no section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runner.core.models import updated
from runner.lab.egress import RefusedEgress
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.report.document import Align, Block, Code, Heading, Paragraph, bullets, table
from runner.spec.lock import load_lock

NOTHING_REFUSED = "none"


@dataclass(frozen=True)
class CellEgress:
    cell_id: str
    refused: tuple[RefusedEgress, ...] | None  # None: not recorded


def refused_egress(paths: RunPaths) -> dict[str, tuple[CellEgress, ...]]:
    """Per harness (by its label, in the order of its id), each of its cells' records."""
    labels = {harness.id: harness.label for harness in load_lock(paths.lock).harnesses}
    seen: dict[str, list[CellEgress]] = {}
    for line in Ledger(paths).lines():
        seen.setdefault(line.harness, []).append(CellEgress(line.cell_id, line.egress_refused))
    return {labels.get(harness, harness): tuple(found) for harness, found in sorted(seen.items())}


def summed(records: Sequence[tuple[RefusedEgress, ...]]) -> tuple[RefusedEgress, ...]:
    """The entries of several cells with the packets to each destination added up."""
    totals: dict[tuple[str, str, str, int | None], RefusedEgress] = {}
    for record in records:
        for entry in record:
            key = (entry.source, entry.proto, entry.address, entry.port)
            if key in totals:
                entry = updated(entry, packets=totals[key].packets + entry.packets)
            totals[key] = entry
    return tuple(totals[key] for key in sorted(totals, key=lambda key: (*key[:3], key[3] or 0)))


def egress_section(egress: Mapping[str, Sequence[CellEgress]]) -> list[Block]:
    if not any(cell.refused is not None for cells in egress.values() for cell in cells):
        return []
    columns: list[tuple[str, Align]] = [("harness", "left"), ("cells", "right")]
    columns += [("recorded", "right"), ("with refused egress", "right"), ("refused", "left")]
    rows = []
    for label, cells in egress.items():
        records = [cell.refused for cell in cells if cell.refused is not None]
        refused = summed(records)
        rows.append(
            (
                label,
                str(len(cells)),
                str(len(records)),
                str(sum(bool(record) for record in records)),
                ", ".join(entry.label for entry in refused) or NOTHING_REFUSED,
            )
        )
    offending = [
        (Code(cell.cell_id), ": " + ", ".join(entry.label for entry in cell.refused))
        for cells in egress.values()
        for cell in cells
        if cell.refused
    ]
    return [
        Heading(2, ("Refused egress (the guest's firewall, per cell)",)),
        Paragraph(
            (
                "Every packet a cell's guest or task container sent anywhere but loopback, the "
                "proxy and the package mirror was refused in the guest and counted: protocol, "
                "destination, packets (source). Evidence of hermeticity; it does not change a "
                "cell's verdict.",
            )
        ),
        table(columns, rows),
        *bullets(offending),
    ]
