"""A plain-text table, as the deploy's failed builds and the freeze's failed oracles print one:
each column but the last padded to its widest cell, columns two spaces apart, rows indented.

Standard library only: runner.guest.build_report prints its table in the guest, where runner/
runs beside Harbor with pydantic alone (runner.guest imports core and spec only)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_GAP = "  "


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  "
) -> list[str]:
    """The header's line and then a line per row. The last column is not padded: a long cell
    there (an error's own line) runs on as it is."""
    lines = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    return [indent + _GAP.join(_padded(line, widths)) for line in lines]


def _padded(line: tuple[str, ...], widths: list[int]) -> list[str]:
    return [*(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)), line[-1]]
