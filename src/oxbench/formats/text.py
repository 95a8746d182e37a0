"""Reading input files: one place for the I/O errors (and, for text, the encoding rules)."""

from __future__ import annotations

from pathlib import Path

from oxbench.errors import InputError


def read_input_bytes(path: str | Path) -> bytes:
    """The bytes of an input file.

    Raises:
        InputError: the file is missing or unreadable (names the file).
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


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
