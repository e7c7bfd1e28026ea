"""The server as it was before issue 12's request-path work, for "before and after" cells.

Issue 12 asks for the null model's requests/s and CPU per request *before
and after*. Figures from an earlier run on this shared machine are not
comparable with today's, so the old server runs beside the new one in the
same run: :func:`source_tree` extracts ``predictor/`` at :data:`BEFORE_COMMIT`
from this repository's history into the package cache, and
:func:`bench.servers.launch.start_histoserve` starts ``python -m predictor`` there.
It uses the same virtual environment, so only our code differs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.packages import cache_root
from harness.server import REPO

BEFORE_COMMIT = "33e2509"
"""The commit whose server ``make bench`` runs beside today's on the null model
(``bench/results/results.md``): a server without the REST fast path, with
KServe's trace lines on and its metrics looked up per request."""


def source_tree(commit: str = BEFORE_COMMIT, package: str = "predictor") -> Path:
    """A folder holding ``package`` (``predictor/``, ``histoserve/``) as of ``commit``.

    Extracted once, then reused.

    Raises:
        RuntimeError: git is missing or the history lacks ``commit`` (a shallow clone).
    """
    target = cache_root() / f"{package}-{commit}"
    if (target / package / "__main__.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{package}-{commit}-", dir=target.parent))
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, package],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
        os.replace(staging, target)
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if (target / package / "__main__.py").is_file():
            return target  # another run extracted it meanwhile
        detail = getattr(exc, "stderr", b"") or b""
        raise RuntimeError(
            f"cannot extract {package}/ at {commit}: {exc} {detail.decode(errors='replace')}"
        ) from exc
    return target


def checkout_commit() -> str:
    """This checkout's commit (``+dirty`` with local changes): the "after" of a
    before-and-after result, recorded beside the "before" commit as its provenance."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")
