"""charts/histoserve-embed as its tests render it: helm template, refusals, the pod's flags.

Shared by ``test_embed_chart.py`` and ``test_embed_chart_values.py`` (so neither
imports the other); chart-independent helpers are in :mod:`tests.chart.helpers`.
"""

from __future__ import annotations

import functools
import subprocess
from typing import Any

from tests.chart.helpers import REPO, load_yaml, one, parse_docs

CHART = REPO / "charts" / "histoserve-embed"
CI = CHART / "ci"
NAMESPACE = "cohorts"
RELEASE = "brca"
# The minimum a user must give: the server and the two volumes.
REQUIRED_SETS = (
    "inferenceService.name=h0-histoserve",
    "slides.pvc.claimName=slides",
    "output.pvc.claimName=embeddings",
)


class HelmRefused(Exception):
    """``helm template`` exited non-zero; the message is its stderr."""


@functools.lru_cache(maxsize=128)
def template(helm: str, args: tuple[str, ...]) -> str:
    """``helm template`` of the embed chart with ``args`` (cached); raises :class:`HelmRefused`."""
    cmd = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise HelmRefused(proc.stderr)
    return proc.stdout


def render(helm: str, values: str | None = None, *sets: str, set_files: tuple = ()) -> list[dict]:
    """Objects of ``helm template`` for a ci/ file (or the required minimum) plus --set's."""
    args: list[str] = []
    if values:
        args += ["--values", str(CI / values)]
    else:
        for s in REQUIRED_SETS:
            args += ["--set", s]
    for s in sets:
        args += ["--set-json", s]
    for s in set_files:
        args += ["--set-file", s]
    return parse_docs(template(helm, tuple(args)))


def refused(helm: str, *args: str) -> str:
    """The error ``helm template`` gives for ``args``; fails the test if it accepts them."""
    try:
        template(helm, tuple(args))
    except HelmRefused as exc:
        return str(exc)
    raise AssertionError(f"helm template accepted values that must be refused: {args}")


def ci_values(name: str) -> dict[str, Any]:
    """One ``ci/`` values file, parsed."""
    return load_yaml((CI / name).read_text())


def pod_spec(objs: list[dict]) -> dict:
    """The Job's pod spec."""
    return one(objs, "Job")["spec"]["template"]["spec"]


def container(objs: list[dict]) -> dict:
    """The Job's one container."""
    (c,) = pod_spec(objs)["containers"]
    return c


def flags(c: dict) -> dict[str, list[str]]:
    """--flag=value arguments after ``embed``: every value per flag, in order."""
    assert c["command"] == ["histoserve"], c["command"]
    assert c["args"][0] == "embed", c["args"]
    out: dict[str, list[str]] = {}
    for arg in c["args"][1:]:
        assert arg.startswith("--"), f"not a --flag: {arg!r}"
        name, _, value = arg[2:].partition("=")
        out.setdefault(name, []).append(value)
    return out
