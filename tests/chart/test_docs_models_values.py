"""The user docs' multi-model chart values render and validate as written.

A ``yaml`` block of README.md or docs/deployment.md holding a top-level
``models:`` is what a reader copies into a values file: it must render, every
object must pass KServe's CRD schemas, and each entry must become its folder.
"""

from __future__ import annotations

import re

import pytest
import yaml

from harness.docs import REPO
from tests.chart.helpers import args_of, isvc_container

DOCS = ("README.md", "docs/deployment.md")
_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.M | re.S)


def _models_blocks() -> list[tuple[str, dict]]:
    blocks = []
    for doc in DOCS:
        for body in _BLOCK.findall((REPO / doc).read_text()):
            values = yaml.safe_load(body)
            if isinstance(values, dict) and "models" in values:
                blocks.append((doc, values))
    return blocks


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, path + "."))
        else:
            out[path] = value
    return out


def test_both_docs_show_the_models_values():
    assert {doc for doc, _ in _models_blocks()} == set(DOCS)


@pytest.mark.parametrize(("doc", "values"), _models_blocks(), ids=lambda v: str(v)[:20])
def test_the_docs_models_values_render_valid(render, validate_object, doc, values):
    objs = render(set_json=_flat(values))
    for obj in objs:
        validate_object(obj)
    names = [m["name"] for m in values["models"]]
    assert args_of(isvc_container(objs))["models"] == ",".join(names), doc
    settings = next(
        o for o in objs if o["kind"] == "ConfigMap" and "model-settings" in o["metadata"]["name"]
    )
    assert sorted(settings["data"]) == sorted(f"{n}.json" for n in names), doc
