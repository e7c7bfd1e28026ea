"""Text that leaves the client for a terminal or a spreadsheet, made harmless there.

Slide ids, paths and server messages are written by whoever made the
cohort, the file system and the server, and end up in two places that
interpret what they are given:

- a terminal, where ESC sequences move the cursor, clear the screen, change
  the title or forge colours, CR/backspace overwrite what was printed, a
  newline forges a line and Unicode bidi overrides reorder what is shown:
  :func:`printable` escapes every control character (``\\x1b``, ``\\n``,
  ``\\u202e``...) and is what progress lines, the CLI's messages and its log
  lines go through;
- a spreadsheet opening ``status.csv``, where a cell starting with ``=``,
  ``+``, ``-``, ``@``, TAB or CR is a formula (OWASP's CSV injection; a
  ``=HYPERLINK(...)`` slide id becomes a link): :func:`csv_cell` prefixes such
  a cell with ``'`` (as OWASP recommends: the spreadsheet shows the text) and
  :func:`csv_text` takes the prefix off again, so the report and every other
  reader see the real text. A cell that itself starts with ``'`` is prefixed
  too, so the two are exact inverses.
"""

from __future__ import annotations

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_LINES = (0x2028, 0x2029)  # Unicode line and paragraph separators
_NAMED = {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_CONTROLS = (*range(0x20), 0x7F, *range(0x80, 0xA0))
_SURROGATES = range(0xD800, 0xE000)  # undecodable bytes of a file name (surrogateescape)
_ESCAPES = {c: _NAMED.get(c, f"\\x{c:02x}") for c in _CONTROLS} | {
    c: f"\\u{c:04x}" for c in (*_BIDI, *_LINES, *_SURROGATES)
}
_ESCAPES_BUT_NEWLINE = {c: e for c, e in _ESCAPES.items() if c != ord("\n")}

# OWASP's formula triggers, their full-width forms (some spreadsheets take them
# too), LF for good measure, and the quote itself so that csv_text can undo it.
_FORMULA_START = (*"=+-@\t\r\n'", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character escaped, as Python writes it (``\\x1b``).

    C0 and C1 controls, DEL, the Unicode bidi controls (U+202A-U+202E,
    U+2066-U+2069, U+200E/F, U+061C), line separators and lone surrogates
    (the undecodable bytes of a file name) are escaped;
    ``keep_newlines`` leaves ``\\n`` alone (a traceback's lines).
    """
    table = _ESCAPES_BUT_NEWLINE if keep_newlines else _ESCAPES
    return str(text).translate(table)


def csv_cell(text: object) -> str:
    """``text`` as a CSV cell no spreadsheet takes for a formula (``'`` prefixed when it could)."""
    text = str(text)
    return "'" + text if text.startswith(_FORMULA_START) else text


def csv_text(cell: str) -> str:
    """The text :func:`csv_cell` was given (one leading ``'`` removed)."""
    return cell[1:] if cell.startswith("'") else cell
