"""Family registry: every family a spec can name is one module found by its name, no if-chains.

Every family is served by the one ``BaseServerModel`` holding the family's
hooks; embedding backbones' are the tile family's defaults (the seed's shape).
"""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.families import family_for, server_model
from predictor.families.multimodal import MultimodalFamily
from predictor.families.segmentation import SegmentationFamily
from predictor.families.slide import SlideFamily
from predictor.model.base import BaseServerModel
from predictor.model.family import Family
from predictor.model.tiles import TileFamily
from predictor.spec import BUILTIN_SPECS, FAMILIES


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("h0-mini", TileFamily),
        ("h0", TileFamily),
        ("h1", TileFamily),
        ("m-optimus", MultimodalFamily),
        ("tissue-seg", SegmentationFamily),
        ("abmil-demo", SlideFamily),
    ],
)
def test_builtin_specs_map_to_their_family(name, cls):
    assert family_for(BUILTIN_SPECS[name]) is cls


def test_every_family_a_spec_can_name_is_the_module_of_its_name():
    """``register_family`` is gone: it registered classes for families no spec can name."""
    import importlib

    from predictor import families

    assert not hasattr(families, "register_family")
    for family in FAMILIES:
        module = importlib.import_module(f"predictor.families.{family}")
        assert family_for(family) is module.FAMILY and issubclass(module.FAMILY, Family)
        spec = next(s for s in BUILTIN_SPECS.values() if s.family == family)
        model = server_model(spec, "absent.pt2", device="cpu")
        assert type(model) is BaseServerModel and isinstance(model.family, module.FAMILY)


def test_unknown_family_is_a_spec_error():
    with pytest.raises(SpecError, match="embedding"):
        family_for("no-such-family")


def test_a_spec_of_another_family_needs_its_family_named():
    with pytest.raises(SpecError, match="family_for"):
        BaseServerModel(BUILTIN_SPECS["tissue-seg"], "absent.pt2", device="cpu")


@pytest.mark.parametrize("name", ["h0-mini", "m-optimus", "tissue-seg"])
def test_each_family_owns_its_package_names_demo_and_output_check(name):
    import torch

    from predictor.families import build_demo_model, check_consistency, demo_example_inputs

    spec = BUILTIN_SPECS[name]
    family = family_for(spec)
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
