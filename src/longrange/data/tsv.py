"""Lines of the tab-separated task files (ListOps, Retrieval), tolerant of two editor habits.

* A UTF-8 byte-order mark (U+FEFF) at the start of the file is dropped: editors such as Notepad and
  spreadsheet exports add it, and it would otherwise glue itself to the first header or label.
* Blank lines (empty or whitespace only) at the end of the file are ignored: many editors end a file
  with one. A blank line followed by more records is kept, and the readers report it as a blank
  line with its number (or count it as a bad record with ``skip_bad``).

The published LRA files have neither; both are tolerated because neither can change a record.
"""
from __future__ import annotations

import os
from typing import Iterator

from longrange.data.tasks import read_lines
from longrange.errors import DataFormatError

BOM = "\ufeff"


def tsv_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a UTF-8 text file as :func:`~longrange.data.tasks.read_lines`,
    without a leading byte-order mark and without the blank lines that end the file."""
    blanks: list[tuple[int, str]] = []
    for number, text in read_lines(path):
        if number == 1 and text.startswith(BOM):
            text = text[len(BOM):]
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
