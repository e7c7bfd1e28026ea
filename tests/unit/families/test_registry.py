"""Family registry: every built-in spec maps to a server model class, no if-chains.

Embedding backbones are served by ``BaseServerModel`` itself (the seed's
shape); the other families are its subclasses.
"""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.families import model_class_for
from predictor.families.multimodal import MultimodalServerModel
from predictor.families.segmentation import SegmentationServerModel
from predictor.model.base import BaseServerModel
from predictor.spec import BUILTIN_SPECS, FAMILIES


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


def test_every_family_a_spec_can_name_has_a_class_and_no_other():
    """``register_family`` is gone: it registered classes for families no spec can name."""
    from predictor import families

    assert not hasattr(families, "register_family")
    assert set(families._BUILTIN) == set(FAMILIES)
    for family in FAMILIES:
        spec = next(s for s in BUILTIN_SPECS.values() if s.family == family)
        assert issubclass(model_class_for(spec), BaseServerModel)


def test_unknown_family_is_a_spec_error(monkeypatch):
    from predictor import families

    monkeypatch.setattr(families, "_BUILTIN", {})
    with pytest.raises(SpecError, match="embedding"):
        model_class_for(BUILTIN_SPECS["h0"])


@pytest.mark.parametrize("name", ["h0-mini", "m-optimus", "tissue-seg"])
def test_each_family_owns_its_package_names_demo_and_output_check(name):
    import torch

    from predictor.families import build_demo_model, check_consistency, demo_example_inputs

    spec = BUILTIN_SPECS[name]
    family = model_class_for(spec)
    inputs = demo_example_inputs(spec, 2)
    assert len(inputs) == len(family.PACKAGE_INPUTS) and inputs[0].shape[1:] == (
        3,
        spec.tile_size,
        spec.tile_size,
    )
    with torch.no_grad():
        outputs = build_demo_model(spec, "tiny")(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outputs) == len(family.PACKAGE_OUTPUTS)
    check_consistency(spec, [tuple(o.shape[1:]) for o in outputs])
    with pytest.raises(SpecError, match="unknown demo options"):
        build_demo_model(spec, "tiny", no_such_option=1)
