"""Family registry: every built-in spec maps to a server model class, no if-chains."""

from __future__ import annotations

import dataclasses

import pytest

from predictor.errors import SpecError
from predictor.families import model_class_for, register_family
from predictor.families.multimodal import MultimodalServerModel
from predictor.families.segmentation import SegmentationServerModel
from predictor.model import BaseServerModel
from predictor.spec import BUILTIN_SPECS


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("h0-mini", BaseServerModel),
        ("h0", BaseServerModel),
        ("h1", BaseServerModel),
        ("m-optimus", MultimodalServerModel),
        ("tissue-seg", SegmentationServerModel),
    ],
)
def test_builtin_specs_map_to_their_class(name, cls):
    assert model_class_for(BUILTIN_SPECS[name]) is cls


def test_registering_a_family_routes_specs_to_it(monkeypatch):
    from predictor import families

    monkeypatch.setattr(families, "_REGISTRY", dict(families._REGISTRY))

    @register_family("embedding")
    class Custom(BaseServerModel):
        pass

    assert model_class_for(BUILTIN_SPECS["h0"]) is Custom


def test_unknown_family_is_a_spec_error(monkeypatch):
    from predictor import families

    monkeypatch.setattr(families, "_REGISTRY", {})
    monkeypatch.setattr(families, "_load_builtin_families", lambda: None)
    spec = dataclasses.replace(BUILTIN_SPECS["h0"])
    with pytest.raises(SpecError, match="embedding"):
        model_class_for(spec)
