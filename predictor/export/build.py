"""``python -m predictor.export.build`` (``histoserve export``): build ``.pt2`` packages.

A package is ``torch.export.export`` with a dynamic batch axis, compiled by
``torch._inductor.aoti_compile_and_package``. Its metadata describes it:

- ``histoserve.spec``: the spec JSON (:data:`predictor.spec.METADATA_KEY`);
- ``histoserve.provenance``: torch version, source, weights digest, dtype,
  device, batch range, creation time (UTC);
- ``histoserve.inputs`` / ``histoserve.outputs``: names, shapes (``-1`` for
  the batch axis) and dtypes;
- ``histoserve.cpu_build``: ``-march`` and the CPU instruction-set flags the
  native code may use (see :mod:`predictor.packages.host`);
- ``histoserve.build_key``: what it was built from and for
  (:mod:`predictor.packages.build_key`), also its name in a package set
  (``--package_set DIR``, :mod:`predictor.export.package_set`);
- ``weights_layout`` in the provenance: ``embedded`` in the library's data
  section or ``mmap`` (appended to it and mapped), read back from the built
  library before it is recorded as written (:mod:`predictor.packages.weights_layout`);
- written by torch itself: ``AOTI_DEVICE_KEY``, ``AOTI_PLATFORM``,
  ``AOTI_MACHINE``, ``AOTI_CPU_ISA``, ``AOTI_COMPUTE_CAPABILITY``.

The first input is the normalised float tile batch (the vendor convention) in
the package dtype; other inputs keep their example dtype. Beside the package go
``<output>.sha256`` (``sha256sum`` format) and, for multimodal specs, the gene
lists named by the spec.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from predictor.errors import CheckpointError, HistoserveError, SpecError
from predictor.export import package_set
from predictor.export import sources as export_sources
from predictor.export.commit import commit
from predictor.export.reductions import unguarded_cpu_sums
from predictor.export.scratch import fresh_inductor_cache, owned_dir
from predictor.export.verify import LOAD_TIMEOUT_S, Verifier, add_verify_flags
from predictor.families import build_demo_model, demo_example_inputs, family_for
from predictor.families.embedding import PRESETS
from predictor.families.multimodal import genes
from predictor.packages import host
from predictor.packages import weights_layout as layouts
from predictor.packages.build_key import BUILD_KEY_KEY
from predictor.packages.dtypes import DTYPES, dtype_from_name
from predictor.packages.metadata import (
    CPU_BUILD_KEY,
    INPUTS_KEY,
    OUTPUTS_KEY,
    PROVENANCE_KEY,
    read_metadata,
)
from predictor.spec import METADATA_KEY, ModelSpec, resolve_spec

# --cpu_target: None = inductor's default (-march=native, widest vector ISA).
CPU_TARGETS: Mapping[str, dict[str, Any]] = {
    "native": {},
    "x86-64-v3": {"cpp.march": "x86-64-v3", "cpp.simdlen": 256},
}
_V3_FLAGS = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "sse4_1", "sse4_2", "ssse3")


def export_package(
    module: nn.Module,
    spec: ModelSpec,
    output: Path,
    *,
    example_inputs: Sequence[torch.Tensor],
    device: str = "cpu",
    dtype: str = "fp32",
    min_batch: int = 1,
    max_batch: int = 256,
    source: str = "module",
    weights_digest: str | None = None,
    cpu_target: str = "native",
    gene_lists: tuple[Sequence[str], Sequence[str]] | None = None,
    load_timeout_s: float = LOAD_TIMEOUT_S,
    compare_tolerance: float | None = None,
    weights_layout: str = layouts.AUTO,
) -> Path:
    """Exports ``module`` as a ``.pt2`` at ``output``, renamed in only once proven
    (loaded in a fresh process, outputs equal to eager's: :mod:`predictor.export.verify`).

    Args:
        module: Takes the normalised tile batch first (then e.g. bulk RNA).
        spec: Embedded in the package; picks input/output names.
        output: Where the ``.pt2`` goes (written atomically).
        example_inputs: One example per input, batch axis first; any batch
            size (they are resized to an in-range batch of 2 when possible).
        device: ``cpu`` or ``cuda`` (``cuda:N``): what the package runs on.
        dtype: ``fp32``, ``fp16`` or ``bf16``: weights and the tile input.
        min_batch: Smallest batch the package accepts (>= 1).
        max_batch: Largest batch the package accepts.
        source: Provenance label (``demo:tiny``, ``module:pkg.mod:f``, ``timm:...``).
        weights_digest: SHA-256 of the weights file, recorded in provenance.
        cpu_target: ``native`` (fastest, runs only on CPUs with the build host's
            instruction sets) or ``x86-64-v3`` (AVX2, portable).
        gene_lists: Multimodal only: (input genes, output genes), written
            beside the package as the spec's CSVs; demo IDs when ``None``.
        load_timeout_s: Deadline of the fresh-process load and batch.
        compare_tolerance: Overrides the dtype's tolerance (:data:`~predictor.export.verify.TOLERANCES`).
        weights_layout: ``auto`` (in the library up to 1.9 GB, mapped above) or
            ``mmap`` (always appended and mapped): :mod:`predictor.packages.weights_layout`.

    Returns:
        The package path.

    Raises:
        SpecError: Bad dtype, device, batch range, cpu target or weights layout.
        SpecMismatch: Gene lists whose lengths differ from the model's ``G``/``K``.
        CheckpointError: A stage failed (``export``, ``compile``, ``load-in-fresh-process``
            or ``compare``, named in the message); nothing was written.
    """
    _check_options(dtype, device, min_batch, max_batch, cpu_target, weights_layout)
    output = Path(output)
    target = torch.device(device)
    module = module.to(device=target, dtype=dtype_from_name(dtype)).eval()
    batch = min(max(2, min_batch), max_batch)
    args = _example_args(example_inputs, batch, target, dtype_from_name(dtype))
    with torch.no_grad():
        outputs = _flat(module(*args))
    metadata = _metadata(spec, args, outputs, target, cpu_target)
    if spec.takes_bulk_rna:  # gene lists: check them before the slow part
        gene_lists = genes.gene_lists_for(spec, args[1].shape[1], outputs[0].shape[1], gene_lists)
    program = _export(module, args, min_batch, max_batch)
    layout = _layout(weights_layout, program)
    prov = _provenance(source, weights_digest, dtype, target, min_batch, max_batch, cpu_target)
    metadata[PROVENANCE_KEY] = json.dumps({**prov, "weights_layout": layout}, sort_keys=True)
    key = package_set.export_key(
        spec_name=spec.name, source=source, weights_sha256=weights_digest, dtype=dtype,
        min_batch=min_batch, max_batch=max_batch, device=device, cpu_target=cpu_target,
    )  # fmt: skip
    metadata[BUILD_KEY_KEY] = key.to_json()
    verify = Verifier(args, outputs, dtype, str(target), load_timeout_s, compare_tolerance)
    beside = None
    if gene_lists is not None:
        lists = gene_lists
        beside = lambda folder: genes.write_gene_lists(spec, folder, *lists)  # noqa: E731
    _compile(program, output, metadata, cpu_target, layout, verify=verify, beside=beside)
    return output


def _check_options(
    dtype: str, device: str, min_batch: int, max_batch: int, cpu_target: str, weights_layout: str
) -> None:
    if dtype not in DTYPES:
        raise SpecError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    if torch.device(device).type not in ("cpu", "cuda"):
        raise SpecError(f"unsupported export device {device!r}; expected cpu or cuda")
    if not 1 <= min_batch <= max_batch:
        raise SpecError(
            f"batch range must satisfy 1 <= min_batch <= max_batch, got {min_batch}..{max_batch}"
        )
    if cpu_target not in CPU_TARGETS:
        raise SpecError(f"unknown cpu target {cpu_target!r}; expected one of {sorted(CPU_TARGETS)}")
    try:
        layouts.resolve(weights_layout, 0)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc


def _layout(requested: str, program: torch.export.ExportedProgram) -> str:
    """The layout this export builds: ``requested``, or ``mmap`` when the caller's
    ``torch._inductor.config.patch`` forces it (``diag.sh``'s variants), by its weights' size."""
    from torch._inductor import config as inductor_config

    if inductor_config.aot_inductor.force_mmap_weights:
        requested = layouts.MAPPED
    return layouts.resolve(requested, _constants_bytes(program))


def _constants_bytes(program: torch.export.ExportedProgram) -> int:
    """The bytes of the program's weights, buffers and constants, each storage counted once."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if isinstance(t, torch.Tensor)
    }
    return sum(storages.values())


def _example_args(
    inputs: Sequence[torch.Tensor], batch: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    args = []
    for i, x in enumerate(inputs):
        rows = x[torch.arange(batch) % x.shape[0]]  # resize the batch axis, keeping content
        args.append(rows.to(device=device, dtype=dtype if i == 0 else x.dtype).contiguous())
    return tuple(args)


def _flat(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(torch.utils._pytree.tree_leaves(out))


def _describe(family: Any, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> str:
    items = []
    for i, t in enumerate(tensors):
        name = names[i] if i < len(names) else f"output_{i}"
        items.append(
            {
                "name": name,
                "shape": family.recorded_shape(name, tuple(t.shape)),
                "dtype": str(t.dtype).removeprefix("torch."),
            }
        )
    return json.dumps(items)


def _metadata(
    spec: ModelSpec,
    args: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    device: torch.device,
    cpu_target: str,
) -> dict[str, str]:
    family = family_for(spec)
    return {
        METADATA_KEY: spec.to_json(),
        INPUTS_KEY: _describe(family, family.PACKAGE_INPUTS, args),
        OUTPUTS_KEY: _describe(family, family.package_outputs(spec), outputs),
        CPU_BUILD_KEY: json.dumps(_cpu_build(cpu_target)),
    }


def _cpu_build(cpu_target: str) -> dict[str, Any]:
    if cpu_target == "native":
        flags = host.isa_flags(host.read_cpu_flags())
        return {"march": "native", "required_flags": sorted(flags)}
    return {"march": cpu_target, "required_flags": list(_V3_FLAGS)}


def _provenance(
    source: str,
    weights_digest: str | None,
    dtype: str,
    device: torch.device,
    min_batch: int,
    max_batch: int,
    cpu_target: str,
) -> dict[str, Any]:
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "source": source,
        "weights_sha256": weights_digest,
        "dtype": dtype,
        "device": device.type,
        "min_batch": min_batch,
        "max_batch": max_batch,
        "cpu_target": cpu_target,
        # built with aot_inductor.check_lowerbound off: batch 1 passes input checks
        "batch1_input_checks": True,
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _export(
    module: nn.Module, args: tuple[torch.Tensor, ...], min_batch: int, max_batch: int
) -> torch.export.ExportedProgram:
    dynamic: Any = None
    if min_batch < max_batch:
        batch = torch.export.Dim("batch", min=min_batch, max=max_batch)
        dynamic = tuple({0: batch} for _ in args)
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic, strict=False)
    except Exception as exc:
        raise CheckpointError(f"stage export: torch.export failed: {exc}") from exc


def _compile(
    program: torch.export.ExportedProgram,
    output: Path,
    metadata: dict[str, str],
    cpu_target: str,
    layout: str | None = None,
    *,
    verify: Callable[[Path], None] | None = None,
    beside: Callable[[Path], Sequence[Path]] | None = None,
) -> None:
    """Compiles in a fresh inductor cache, staged beside ``output``; checks its weights
    ``layout`` (what the provenance records; ``None``: :func:`_layout`'s for ``auto``);
    ``verify(staged)``; writes ``beside(staging folder)``'s files (the gene lists) and the
    digest there; moves them and the package into place (:func:`predictor.export.commit.commit`).

    A failure leaves nothing at ``output``; a kill at any moment leaves the old package
    with its digest, none, or the new one with its digest (:mod:`predictor.export.commit`).
    """
    if layout is None:
        layout = _layout(layouts.AUTO, program)
    configs: dict[str, Any] = {
        "aot_inductor.metadata": dict(metadata),  # torch adds to it in place
        **CPU_TARGETS[cpu_target],
        **layouts.inductor_configs(layout),
    }
    from torch._inductor import config as inductor_config

    if hasattr(inductor_config.aot_inductor, "check_lowerbound"):
        # Not in every torch: an unknown inductor option fails the whole compile.
        configs["aot_inductor.check_lowerbound"] = False
    output.parent.mkdir(parents=True, exist_ok=True)
    with owned_dir(output.parent, ".export-") as tmp, fresh_inductor_cache():
        staged = tmp / output.name
        try:
            with unguarded_cpu_sums():
                torch._inductor.aoti_compile_and_package(
                    program, package_path=str(staged), inductor_configs=configs
                )
        except Exception as exc:
            raise CheckpointError(f"stage compile: AOTInductor compilation failed: {exc}") from exc
        read_metadata(staged)  # the zip as written reads back
        built = layouts.library_layout(staged)
        if built != layout:
            raise CheckpointError(
                f"stage compile: the package would record weights layout {layout!r} but its "
                f"library was built {built!r}; nothing was written. What to do: this torch "
                f"chooses the layout by another rule than predictor/packages/weights_layout.py; "
                f"pass --weights_layout mmap, or report the torch version"
            )
        if verify is not None:
            verify(staged)  # in the fresh cache: the child inherits it
        extras = beside(tmp) if beside is not None else ()
        commit(staged, output, extras)


def export_demo(spec: ModelSpec, output: Path, *, preset: str = "tiny", **opts: Any) -> Path:
    """Exports a random-weight demo package with ``spec``'s exact geometry.

    Args:
        spec: Any spec; its family picks the demo model.
        output: Where the ``.pt2`` goes.
        preset: ``tiny``, ``vit-s`` or ``vit-g`` (see :data:`predictor.families.embedding.PRESETS`).
        **opts: :func:`export_package` options (``device``, ``dtype``,
            ``min_batch``, ``max_batch``, ``cpu_target``) and the rest to
            :func:`~predictor.families.build_demo_model` (e.g.
            ``embedding_dim``, ``pad_to_batch``, ``genes_in``).
    """
    export_keys = ("device", "dtype", "min_batch", "max_batch", "cpu_target", "gene_lists")
    export_keys += ("load_timeout_s", "compare_tolerance", "weights_layout")
    export_opts = {k: opts.pop(k) for k in export_keys if k in opts}
    if "gene_lists" in export_opts:  # size the demo to the given gene lists
        opts.setdefault("genes_in", len(export_opts["gene_lists"][0]))
        opts.setdefault("genes_out", len(export_opts["gene_lists"][1]))
    module = build_demo_model(spec, preset, **opts)
    pad = opts.get("pad_to_batch")
    if pad is not None:
        export_opts["max_batch"] = min(export_opts.get("max_batch", 256), pad)
    inputs = demo_example_inputs(spec, 2, genes_in=getattr(module, "genes_in", None))
    return export_package(
        module, spec, output, example_inputs=inputs, source=f"demo:{preset}", **export_opts
    )


def export_timm(spec: ModelSpec, output: Path, arch: str, weights: Path, **opts: Any) -> Path:
    """Exports real weights through timm (see :func:`predictor.export.sources.build_timm`).

    Raises:
        SpecError: timm missing, not an embedding spec, or unusable weights.
    """
    module, digest = export_sources.build_timm(spec, arch, Path(weights))
    inputs = demo_example_inputs(spec, 2)
    return export_package(
        module,
        spec,
        output,
        example_inputs=inputs,
        source=f"timm:{arch}",
        weights_digest=digest,
        **opts,
    )


def build_parser() -> argparse.ArgumentParser:
    """The export CLI's argument parser (built on demand, never at import)."""
    parser = argparse.ArgumentParser(prog="histoserve export", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="built-in spec name or spec file path")
    package_set.add_flags(parser)  # --output or --package_set DIR, and its options
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--demo", action="store_true", help="random-weight demo model")
    source.add_argument("--module", help="pkg.mod:factory returning an nn.Module")
    source.add_argument("--timm", metavar="ARCH", help="timm architecture (needs --weights)")
    parser.add_argument("--demo_preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--weights", type=Path, help="weights for --timm or --module")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--min_batch", type=int, default=1)
    parser.add_argument(
        "--max_batch", type=int, default=None, help="default: 256 tiles, 200000 for slide heads"
    )
    parser.add_argument("--cpu_target", default="native", choices=sorted(CPU_TARGETS))
    layouts.add_flag(
        parser,
        "auto: weights in the model library up to 1.9 GB, appended and mapped above; "
        "mmap: always appended and mapped (try it when a CUDA package crashes on load)",
    )
    parser.add_argument("--genes_in", type=Path, help="multimodal: input gene CSV to ship")
    parser.add_argument("--genes_out", type=Path, help="multimodal: output gene CSV to ship")
    add_verify_flags(parser)
    return parser


def run(args: argparse.Namespace) -> Path:
    """Runs a parsed export command; returns the package path."""
    spec = resolve_spec(args.spec)
    opts: dict[str, Any] = {
        "device": args.device,
        "dtype": args.dtype,
        "min_batch": args.min_batch,
        "max_batch": args.max_batch or family_for(spec).DEFAULT_MAX_BATCH,
        "cpu_target": args.cpu_target,
        "load_timeout_s": args.load_timeout_s,
        "compare_tolerance": args.compare_tolerance,
        "weights_layout": args.weights_layout,
    }
    if (args.genes_in is None) != (args.genes_out is None):
        raise SpecError("--genes_in and --genes_out go together")
    if args.genes_in is not None:
        opts["gene_lists"] = (
            genes.read_gene_ids(args.genes_in),
            genes.read_gene_ids(args.genes_out),
        )
    if args.weights is not None and args.demo:
        raise SpecError("--weights goes with --timm or --module, not --demo")
    return package_set.run(args, spec.name, opts, lambda out: _export_to(args, spec, opts, out))


def _export_to(
    args: argparse.Namespace, spec: ModelSpec, opts: dict[str, Any], output: Path
) -> Path:
    if args.demo:
        return export_demo(spec, output, preset=args.demo_preset, **opts)
    if args.timm:
        if args.weights is None:
            raise SpecError("--timm needs --weights FILE")
        return export_timm(spec, output, args.timm, args.weights, **opts)
    module = export_sources.build_from_factory(export_sources.load_factory(args.module), spec)
    digest = export_sources.load_weights(module, args.weights) if args.weights else None
    inputs = export_sources.module_example_inputs(module, spec)
    source = f"module:{args.module}"
    return export_package(
        module, spec, output, example_inputs=inputs, source=source, weights_digest=digest, **opts
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (errors print one line, exit 2)."""
    args = build_parser().parse_args(argv)
    try:
        path = run(args)
    except HistoserveError as exc:
        print(f"histoserve export: error: {exc}", file=sys.stderr)
        return 2
    print(f"package {path} ({path.stat().st_size} bytes, sha256 in {path.name}.sha256)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
