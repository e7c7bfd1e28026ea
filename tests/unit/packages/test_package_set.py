"""Package sets: build keys, and which package of a model directory start-up takes.

Real packages exported here: the tiny h0-mini demo built ``-march=native``
and built ``x86-64-v3`` (shared with ``tests/unit/export/test_build.py``
through the package cache). A GPU package cannot be built here: the third
member is a copy of the portable one whose metadata claims CUDA ``sm_90``
(:func:`harness.package_sets.fake_gpu_package`), and hosts we do not run on
are :class:`HostFacts` values, the suite's one fake of the host.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.package_sets import claim, lie, rewrite_metadata, three_builds
from predictor.errors import CheckpointError, IncompatiblePackage
from predictor.packages import package_set
from predictor.packages.build_key import BUILD_KEY_KEY, BuildKey, key_from_metadata
from predictor.packages.facts import inspect_package
from predictor.packages.host import HostFacts, check_host_compat
from predictor.packages.metadata import CPU_BUILD_KEY, read_metadata
from predictor.packages.phases import StartupPhases

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three builds, each under its build key's name, in one folder (copy before editing)."""
    return three_builds(tmp_path_factory.mktemp("package-set"))


def _set(tmp_path: Path, builds: dict[str, Path], *labels: str) -> list[Path]:
    for label in labels:
        shutil.copy2(builds[label], tmp_path / builds[label].name)
    return sorted(tmp_path / builds[label].name for label in labels)


def _narrow_cpu(builds: dict[str, Path]) -> HostFacts:
    """An x86-64 host with exactly the portable build's instruction sets (not the native's)."""
    flags = json.loads(read_metadata(builds["v3"])[CPU_BUILD_KEY])["required_flags"]
    return HostFacts("linux", "x86_64", frozenset(flags))


def _gpu_host(capability: str, cuda: str = "12.8") -> HostFacts:
    here = HostFacts.detect()
    return HostFacts("linux", "x86_64", here.cpu_flags, (capability,), cuda_version=cuda)


# -- build keys ---------------------------------------------------------------------------
def test_the_build_key_names_the_package_and_is_in_its_metadata(builds: dict[str, Path]) -> None:
    native = key_from_metadata(read_metadata(builds["native"]))
    v3 = key_from_metadata(read_metadata(builds["v3"]))
    assert native is not None and v3 is not None
    assert (native.spec, native.weights, native.dtype) == ("h0-mini", "demo:tiny", "fp32")
    assert (native.min_batch, native.max_batch, native.cuda) == (1, 256, None)
    assert native.torch == torch.__version__.split("+")[0]
    assert native.target.startswith("native-") and v3.target == "x86-64-v3"
    assert native.model == v3.model and native.name != v3.name
    assert v3.name == f"h0-mini_demo-tiny_fp32_b1-8_torch{v3.torch}_cpu_x86-64-v3"
    for key in (native, v3):
        assert all(c.isalnum() or c in "._-" for c in key.name)
        assert BuildKey(**json.loads(key.to_json())) == key


def test_a_package_without_a_recorded_key_gets_the_same_key_from_its_provenance(
    builds: dict[str, Path],
) -> None:
    for label in ("native", "v3", "gpu"):
        metadata = read_metadata(builds[label])
        recorded = key_from_metadata(metadata)
        del metadata[BUILD_KEY_KEY]
        assert key_from_metadata(metadata) == recorded, label
    assert key_from_metadata({"AOTI_DEVICE_KEY": "cpu"}) is None  # built elsewhere: no key


def test_weights_from_a_file_are_named_by_their_digest() -> None:
    target = "sm_90+native-1a2b3c4d"
    key = BuildKey("h0", "sha256:" + "ab" * 32, "bf16", 1, 64, "2.13.0", "12.8", target)
    assert key.name == "h0_wabababababab_bf16_b1-64_torch2.13.0_cu12.8_sm-90+native-1a2b3c4d"
    assert key.weights_sha256 == "ab" * 32
    long_label = BuildKey("h0", "module:" + "x" * 60, "fp32", 1, 8, "2.13.0", None, "x86-64-v3")
    assert len(long_label.name) < 80 and "xxxx" not in long_label.name


# -- the choice ---------------------------------------------------------------------------
def test_three_builds_on_this_cpu_take_the_native_one(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    candidates = _set(tmp_path, builds, "native", "v3", "gpu")
    choice = package_set.choose_package(
        tmp_path, candidates, CPU, HostFacts.detect(), served_batch=lambda _: 8
    )
    assert choice.path.name == builds["native"].name
    rejected = dict(choice.rejected)
    assert rejected[builds["v3"].name] == f"fits, ranked below {builds['native'].name}"
    assert "package was built for cuda but the server runs on cpu" in rejected[builds["gpu"].name]
    served = choice.as_dict()
    assert served["chosen"] == builds["native"].name
    assert served["build_key"]["name"] == builds["native"].stem
    assert {r["file"] for r in served["rejected"]} == {builds["v3"].name, builds["gpu"].name}
    assert builds["gpu"].name in choice.log_line() and "not taken" in choice.log_line()


def test_a_cpu_without_the_native_build_s_instructions_takes_the_portable_one(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    candidates = _set(tmp_path, builds, "native", "v3", "gpu")
    choice = package_set.choose_package(
        tmp_path, candidates, CPU, _narrow_cpu(builds), served_batch=lambda _: 8
    )
    assert choice.path.name == builds["v3"].name
    assert "missing" in dict(choice.rejected)[builds["native"].name]


def test_the_batch_size_flag_is_part_of_the_fit(tmp_path: Path, builds: dict[str, Path]) -> None:
    candidates = _set(tmp_path, builds, "v3", "native")
    choice = package_set.choose_package(
        tmp_path, candidates, CPU, _narrow_cpu(builds), served_batch=lambda _: 8
    )
    assert choice.path.name == builds["v3"].name
    with pytest.raises(IncompatiblePackage) as failed:
        package_set.choose_package(
            tmp_path, candidates, CPU, _narrow_cpu(builds), served_batch=lambda _: 32
        )
    assert "--max_batch_size 32 is above the batch range" in str(failed.value)


def test_on_a_gpu_node_the_gpu_build_of_its_architecture_is_taken(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    candidates = _set(tmp_path, builds, "native", "v3", "gpu")
    cuda = torch.device("cuda", 0)
    choice = package_set.choose_package(
        tmp_path, candidates, cuda, _gpu_host("90"), served_batch=lambda _: 8
    )
    assert choice.path.name == builds["gpu"].name
    assert choice.key is not None and choice.key.target == "sm_90+x86-64-v3"


def test_none_fitting_names_each_candidate_the_missing_key_and_the_command(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    candidates = _set(tmp_path, builds, "native", "v3", "gpu")
    cuda = torch.device("cuda", 0)
    with pytest.raises(IncompatiblePackage) as failed:
        package_set.choose_package(
            tmp_path, candidates, cuda, _gpu_host("80"), served_batch=lambda _: 8
        )
    text = str(failed.value)
    assert text.startswith(f"no package in {tmp_path} fits this host (cuda:0, sm_80")
    assert f"{builds['gpu'].name}: package was built for sm_90" in text
    for label in ("native", "v3"):
        assert (
            f"{builds[label].name}: package was built for cpu but the server runs on cuda:0" in text
        )
    assert (
        "missing build key h0-mini_demo-tiny_fp32_b1-" in text and "_cu12.8_sm-80+native-" in text
    )
    assert "histoserve export --spec h0-mini --demo --demo_preset tiny" in text
    assert f"--device cuda --package_set {tmp_path}" in text


def test_one_package_is_taken_as_always_and_its_host_check_names_the_missing_key(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    (candidate,) = _set(tmp_path, builds, "gpu")
    choice = package_set.choose_package(tmp_path, [candidate], CPU, HostFacts.detect())
    assert (choice.path, choice.rejected) == (candidate, ())
    assert choice.reason == f"the only *.pt2 in {tmp_path}" and choice.metadata is not None
    with pytest.raises(IncompatiblePackage, match="package was built for cuda"):
        check_host_compat(choice.metadata, CPU, HostFacts.detect())  # at load, as always
    assert choice.key is not None
    hint = package_set.missing_hint(choice.key, choice.metadata, tmp_path, CPU)
    assert hint.startswith("; missing build key h0-mini_demo-tiny_fp32_b1-8_torch")
    assert "_cpu_native-" in hint and f"--device cpu --package_set {tmp_path}" in hint


def test_one_unreadable_package_is_left_to_its_own_checks(tmp_path: Path) -> None:
    broken = tmp_path / "model.pt2"
    broken.write_bytes(b"not a zip")
    choice = package_set.choose_package(tmp_path, [broken], CPU, HostFacts.detect())
    assert choice.path == broken and choice.metadata is None and choice.key is None


def test_an_unreadable_member_of_a_set_is_a_named_mismatch(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    candidates = _set(tmp_path, builds, "v3")
    (tmp_path / "half-copied.pt2").write_bytes(b"PK\x03\x04 truncated")
    choice = package_set.choose_package(
        tmp_path, [*candidates, tmp_path / "half-copied.pt2"], CPU, HostFacts.detect(),
        served_batch=lambda _: 8,
    )  # fmt: skip
    assert choice.path.name == builds["v3"].name
    assert dict(choice.rejected)["half-copied.pt2"].startswith("unreadable: ")


def test_among_equal_builds_the_newest_export_then_the_name_wins(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    def dated(when: str, max_batch: int):
        return lambda metadata: claim(metadata, created_utc=when, max_batch=max_batch)

    older = rewrite_metadata(builds["v3"], tmp_path, dated("2026-01-01T00:00:00+00:00", 8), "b.pt2")
    newer = rewrite_metadata(builds["v3"], tmp_path, dated("2026-06-01T00:00:00+00:00", 9), "c.pt2")
    twin = tmp_path / "d.pt2"  # the same build under another name: the same bytes
    shutil.copy2(newer, twin)
    host = _narrow_cpu(builds)
    choice = package_set.choose_package(tmp_path, [older, twin, newer], CPU, host)
    assert choice.path == newer  # c.pt2: as new as d.pt2, and first by name
    assert dict(choice.rejected) == {
        "b.pt2": "fits, ranked below c.pt2",
        "d.pt2": "fits, ranked below c.pt2",
    }
    assert [c.path for c in choice.fallbacks] == [twin, older]  # the next, if c.pt2 fails to load


def test_packages_of_two_models_fitting_is_an_error_not_a_pick(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    other = rewrite_metadata(
        builds["v3"], tmp_path, lambda m: claim(m, weights="sha256:" + "cd" * 32), "other.pt2"
    )
    (mine,) = _set(tmp_path, builds, "v3")
    with pytest.raises(CheckpointError, match="packages of different models fit") as failed:
        package_set.choose_package(tmp_path, [mine, other], CPU, _narrow_cpu(builds))
    assert "other.pt2 (h0-mini, sha256:cdcd" in str(failed.value)
    assert "--checkpoint" in str(failed.value)


def test_checkpoint_forces_a_file_whatever_it_was_built_for(builds: dict[str, Path]) -> None:
    choice = package_set.taken(builds["gpu"], "named by --checkpoint")
    assert choice.reason == "named by --checkpoint" and choice.key is not None
    assert choice.key.target == "sm_90+x86-64-v3"


# -- packages that lie about their build, or whose metadata is mistyped ------------------
def test_a_recorded_key_that_contradicts_its_package_is_that_candidate_s_mismatch(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    """The liar claims another model's weights and a newer export: refused, named; the honest
    package is served, and its key (derived) and weights digest say the same thing."""
    (honest,) = _set(tmp_path, builds, "v3")
    liar = rewrite_metadata(
        builds["v3"], tmp_path,
        lambda m: (claim(m, created_utc="2030-01-01T00:00:00+00:00"), lie(m, weights="sha256:" + "cd" * 32)),
        "liar.pt2",
    )  # fmt: skip
    choice = package_set.choose_package(tmp_path, [honest, liar], CPU, _narrow_cpu(builds))
    assert choice.path == honest
    why = dict(choice.rejected)["liar.pt2"]
    assert why.startswith("lies about its build: weights 'sha256:cdcd")
    assert "in its recorded build key but 'demo:tiny' by its provenance's weights_sha256" in why
    assert choice.key == key_from_metadata(read_metadata(liar))  # derived: the honest facts


def test_two_packages_of_one_key_must_be_the_same_bytes(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    """A liar that rewrote its provenance too derives the honest key: then the bytes decide."""
    (honest,) = _set(tmp_path, builds, "v3")
    liar = rewrite_metadata(
        builds["v3"], tmp_path, lambda m: claim(m, created_utc="2030-01-01T00:00:00+00:00"), "z.pt2"
    )
    assert key_from_metadata(read_metadata(liar)) == key_from_metadata(read_metadata(honest))
    with pytest.raises(CheckpointError) as failed:
        package_set.choose_package(tmp_path, [honest, liar], CPU, _narrow_cpu(builds))
    text = str(failed.value)
    assert str(honest) in text and str(liar) in text and "differ in bytes" in text


def test_a_lone_package_whose_key_lies_is_refused_naming_the_fields(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    liar = rewrite_metadata(
        builds["v3"], tmp_path, lambda m: lie(m, spec="h1", dtype="bf16"), "h1.pt2"
    )
    with pytest.raises(CheckpointError) as failed:
        package_set.choose_package(tmp_path, [liar], CPU, HostFacts.detect())
    text = str(failed.value)
    assert f"package {liar} lies about its build" in text
    assert (
        "spec 'h1' in its recorded build key but 'h0-mini' by the name of its embedded spec" in text
    )
    assert "dtype 'bf16' in its recorded build key but 'fp32' by its provenance's dtype" in text


def _edit(key: str, change):
    def edit(metadata: dict[str, str]) -> None:
        value = json.loads(metadata[key]) if key in metadata else None
        metadata[key] = json.dumps(change(value))

    return edit


PROV, KEY, CPU_BUILD = "histoserve.provenance", BUILD_KEY_KEY, CPU_BUILD_KEY
MISTYPED = {
    "provenance-list": (_edit(PROV, lambda v: [v]), "'histoserve.provenance' is a list, expected a JSON object"),
    "min-batch-one": (_edit(PROV, lambda v: {**v, "min_batch": "one"}), 'min_batch is "one", expected an integer >= 1'),
    "key-spec-object": (_edit(KEY, lambda v: {**v, "spec": {"name": "h0-mini"}}), "spec is {\"name\":\"h0-mini\"}, expected a string"),
    "key-spec-list": (_edit(KEY, lambda v: {**v, "spec": ["h0-mini"]}), 'spec is ["h0-mini"], expected a string'),
    "cpu-build-string": (_edit(CPU_BUILD, lambda v: "native"), "'histoserve.cpu_build' is a string, expected a JSON object"),
    "required-flags-number": (_edit(CPU_BUILD, lambda v: {**v, "required_flags": 7}), "required_flags is 7, expected a list of strings"),
    "deep-provenance": (lambda m: m.update({PROV: "[" * 5000 + "]" * 5000}), "'histoserve.provenance' is not valid JSON"),
    "inputs-dtype-number": (_edit("histoserve.inputs", lambda v: [{**v[0], "dtype": 3}]), "dtype is 3, expected a string"),
}  # fmt: skip


@pytest.fixture(scope="module")
def mistyped(builds: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The portable build with one field of the wrong type, one copy per case."""
    folder = tmp_path_factory.mktemp("mistyped")
    return {name: rewrite_metadata(builds["v3"], folder, change, f"{name}.pt2")
            for name, (change, _) in MISTYPED.items()}  # fmt: skip


def test_each_mistyped_field_is_that_candidate_s_named_mismatch_and_the_others_are_judged(
    tmp_path: Path, builds: dict[str, Path], mistyped: dict[str, Path]
) -> None:
    (good,) = _set(tmp_path, builds, "v3")
    choice = package_set.choose_package(
        tmp_path, [good, *mistyped.values()], CPU, _narrow_cpu(builds), served_batch=lambda _: 8
    )
    assert choice.path == good
    rejected = dict(choice.rejected)
    for name, (_, needle) in MISTYPED.items():
        why = rejected[f"{name}.pt2"]
        assert why.startswith(f"unreadable: {mistyped[name]}: "), why
        assert needle in why, (name, why)


@pytest.mark.parametrize("name", sorted(MISTYPED))
def test_a_lone_mistyped_package_is_a_checkpoint_error_naming_it(
    name: str, mistyped: dict[str, Path]
) -> None:
    path = mistyped[name]
    choice = package_set.choose_package(path.parent, [path], CPU, HostFacts.detect())
    with pytest.raises(CheckpointError) as failed:  # start-up reads it again and says why
        inspect_package(choice.path, StartupPhases(), choice.metadata)
    assert str(path) in str(failed.value) and MISTYPED[name][1] in str(failed.value)
