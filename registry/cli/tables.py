"""Plain tables for the CLI that stay readable at 80 columns and through a pipe (like kubectl's).

A table is a header line and one line per row, columns two spaces apart, no box. Each column is
one of three kinds:

- **key** (the default: ids, versions, names, statuses, numbers, times): printed whole, never
  cut or wrapped, whatever the width;
- **text** (:func:`text`: descriptions, details, lists): cut with ``…`` when the table is wider
  than the screen, down to a few characters, else left out;
- **extra** (:func:`extra`: e.g. creation times): left out when the table still does not fit.

The width is ``COLUMNS`` when set, else the terminal's; through a pipe (stdout not a terminal,
no ``COLUMNS``) and with ``--wide`` nothing is cut or left out, so every row is one greppable line
with every value whole. A cell with several lines (``\\n``) takes as many lines, the other columns
blank below their first line. Records (``print_record``) are ``field  value`` lines, values whole.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TextIO

GAP = "  "
COMFORTABLE = 24  # text columns are cut to this before extra columns are left out
MIN_TEXT = 8  # a text column is never cut below this (or its header's width)
ELLIPSIS = "…"

# --wide of the command being run (set by registry.cli._common.admin_command)
WIDE: ContextVar[bool] = ContextVar("loraplane_cli_wide", default=False)

Getter = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Col:
    header: str
    get: Getter
    kind: str = "key"  # "key" | "text" | "extra"


def text(header: str, get: Getter) -> Col:
    """A free-text column: cut with … on a narrow screen (``--wide`` shows it whole)."""
    return Col(header, get, "text")


def extra(header: str, get: Getter) -> Col:
    """A column left out on a screen too narrow for it (``--wide`` shows it)."""
    return Col(header, get, "extra")


def as_col(spec: Col | tuple[str, Getter]) -> Col:
    return spec if isinstance(spec, Col) else Col(spec[0], spec[1])


def width_limit(stream: TextIO | None = None) -> int | None:
    """The width to fit: None (no limit) with --wide or through a pipe without COLUMNS."""
    if WIDE.get():
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    out = stream or sys.stdout
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    return shutil.get_terminal_size((80, 24)).columns if tty else None


def _cut(value: str, width: int) -> str:
    return value if len(value) <= width else value[: max(width - 1, 0)] + ELLIPSIS


def _fit_text(natural: dict[int, int], room: int, floors: dict[int, int]) -> dict[int, int] | None:
    """Widths for the text columns (index → natural width) within ``room`` characters, the widest
    cut first, none below its floor (or its natural width); None when even that is too wide."""
    lowest = {i: min(w, floors[i]) for i, w in natural.items()}
    if sum(lowest.values()) > room:
        return None
    cap = max(natural.values(), default=0)

    def widths(c: int) -> dict[int, int]:
        return {i: max(min(w, c), lowest[i]) for i, w in natural.items()}

    while cap > 0 and sum(widths(cap).values()) > room:
        cap -= 1
    return widths(cap)


def layout(cols: Sequence[Col], cells: Sequence[Sequence[str]], limit: int | None) -> list[int | None]:
    """Each column's width, or None for a column left out, so that the table fits ``limit``:
    text columns are cut (not below ``COMFORTABLE`` characters) before extra columns are left out
    (the rightmost first), then cut further (not below ``MIN_TEXT``), then left out; key columns
    stay whole, even past the limit."""
    natural = [
        max([len(c.header)] + [len(line) for row in cells for line in row[i].split("\n")])
        for i, c in enumerate(cols)
    ]
    if limit is None or sum(natural) + len(GAP) * (len(cols) - 1) <= limit:
        return list(natural)
    shown = list(range(len(cols)))
    texts = {i: natural[i] for i in shown if cols[i].kind == "text"}

    def attempt(floor: int) -> dict[int, int] | None:
        fixed = sum(natural[i] for i in shown if i not in texts) + len(GAP) * (len(shown) - 1)
        return _fit_text(texts, limit - fixed, {i: max(floor, len(cols[i].header)) for i in texts})

    def widths(text_widths: dict[int, int]) -> list[int | None]:
        return [text_widths.get(i, natural[i]) if i in shown else None for i in range(len(cols))]

    while (fitted := attempt(COMFORTABLE)) is None:
        extras = [i for i in shown if cols[i].kind == "extra"]
        if not extras:
            break
        shown.remove(extras[-1])
    while fitted is None and (fitted := attempt(MIN_TEXT)) is None and texts:
        gone = max(texts)  # a text column that cannot get its floor is left out, the rightmost first
        del texts[gone]
        shown.remove(gone)
    return widths(fitted or {})


def render_rows(rows: Sequence[dict[str, Any]], columns: Iterable[Col | tuple[str, Getter]],
                fmt: Callable[[Any], str], limit: int | None) -> list[str]:  # fmt: skip
    """The table's lines (no title)."""
    cols = [as_col(c) for c in columns]
    cells = [[fmt(c.get(row)) for c in cols] for row in rows]
    widths = layout(cols, cells, limit)
    shown = [i for i, w in enumerate(widths) if w is not None]
    last = shown[-1] if shown else -1

    def line(values: Sequence[str]) -> str:
        parts = []
        for i in shown:
            w = widths[i] or 0
            v = _cut(values[i], w) if cols[i].kind == "text" else values[i]
            parts.append(v if i == last else v.ljust(w))
        return GAP.join(parts).rstrip()

    out = [line([c.header for c in cols])]
    for row in cells:
        split = [v.split("\n") for v in row]
        for n in range(max(len(s) for s in split)):
            out.append(line([s[n] if n < len(s) else "" for s in split]))
    return out


def render_record(record: dict[str, Any], fmt: Callable[[Any], str], skip: Iterable[str] = ()) -> list[str]:
    """``field  value`` lines; a value of several lines is indented under its first."""
    skipped = set(skip)
    items = [(k, fmt(v)) for k, v in record.items() if k not in skipped]
    if not items:
        return []
    pad = max(len(k) for k, _ in items)
    out = []
    for key, value in items:
        first, *more = value.split("\n")
        out.append(f"{key.ljust(pad)}{GAP}{first}".rstrip())
        out += [f"{' ' * pad}{GAP}{m}".rstrip() for m in more]
    return out
