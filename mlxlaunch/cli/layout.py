"""Width-aware layout for the CLI's reports: a table when it fits, one block per record if not.
Nothing is ever cut short with an ellipsis, and a command the user may copy stays on one line.

Rich fits a too-wide table by squeezing its columns, down to nothing (`┃┃┃`, `…`). Here a table
is used only when every one-line column gets its full width and every wrapping column at least
`WRAP_MIN_WIDTH`; below that width each record becomes a block of `label value` pairs packed
into lines. Text that wraps is wrapped here (`wrap_words`), keeping `backticked` spans whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# A wrapping column narrower than this reads as a word per line: use blocks instead.
WRAP_MIN_WIDTH = 20
BLOCK_INDENT = 2
PAIR_GAP = "  "

# One unbreakable piece of text: a run of non-spaces, where a `backticked span` (a command)
# counts as non-space even across its spaces.
_TOKEN = re.compile(r"(?:`[^`]*`?|[^\s`])+")

Cell = str | Text


@dataclass(frozen=True)
class Column:
    """One column of a report: its header, and whether its text may wrap (prose) or not."""

    header: str
    wrap: bool = False
    justify: Literal["left", "right"] = "left"
    style: str | None = None


def _text(cell: Cell) -> Text:
    # Plain strings are literal: model names and details may hold `[...]` that is not markup.
    return cell if isinstance(cell, Text) else Text(cell)


def _needed(column: Column, cells: Sequence[Text]) -> int:
    lines = [column.header, *(t.plain for t in cells)]
    longest = max(cell_len(line) for line in lines)
    if not column.wrap:
        return longest
    word = max((cell_len(w) for line in lines for w in _TOKEN.findall(line)), default=0)
    return max(word, min(longest, WRAP_MIN_WIDTH))


def table_width(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> int:
    """The narrowest console width at which `rows` print as a table with no cell cut short."""
    cells = [[_text(row[i]) for row in rows] for i in range(len(columns))]
    # Rich's default box: a border between and around columns, one space of padding each side.
    return 1 + sum(_needed(c, col) + 3 for c, col in zip(columns, cells, strict=True))


def report_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, title: str | None = None
) -> Table:
    """`rows` as a rich table whose one-line columns never wrap (check `table_width` first)."""
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        cells = [_text(row[i]) for row in rows]
        table.add_column(
            column.header,
            no_wrap=not column.wrap,
            justify=column.justify,
            style=column.style,
            min_width=_needed(column, cells) if column.wrap else None,
        )
    for row in rows:
        table.add_row(*(_text(c) for c in row))
    return table


def wrap_words(text: Cell, width: int, *, clauses: bool = False) -> list[Text]:
    """`text` wrapped to `width` at spaces, never inside a `backticked` span.

    A piece longer than `width` gets a line of its own, whole: the terminal wraps it, and a path
    or command copied from there is still complete. `clauses`: when `text` needs more than one
    line, each `; `-separated clause starts a new line (fixes list one command per clause).
    """
    source = _text(text)
    if clauses and source.cell_len > width:
        starts = [0, *(m.end() for m in re.finditer(r";\s+", source.plain))]
        ends = [*(m.start() + 1 for m in re.finditer(r";\s+", source.plain)), len(source)]
        return [
            line
            for start, end in zip(starts, ends, strict=True)
            for line in wrap_words(source[start:end], width)
        ]
    lines: list[Text] = []
    line: Text | None = None
    for match in _TOKEN.finditer(source.plain):
        piece = source[match.start() : match.end()]
        if line is not None and line.cell_len + 1 + piece.cell_len <= width:
            line.append(" ")
            line.append_text(piece)
            continue
        if line is not None:
            lines.append(line)
        line = piece
    if line is not None:
        lines.append(line)
    return lines or [Text("")]


@dataclass(frozen=True)
class Record:
    """One record for the block layout: a heading line, then labelled values."""

    heading: Text
    fields: tuple[tuple[str, Cell], ...]


def _pair(label: str, value: Cell) -> Text:
    pair = Text(label, style="dim")
    pair.append(" ")
    pair.append_text(_text(value))
    return pair


def _hanging(label: str, value: Cell, room: int) -> list[Text]:
    """`label value`, the value wrapped with its continuation lines indented under it."""
    indent = Text(" " * BLOCK_INDENT)
    first, *rest = wrap_words(value, max(room - len(label) - 1, 1))
    hang = Text(" " * (BLOCK_INDENT + len(label) + 1))
    return [indent + _pair(label, first), *(hang + part for part in rest)]


def record_blocks(records: Sequence[Record], width: int, *, pack: bool = True) -> list[Text]:
    """Each record as its heading, then its `label value` pairs in lines indented under it.

    `pack`: as many pairs on a line as fit; else one pair a line, labels padded to align. A
    pair too long for a line wraps on its own. Records are separated by a blank line.
    """
    lines: list[Text] = []
    room = max(width - BLOCK_INDENT, 1)
    for index, record in enumerate(records):
        if index:
            lines.append(Text(""))
        lines.extend(wrap_words(record.heading, width))
        if not pack:
            pad = max((len(label) for label, _ in record.fields), default=0)
            for label, value in record.fields:
                lines += _hanging(label.ljust(pad), value, room)
            continue
        current: Text | None = None
        for label, value in record.fields:
            pair = _pair(label, value)
            if current is not None and current.cell_len + len(PAIR_GAP) + pair.cell_len <= room:
                current.append(PAIR_GAP)
                current.append_text(pair)
                continue
            if current is not None:
                lines.append(Text(" " * BLOCK_INDENT) + current)
                current = None
            if pair.cell_len <= room:
                current = pair
            else:
                lines += _hanging(label, value, room)
        if current is not None:
            lines.append(Text(" " * BLOCK_INDENT) + current)
    return lines


def print_lines(console: Console, lines: Sequence[Text]) -> None:
    """Print pre-wrapped lines as they are: rich neither re-wraps nor crops them."""
    for line in lines:
        console.print(line, overflow="ignore", crop=False, no_wrap=True)


def print_report(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    records: Sequence[Record],
    *,
    title: str | None = None,
) -> None:
    """A table of `rows` when it fits the console, else `records` as blocks under the title."""
    if table_width(columns, rows) <= console.width:
        console.print(report_table(columns, rows, title=title))
        return
    lines = [Text(title, style="bold"), Text("")] if title else []
    print_lines(console, lines + record_blocks(records, console.width))
