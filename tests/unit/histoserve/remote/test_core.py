"""The client's one connection core: one place builds HTTP connections, one loop retries."""

from __future__ import annotations

import ast
from pathlib import Path

import histoserve

PACKAGE = Path(histoserve.__file__).parent
CODEC_ERRORS = {
    "wire/format.py:WireError",
    "slides/tiff/jpeg_tiles.py:JpegTileError",
    "jsonsafe.py:JsonError",
}


def _calls(attribute: str) -> dict[str, int]:
    """Modules (relative paths) that call ``<something>.<attribute>(...)`` and how often."""
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == attribute
            ):
                name = str(path.relative_to(PACKAGE))
                found[name] = found.get(name, 0) + 1
    return found


def test_one_module_builds_http_clients_and_pools() -> None:
    for constructor in ("Client", "AsyncClient", "HTTPTransport", "ConnectionPool", "HTTPProxy"):
        assert set(_calls(constructor)) <= {"remote/http.py"}, constructor
    assert _calls("Client") == {"remote/http.py": 1}
    requests = {m for verb in ("get", "post", "stream", "request") for m in _calls(verb)}
    assert "remote/http.py" in requests  # send() is where requests are made


def test_one_retry_loop() -> None:
    assert _calls("delay_s") == {"remote/dispatch.py": 1}  # RetryPolicy.run
    runs = _calls("run")
    assert set(runs) == {"remote/dispatch.py"}  # Dispatcher.send: every request, describe too


def test_one_error_tree() -> None:
    from histoserve import errors

    roots = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(
                ("Error", "Refused", "Failed", "Answer")
            ):
                bases = {b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases}
                # Format parsers' ValueErrors, wrapped where they meet a file or a server:
                # wire/ (both sides share it; the server's edge maps WireError, the client
                # makes it a BadAnswer), a slide's JPEG tiles (a SlideError naming the file) and
                # bounded JSON (each reader's own refusal: a usage error, a re-embed, a 400).
                codec = f"{path.relative_to(PACKAGE)}:{node.name}" in CODEC_ERRORS
                own = path.name != "errors.py" and not codec
                if own and bases & {"Exception", "RuntimeError", "ValueError"}:
                    roots.add(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert not roots, f"error classes outside histoserve.errors' tree: {sorted(roots)}"
    for name in ("RetryableError", "BadAnswer", "ServerRefused", "InferenceError", "RequestFailed"):
        assert issubclass(getattr(errors, name), errors.RemoteError)
    # One root for every client error; a HistoserveClient's errors are no EmbedError.
    for name in ("UsageError", "EmbedError", "RemoteError"):
        assert getattr(errors, name).__bases__ == (errors.HistoserveError,), name
    assert issubclass(errors.SlideError, errors.EmbedError)
    assert issubclass(errors.InferenceError, errors.RequestFailed)
    assert not issubclass(errors.RemoteError, errors.EmbedError)
