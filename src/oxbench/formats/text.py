"""Reading input files: one place for the I/O errors (and, for text, the encoding rules)."""

from __future__ import annotations

from pathlib import Path

from oxbench import fileio
from oxbench.errors import InputError
from oxbench.fileio import DEFAULT_INPUT_LIMIT


def read_input_bytes(path: str | Path, *, limit: int = DEFAULT_INPUT_LIMIT) -> bytes:
    """The bytes of an input file (a regular file of at most ``limit`` bytes).

    Raises:
        InputError: the file is missing, unreadable, not a regular file or too large (names it).
    """
    return fileio.read_input_bytes(path, limit=limit)


def read_text_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (a leading BOM dropped; LF, CRLF or CR endings).

    Raises:
        InputError: the file is missing, unreadable or not UTF-8 (names the file and the byte).
    """
    path = Path(path)
    data = read_input_bytes(path)
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path) from None
