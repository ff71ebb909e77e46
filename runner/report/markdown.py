"""report.md: the report's blocks (runner.report.document) formatted as Markdown."""

from __future__ import annotations

from runner.report.document import (
    Block,
    Bullets,
    Code,
    Emphasis,
    Heading,
    Note,
    Paragraph,
    Strong,
    Table,
    Text,
)


def md_text(text: Text) -> str:
    def run(part: str) -> str:
        if isinstance(part, Code):
            return f"`{part}`"
        if isinstance(part, Emphasis):
            return f"*{part}*"
        return f"**{part}**" if isinstance(part, Strong) else part

    return "".join(run(part) for part in text)


def md_table(block: Table) -> list[str]:
    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(md_text((cell,)) for cell in cells) + " |"

    rule = "|" + "|".join("---:" if a == "right" else "---" for a in block.align) + "|"
    return [row(block.headers), rule, *(row(cells) for cells in block.rows)]


def md_block(block: Block) -> list[str]:
    match block:
        case Heading(level, text):
            return ["#" * level + " " + md_text(text)]
        case Paragraph(text):
            return [md_text(text)]
        case Note(text):
            return ["> " + md_text(text)]
        case Bullets(items):
            return ["- " + md_text(item) for item in items]
        case Table():
            return md_table(block)


def markdown(blocks: list[Block]) -> str:
    return "\n\n".join("\n".join(md_block(block)) for block in blocks) + "\n"
