"""The run's ``status.csv``: one line per slide, from any number of processes.

``status.csv`` gets one line per slide (``slide_id,path,status,n_tiles,
seconds,error``), appended under ``fcntl.flock`` so lines from several
processes never interleave; the header is written once, by whoever creates
the file. It is never opened through a symlink, and every cell a spreadsheet
would take for a formula is neutralised (:mod:`~histoserve.text`);
:func:`read_status` gives the original text back, and leaves out lines that
are no status line (a short row a full disk left, a stray edit):
:func:`read_status_checked` says which.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from histoserve.errors import UsageError
from histoserve.text import csv_cell, csv_text

STATUS_FILE = "status.csv"
STATUS_COLUMNS = ("slide_id", "path", "status", "n_tiles", "seconds", "error")
STATUSES = ("done", "skipped", "failed")
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


class StatusLog:
    """``out_dir/status.csv``: one line per slide, safe to append from several processes.

    Every cell goes through :func:`~histoserve.text.csv_cell`: a
    slide id, path or error starting with ``=``, ``+``, ``-``, ``@``, TAB, CR
    (or ``'``) is written with a ``'`` in front, so a spreadsheet shows it as
    text instead of running it as a formula (OWASP's CSV injection: a slide
    named ``=HYPERLINK(...)``). :func:`read_status` takes the ``'`` off again:
    the report and the tests see the real text. The file is never opened
    through a symlink, nor when it is not a regular file.
    """

    def __init__(self, out_dir: Path, name: str = STATUS_FILE) -> None:
        """Log into ``out_dir/status.csv`` (the folder must exist); ``name``: another file name.

        Raises:
            ValueError: No such folder.
            UsageError: ``status.csv`` is a symlink or not a regular file.
        """
        out_dir = Path(out_dir)
        if not out_dir.is_dir():
            raise ValueError(f"output folder {out_dir} does not exist")
        self.path = out_dir / name
        with contextlib.suppress(FileNotFoundError):
            _check_regular(self.path, os.lstat(self.path).st_mode)

    def append(
        self,
        slide_id: str,
        path: str,
        status: str,
        n_tiles: int,
        seconds: float,
        error: str = "",
    ) -> None:
        """Append one line (header first if the file is new), under an exclusive flock.

        Raises:
            ValueError: ``status`` is not ``done``, ``skipped`` or ``failed``.
            UsageError: ``status.csv`` became a symlink or not a regular file.
        """
        import fcntl

        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        # One physical line per slide: a multi-line reason would break line-based tools.
        error = " ".join(str(error).split())
        cells = [slide_id, str(path), status, int(n_tiles), f"{float(seconds):.3f}", error]
        buf = io.StringIO()
        # A "\r\n" terminator makes csv quote a cell holding a CR too (a path with
        # "\r=HYPERLINK(..." must not start a row of its own); lines still end "\n".
        csv.writer(buf, lineterminator="\r\n").writerow([csv_cell(cell) for cell in cells])
        line = buf.getvalue().removesuffix("\r\n") + "\n"
        with _open_status(self.path, _APPEND_FLAGS, "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                header = ""
                if os.fstat(handle.fileno()).st_size == 0:
                    header = ",".join(STATUS_COLUMNS) + "\n"
                handle.write(header + line)
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# O_NONBLOCK: a FIFO planted there fails the open instead of blocking it.


def _check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise UsageError(
            f"{path} is {what}: histoserve embed never writes through one; "
            "remove it, or give another --out"
        )


@contextlib.contextmanager
def _open_status(path: Path, flags: int, mode: str) -> Iterator[io.TextIOWrapper]:
    """``path`` opened as text (``mode``) with ``flags``: never through a symlink (UsageError)."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o666)
    except OSError:
        with contextlib.suppress(OSError):  # say why when something else is there
            _check_regular(path, os.lstat(path).st_mode)
        raise
    with open(fd, mode, newline="", encoding="utf-8", errors="backslashreplace") as handle:
        _check_regular(path, os.fstat(fd).st_mode)
        yield handle


def read_status(out_dir: Path) -> list[dict[str, str]]:
    """The rows of ``out_dir/status.csv`` as written (empty when there is none).

    Cells come back as :class:`StatusLog` was given them (the ``'`` that
    neutralises a formula-like cell removed); malformed lines are left out
    (:func:`read_status_checked`).

    Raises:
        UsageError: ``status.csv`` is a symlink or not a regular file.
    """
    return read_status_checked(out_dir)[0]


def read_status_checked(out_dir: Path) -> tuple[list[dict[str, str]], list[int]]:
    """The well-formed rows of ``out_dir/status.csv`` and the line numbers of the others.

    Well-formed: every column and no more, a slide id, a known status.

    Raises:
        UsageError: ``status.csv`` is a symlink or not a regular file.
    """
    rows, bad = [], []
    try:
        with _open_status(Path(out_dir) / STATUS_FILE, _READ_FLAGS, "r") as handle:
            reader = csv.DictReader(handle)
            for raw in reader:
                row = _status_row(raw)
                if row is None:
                    bad.append(reader.line_num)
                else:
                    rows.append(row)
    except FileNotFoundError:
        return [], []
    return rows, bad


def _status_row(raw: dict[str | None, Any]) -> dict[str, str] | None:
    """A line's cells by column (the ``'`` taken off), or None when it is no status line."""
    cells = [raw.get(name) for name in STATUS_COLUMNS]
    if None in raw or not all(isinstance(cell, str) for cell in cells):
        return None  # too many cells, or too few
    row = {name: csv_text(cell) for name, cell in zip(STATUS_COLUMNS, cells, strict=True)}
    return row if row["slide_id"] and row["status"] in STATUSES else None
