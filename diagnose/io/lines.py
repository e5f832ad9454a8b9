"""Reading line-oriented input files (workload files, datasets): a ``.gz`` opened as such, lines over ``MAX_LINE``
bytes skipped and counted while read in pieces (never held whole), and the records that do not fit counted
with the first one remembered for the one warning or error line."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

from diagnose.errors import InputError

MAX_LINE = 16 << 20  # bytes: a longer line is skipped and counted without ever being held whole


def open_input(path: Path) -> IO[bytes]:
    """``path`` for reading in bytes, decompressed when its name ends in ``.gz``."""
    if path.name.lower().endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return path.open("rb")


class Skips:
    """Counts the records that do not fit; remembers the first (file:line: why) for the warning/error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = 0
        self.first = ""

    def add(self, where: int | str, why: str) -> None:
        """One more record skipped: ``where`` is its line number in the file, or its place in words."""
        self.n += 1
        if not self.first:
            self.first = f"{self.path}:{where}: {why}" if isinstance(where, int) else f"{where}: {why}"


def raw_lines(path: Path, skips: Skips | None, kind: str = "a workload file") -> Iterator[tuple[int, bytes]]:
    """(line number, stripped line) of each non-blank line; a line over ``MAX_LINE`` bytes is skipped (and
    counted) while being read in pieces, never held whole. Without ``skips`` such a line ends the read: the
    file is not ``kind``."""
    with open_input(path) as fh:
        n = 0
        while True:
            line = fh.readline(MAX_LINE + 1)
            if not line:
                return
            n += 1
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while True:
                    rest = fh.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                if skips is None:
                    raise InputError(f"{path}:{n}: a line longer than {MAX_LINE >> 20} MiB: not {kind}")
                skips.add(n, f"line longer than {MAX_LINE >> 20} MiB")
                continue
            line = line.strip()
            if line:
                yield n, line
