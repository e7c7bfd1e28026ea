"""Family registry: every family a spec can name is one module found by its name, no if-chains.

Every family is served by the one ``BaseServerModel``, which asks the registry
for the family's hooks; a spec's family part (its modes, its section) is
checked there, through the family.
"""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.families import FAMILIES, family_for, server_model
from predictor.families.embedding import EmbeddingFamily
from predictor.families.multimodal import MultimodalFamily
from predictor.families.segmentation import SegmentationFamily
from predictor.families.slide import SlideFamily
from predictor.model.base import BaseServerModel
from predictor.model.family import Family
from predictor.spec import BUILTIN_SPECS, spec_from_dict


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("h0-mini", EmbeddingFamily),
        ("h0", EmbeddingFamily),
        ("h1", EmbeddingFamily),
        ("m-optimus", MultimodalFamily),
        ("tissue-seg", SegmentationFamily),
        ("abmil-demo", SlideFamily),
    ],
)
def test_builtin_specs_map_to_their_family(name, cls):
    assert family_for(BUILTIN_SPECS[name]) is cls


def test_every_family_a_spec_can_name_is_the_module_of_its_name():
    """``FAMILIES`` are the registry's modules; the model asks the registry for its family."""
    import importlib

    from predictor import families

    assert not hasattr(families, "register_family")
    assert FAMILIES == ("embedding", "multimodal", "segmentation", "slide")
    for family in FAMILIES:
        module = importlib.import_module(f"predictor.families.{family}")
        assert family_for(family) is module.FAMILY and issubclass(module.FAMILY, Family)
        spec = next(s for s in BUILTIN_SPECS.values() if s.family == family)
        model = server_model(spec, "absent.pt2", device="cpu")
        assert type(model) is BaseServerModel and type(model.family) is module.FAMILY
        direct = BaseServerModel(spec, "absent.pt2", device="cpu")  # the seed's constructor
        assert type(direct.family) is module.FAMILY


def test_unknown_family_is_a_spec_error():
    with pytest.raises(SpecError, match="embedding"):
        family_for("no-such-family")
    spec = spec_from_dict({**BUILTIN_SPECS["h0-mini"].to_dict(), "family": "classifier"})
    with pytest.raises(SpecError, match="spec 'h0-mini': family 'classifier' is not one of"):
        BaseServerModel(spec, "absent.pt2", device="cpu")


def _spec(name: str, **changes: object):
    return spec_from_dict({**BUILTIN_SPECS[name].to_dict(), "name": "custom", **changes})


@pytest.mark.parametrize(
    ("base", "changes", "needle"),
    [
        ("h0-mini", {"modes": ["embed"]}, r"modes \['embed'\] must be drawn from \['embedding'\]"),
        ("h0-mini", {"modes": ["prediction"]}, "must be drawn from"),  # not an embedding's
        ("tissue-seg", {"modes": ["attention"]}, "must be drawn from"),
        ("m-optimus", {"bulk_rna_transform": "log2"}, "unknown bulk_rna_transform 'log2'"),
        ("m-optimus", {"prediction_transform": "exp"}, "unknown prediction_transform 'exp'"),
        ("tissue-seg", {"mask_threshold": 1.0}, "mask_threshold must be between 0 and 1"),
        (
            "h0-mini",
            {"bulk_rna_transform": "log2"},
            "sets bulk_rna_transform 'log2', which only a multimodal",
        ),
        ("h0-mini", {"classes": ["a"]}, r"sets classes \('a',\), which only a slide spec has"),
        ("abmil-demo", {"mask_threshold": 0.7}, "which only a segmentation spec has"),
    ],
)
def test_the_family_part_of_a_spec_is_checked_through_its_family(base, changes, needle):
    spec = _spec(base, **changes)  # what every spec has is fine
    with pytest.raises(SpecError, match=needle):
        family_for(spec)
    with pytest.raises(SpecError, match=needle):
        BaseServerModel(spec, "absent.pt2", device="cpu")


@pytest.mark.parametrize("name", sorted(BUILTIN_SPECS))
def test_every_builtin_spec_passes_its_family(name):
    family_for(BUILTIN_SPECS[name])


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
