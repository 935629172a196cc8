"""What the loaders share to read their files: :func:`require_files` (a clear error naming the first
missing file and how to obtain the data), :func:`read_lines` (the lines of a UTF-8 text file, with
line numbers for errors) and :class:`BadRecords` (malformed records skipped and counted with
``skip_bad``, or raised)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from longrange.errors import DataFormatError, DataMissingError


def require_files(paths: Sequence[Path], how_to_obtain: str) -> None:
    """DataMissingError naming the first missing path and how to obtain the data."""
    for path in paths:
        if not Path(path).exists():
            raise DataMissingError(f"expected {path} but it does not exist; {how_to_obtain}")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` of a UTF-8 text file, line numbers from 1, without line endings.

    Lines end at ``\n`` only (a ``\r`` before it is dropped; other ``\r`` stay inside the line).
    Raises DataMissingError if the file is absent and DataFormatError if it is empty or a line is
    not valid UTF-8.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataMissingError(f"expected {path} but it does not exist") from None
    with f:
        number = 0
        for number, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"not valid UTF-8 ({err.reason} at byte {err.start})", path, number) from None
        if number == 0:
            raise DataFormatError("empty file", path)


class BadRecords:
    """Counts malformed records per file when skipping them, or re-raises the error.

    Usage in a reader loop::

        try:
            ...parse the record...
        except DataFormatError as err:
            bad.handle(err)
            continue
    """

    def __init__(self, skip_bad: bool):
        self.skip_bad = skip_bad
        self.counts: dict[str, int] = {}

    def handle(self, err: DataFormatError) -> None:
        if not self.skip_bad:
            raise err
        key = str(err.path)
        self.counts[key] = self.counts.get(key, 0) + 1
