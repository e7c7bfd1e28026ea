"""The commands of the user docs, as a reader copies them out of the fenced blocks.

Contract: :func:`doc_commands` returns every command of the user docs
(:data:`DOC_GLOBS`) keyed by its text, each with the places it appears. A
command is

- a whole fenced block tagged ``python`` (one program), or
- one command line of a block tagged ``bash``/``sh``/``shell``/``console``, or
  of an untagged block whose first word is one of :data:`PROGRAMS` (the other
  untagged blocks are diagrams and formulas): comment lines and a trailing
  `` # comment`` dropped, backslash continuations joined with one space,
  newlines inside quotes kept (``python -c '...'`` over several lines).

Other blocks (``yaml``, ``text``, ...) hold no commands. Inline code in the
prose (```make serve```) is not extracted.

Why: ``tests/integration/test_docs_commands.py`` runs (or renders, or lists
with the reason it cannot run here) each command by this text, and fails when
the docs' commands and its registry differ: a command changed in the docs
without its test, or a test left for a command the docs dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC_GLOBS = ("README.md", "docs/*.md", "charts/*/README.md")
"""The user docs, relative to the repository root."""
SHELL_TAGS = frozenset({"bash", "sh", "shell", "console"})
PYTHON_TAGS = frozenset({"python", "py"})
PROGRAMS = frozenset({"histoserve", "helm", "kubectl", "docker", "python", "make", "curl", "pip"})
"""An untagged block is shell when its first word is one of these."""

_FENCE = re.compile(r"^```\s*([\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its tag (``""`` when untagged), where it opens, its text."""

    tag: str
    source: str
    body: str


@dataclass(frozen=True)
class DocCommand:
    """One command: its text (the registry key), ``shell`` or ``python``, where it appears."""

    text: str
    language: str
    sources: tuple[str, ...]


def doc_files(repo: Path = REPO) -> list[Path]:
    """The user docs that exist, in a stable order."""
    return sorted({p for pattern in DOC_GLOBS for p in repo.glob(pattern)})


def fenced_blocks(text: str, name: str) -> Iterator[Block]:
    """The fenced blocks of one Markdown text (``name:line`` of each opening fence)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, i = i, i + 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        yield Block(match.group(1).lower(), f"{name}:{start + 1}", "\n".join(lines[start + 1 : i]))
        i += 1


def block_language(block: Block) -> str | None:
    """``shell``, ``python`` or ``None`` (a block that holds no command)."""
    if block.tag in PYTHON_TAGS:
        return "python"
    if block.tag in SHELL_TAGS:
        return "shell"
    words = block.body.split()
    if not block.tag and words and words[0] in PROGRAMS:
        return "shell"
    return None


def shell_commands(body: str) -> list[str]:
    """The command lines of a shell block, as the shell reads them (see the module docstring)."""
    commands: list[str] = []
    current: list[str] = []
    quote = ""
    i = 0
    while i < len(body):
        ch = body[i]
        if quote:
            current.append(ch)
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
            current.append(ch)
        elif ch == "\\" and body[i + 1 : i + 2] == "\n":
            i = _continue_line(body, i + 2, current)
            continue
        elif ch == "#" and (not current or current[-1].isspace()):
            i = body.find("\n", i) if "\n" in body[i:] else len(body)
            continue
        elif ch == "\n":
            _flush(current, commands)
        else:
            current.append(ch)
        i += 1
    _flush(current, commands)
    return commands


def _continue_line(body: str, at: int, current: list[str]) -> int:
    """Joins a continued line with one space; returns where the next line's text starts."""
    while current and current[-1].isspace():
        current.pop()
    current.append(" ")
    while at < len(body) and body[at] in " \t":
        at += 1
    return at


def _flush(current: list[str], commands: list[str]) -> None:
    text = "".join(current).strip()
    if text:
        commands.append(text)
    current.clear()


def block_commands(block: Block) -> list[tuple[str, str]]:
    """``(language, command text)`` of each command in one block."""
    language = block_language(block)
    if language == "python":
        return [("python", block.body.strip("\n"))]
    if language == "shell":
        return [("shell", command) for command in shell_commands(block.body)]
    return []


def doc_commands(repo: Path = REPO) -> dict[str, DocCommand]:
    """Every command of the user docs by its text; one text in two places is one command."""
    found: dict[str, tuple[str, list[str]]] = {}
    for path in doc_files(repo):
        name = str(path.relative_to(repo))
        for block in fenced_blocks(path.read_text(encoding="utf-8"), name):
            for language, text in block_commands(block):
                found.setdefault(text, (language, []))[1].append(block.source)
    return {text: DocCommand(text, lang, tuple(where)) for text, (lang, where) in found.items()}
