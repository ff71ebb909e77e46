"""The report as blocks: headings, paragraphs, bullet lists and tables of strings.

The section modules (``runner.report.run_sections``, ``batch_sections``, ``stats_sections``)
build them once from the receipt (every number and sentence is made there, in the words of
``runner.report.formats``); the Markdown renderer (``runner.report.markdown``) and the HTML
renderer (``runner.report.html_page``) each only format the same blocks, so the two cannot
disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal


class Code(str):
    """A run of text shown as code (a digest, an id, a source)."""

    __slots__ = ()


class Strong(str):
    """A run of text shown emphasised (a status, a verdict)."""

    __slots__ = ()


class Emphasis(str):
    """A run of text shown in italics (a term named in a caption, as ``not recorded``)."""

    __slots__ = ()


NOT_RETURNED = "not returned"  # a value the provider did not return: never shown as 0
NOT_RECORDED = "not recorded"  # a value the run's files were written before keeping
Text = tuple[str, ...]  # runs of plain, ``Code``, ``Strong`` or ``Emphasis`` text, in order
Align = Literal["left", "right"]
R: Align = "right"
L: Align = "left"


@dataclass(frozen=True)
class Heading:
    level: int
    text: Text
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class Paragraph:
    text: Text
    kind: ClassVar[str] = "paragraph"


@dataclass(frozen=True)
class Note:
    """A statement set apart from the text (the offline scripted provider's)."""

    text: Text
    kind: ClassVar[str] = "note"


@dataclass(frozen=True)
class Bullets:
    items: tuple[Text, ...]
    kind: ClassVar[str] = "bullets"


@dataclass(frozen=True)
class Table:
    """Headers and cell strings; a cell may be a ``Code``, ``Strong`` or ``Emphasis`` string."""

    headers: tuple[str, ...]
    align: tuple[Align, ...]
    rows: tuple[tuple[str, ...], ...]
    kind: ClassVar[str] = "table"


Block = Heading | Paragraph | Note | Bullets | Table


def table(columns: Sequence[tuple[str, Align]], rows: Iterable[Sequence[str]]) -> Table:
    """A table from (header, alignment) pairs and rows of as many cells."""
    built = tuple(tuple(row) for row in rows)
    if any(len(row) != len(columns) for row in built):
        raise ValueError(f"every row needs {len(columns)} cells")
    return Table(
        headers=tuple(header for header, _ in columns),
        align=tuple(align for _, align in columns),
        rows=built,
    )


def bullets(items: Iterable[Text | str]) -> list[Block]:
    """A bullet list, or no block at all when there are no items."""
    found = tuple((item,) if isinstance(item, str) else item for item in items)
    return [Bullets(found)] if found else []
