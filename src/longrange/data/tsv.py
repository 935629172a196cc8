"""Records of the tab-separated task files (ListOps, Retrieval): one reader for both.

:func:`read_tsv` checks the header (when the format has one), the column count of every record and
that the file holds records, and hands each record to the format's parser; a bad record is an
error naming the file and line, or is skipped and counted (``skip_bad``, :class:`BadRecords`).

Lines are read tolerant of two editor habits.

* A UTF-8 byte-order mark (U+FEFF) at the start of the file is dropped: editors such as Notepad and
  spreadsheet exports add it, and it would otherwise glue itself to the first header or label.
* Blank lines (empty or whitespace only) at the end of the file are ignored: many editors end a file
  with one. A blank line followed by more records is kept, and the readers report it as a blank
  line with its number (or count it as a bad record with ``skip_bad``).

The published LRA files have neither; both are tolerated because neither can change a record.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from longrange.data.reading import BadRecords, read_lines
from longrange.errors import DataFormatError

T = TypeVar("T")

BOM = "\ufeff"


def tsv_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a UTF-8 text file as :func:`~longrange.data.reading.read_lines`,
    without a leading byte-order mark and without the blank lines that end the file."""
    blanks: list[tuple[int, str]] = []
    for number, text in read_lines(path):
        if number == 1 and text.startswith(BOM):
            text = text[len(BOM) :]
        if not text.strip():
            blanks.append((number, text))
            continue
        yield from blanks  # blank lines inside the file: the reader reports them
        blanks.clear()
        yield number, text


def check_not_blank(text: str, path: object, number: int) -> None:
    """A DataFormatError for a blank line inside the file (only trailing blank lines are ignored)."""
    if not text.strip():
        raise DataFormatError("blank line (blank lines are ignored only at the end of the file)", path, number)


def read_tsv(
    path: str | os.PathLike,
    columns: Sequence[str],
    parse: Callable[[list[str], int], T],
    bad: BadRecords | None = None,
    *,
    header: Sequence[str] | None = None,
    empty: str = "no records",
) -> list[T]:
    """``parse(columns, line_number)`` of every record of a tab-separated file, in file order.

    Args:
        columns: the names of the columns, for the column-count error.
        parse: turns one record's fields into a value; raises DataFormatError (with the line) for a
            bad field.
        bad: skips and counts bad records (default: the first one is raised).
        header: the header line's fields, when the format has a header line (checked, then skipped).
        empty: the error's words for a file without records (and without skipped ones).
    """
    bad = bad if bad is not None else BadRecords(skip_bad=False)
    lines = tsv_lines(path)  # a leading BOM and trailing blank lines are tolerated
    if header is not None:
        first = next(lines, None)
        if first is None:
            raise DataFormatError("no header line (the file holds only blank lines)", path)
        if first[1].split("\t") != list(header):
            raise DataFormatError(f"expected the header {'<TAB>'.join(header)!r}, found {first[1][:60]!r}", path, 1)
    out: list[T] = []
    for number, text in lines:
        try:
            check_not_blank(text, path, number)
            fields = text.split("\t")
            if len(fields) != len(columns):
                raise DataFormatError(
                    f"expected {len(columns)} tab-separated columns ({', '.join(columns)}), found {len(fields)}",
                    path,
                    number,
                )
            out.append(parse(fields, number))
        except DataFormatError as err:
            bad.handle(err)
    if not out and not bad.counts.get(str(path)):
        raise DataFormatError(empty, path)
    return out
