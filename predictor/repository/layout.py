"""Which folders of ``--model_dir`` are models, and which names a caller may ask for.

A ``--model_dir`` holding a ``*.pt2`` directly (or served with
``--checkpoint``) is today's one-model layout, untouched. Otherwise each
folder holding a ``*.pt2`` or a settings file (:data:`SETTINGS_FILE`) is a
model named by the folder; others (``lost+found`` on a volume's root, hidden
folders) are not models.
"""

from __future__ import annotations

import re
from pathlib import Path

from predictor.errors import InvalidInput

SETTINGS_FILE = "histoserve.json"
"""A model folder's own settings (:mod:`predictor.repository.settings`)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A model's name: a folder name that is safe in a URL path and a log line."""


def model_folders(model_dir: Path, checkpoint: str | None) -> dict[str, Path] | None:
    """``{name: folder}`` of a model directory of one folder per model, in name order.

    Returns:
        None for the one-model layout: ``--checkpoint`` given, a ``*.pt2``
        directly in ``model_dir``, or no model folder in it (start-up then
        says what it found, as ever).
    """
    if checkpoint or not model_dir.is_dir() or any(model_dir.glob("*.pt2")):
        return None
    folders = {
        entry.name: entry
        for entry in sorted(model_dir.iterdir())
        if _NAME.fullmatch(entry.name) and entry.is_dir() and _is_model(entry)
    }
    return folders or None


def _is_model(folder: Path) -> bool:
    return (folder / SETTINGS_FILE).is_file() or any(folder.glob("*.pt2"))


def check_name(name: str, model_dir: Path, folders: dict[str, Path]) -> str:
    """``name`` when it is one of ``folders``; else a 400 naming it and why.

    Raises:
        InvalidInput: A name with a path separator, ``.``/``..``, characters
            outside ``[A-Za-z0-9_.-]``, a file, or no such model folder.
    """
    if name in folders:
        return name
    if not _NAME.fullmatch(name) or name in (".", ".."):
        why = "must be a folder name of letters, digits, '_', '.' or '-' (no path)"
    elif (model_dir / name).is_file():
        why = f"is a file in {model_dir}, not a model folder"
    elif (model_dir / name).is_dir():
        why = f"is a folder of {model_dir} holding no *.pt2 package"
    else:
        why = f"is no model folder of {model_dir} (models: {', '.join(folders) or 'none'})"
    raise InvalidInput(f"model {name!r} {why}", input_name="model_name")
