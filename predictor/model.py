"""``BaseServerModel``: the one ``kserve.Model`` subclass histoserve serves.

It composes the parts: a codec decodes the request into per-tile
:class:`ModelRequest` items; stage 1 runs :meth:`prepare_sample` for each in a
thread pool (an error there is a 400 for that request only); :meth:`predict`
hands the prepared samples to the :class:`DynamicBatcher`, which calls
:meth:`forward_batch` on one device worker (an error there is a 503 for that
batch only); a codec encodes the responses.

Embedding backbones use this class as is. Families with other inputs or
outputs subclass it (see :mod:`predictor.families`) and override
:meth:`prepare_sample`, :meth:`batch_inputs`, :meth:`build_responses` and the
output description.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kserve import InferRequest, InferResponse, Model

from predictor import package as pkg
from predictor.admission import Admission
from predictor.batcher import DynamicBatcher
from predictor.codecs.images import decode_tile
from predictor.codecs.v1 import decode_v1, encode_v1
from predictor.codecs.v2 import decode_v2, encode_v2, select_outputs
from predictor.config import BatchingConfig, LimitsConfig
from predictor.device import Normalizer, as_forward_error, classify_error, synchronize
from predictor.errors import InvalidInput, ModelNotReady
from predictor.faults import FaultHook
from predictor.metrics import Metrics
from predictor.samples import DecodedRequest, ModelRequest, ModelResponse, PreparedSample
from predictor.spec import ModelSpec
from predictor.stage1 import Stage1Pool

logger = logging.getLogger("histoserve")

MODEL_ROOT = Path("/opt/ml/model")


@dataclass(frozen=True)
class ServingOptions:
    """Runtime options beside the spec; built by the CLI, defaults fit tests."""

    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    preprocess_workers: int = 2
    name: str | None = None


@dataclass
class _Prepared:
    decoded: DecodedRequest
    mode: str
    samples: list[PreparedSample]


class BaseServerModel(Model):
    """Loads an exported ``.pt2`` package and serves it with dynamic batching.

    Args:
        model_spec: The model specification (tile size, normalisation, ...).
        checkpoint_name: File name of the ``.pt2`` inside ``model_root``.
        device: Torch device string (``cpu``, ``cuda``, ``cuda:N``).
        model_root: Directory containing the checkpoints.
        options: Batching, limits and naming; see :class:`ServingOptions`.
        metrics: Prometheus collectors; ``None`` disables metrics.
        fault_hook: Test-only forward fault injection; ``None`` in production.
    """

    def __init__(
        self,
        model_spec: ModelSpec,
        checkpoint_name: str,
        device: str = "cuda",
        model_root: Path = MODEL_ROOT,
        *,
        options: ServingOptions | None = None,
        metrics: Metrics | None = None,
        fault_hook: FaultHook | None = None,
    ):
        self._options = options or ServingOptions()
        super().__init__(self._options.name or model_spec.name)
        self._spec = model_spec
        self._checkpoint = Path(model_root) / checkpoint_name
        self._device = torch.device(device)
        self._metrics = metrics
        self._fault_hook = fault_hook
        self._package: pkg.LoadedPackage | None = None
        self._normalizer: Normalizer | None = None
        self._pool: Stage1Pool | None = None
        self._batcher: DynamicBatcher | None = None
        self._stopped = False
        batching = self._options.batching
        self._admission = Admission(
            self.name,
            batching.max_queue_size,
            batching.retry_after_s,
            on_reject=lambda n: self._count("rejected", n),
        )

    # -- identity -------------------------------------------------------------------------
    @property
    def model_spec(self) -> ModelSpec:
        """The model's specification (tile size, normalisation, etc.)."""
        return self._spec

    @property
    def model_name(self) -> str:
        """Human-readable model identifier (the name in URLs)."""
        return self.name

    @property
    def device(self) -> torch.device:
        """The device the package runs on."""
        return self._device

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> bool:
        """Verifies, loads and checks the package; raises a StartupError on any problem.

        Idempotent: KServe calls ``load`` again whenever the model reports not
        ready (e.g. while draining), which must not reload anything.
        """
        if self._stopped:
            return False
        if self._package is None:
            # Decoded and binary tiles are read-only numpy views; we never write them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            pkg.verify_sha256(self._checkpoint)
            metadata = pkg.read_metadata(self._checkpoint)
            pkg.check_host_compat(metadata, self._device)
            self._package = pkg.load_package(self._checkpoint, self._device)
            self.check_package(self._package)
            self._normalizer = Normalizer(self._spec, self._device, self._package.input_dtype)
            self._pool = Stage1Pool(self._options.preprocess_workers)
            logger.info("loaded %s (%s) on %s", self._checkpoint, self._spec.name, self._device)
        self.ready = not self._admission.draining
        return self.ready

    def check_package(self, package: pkg.LoadedPackage) -> None:
        """Fails fast when the package disagrees with the spec (output dims, inputs)."""
        shapes = pkg.probe_outputs(package, self._spec, self.extra_input_shapes(package))
        pkg.check_consistency(self._spec, shapes)

    def extra_input_shapes(self, package: pkg.LoadedPackage) -> Mapping[str, int]:
        """Per-tile sizes of inputs after the tiles (none for backbones)."""
        return {}

    async def start_batching(self) -> None:
        """Starts the batcher inside the running event loop (called by the server)."""
        if self._batcher is None:
            self._batcher = DynamicBatcher(
                self._run_batch,
                self._options.batching,
                classify_error=classify_error,
                observer=self._metrics,
                name=self.name,
            )
        await self._batcher.start()

    async def drain(self, timeout_s: float) -> bool:
        """Turns readiness false, refuses new work and waits for admitted work.

        Admitted requests still in stage 1 (decoding) have not reached the
        batcher yet, so the batcher keeps accepting their tiles until every
        admitted request has finished or the deadline passes; then the
        batcher drains whatever is left in the time that remains.
        """
        admission = self._admission
        admission.start_draining()
        self.ready = False
        deadline = time.monotonic() + timeout_s
        if not await admission.wait_idle(timeout_s):
            logger.warning(
                "%s: %d admitted requests still running at the drain deadline",
                self.name,
                admission.admitted,
            )
        if self._batcher is None:
            return admission.admitted == 0
        drained = await self._batcher.drain(max(0.0, deadline - time.monotonic()))
        return drained and admission.admitted == 0

    async def healthy(self) -> bool:
        """Ready for traffic: loaded, not draining, device usable."""
        return bool(self.ready and not self._admission.draining and self.live)

    @property
    def live(self) -> bool:
        """False once a sticky device error made the device unusable."""
        return self._batcher is None or self._batcher.healthy

    def stop(self) -> None:
        """Releases the stage-1 pool and the package for good (no reload after this).

        Dropping the package runs its loader's destructor now, which deletes the
        files it extracted, so the process can exit without a full garbage
        collection (see ``predictor.__main__``).
        """
        self.ready = False
        self._stopped = True
        if self._pool is not None:
            self._pool.shutdown()
        self._package = None

    # -- kserve entry points --------------------------------------------------------------
    async def __call__(self, body: Any, headers: dict[str, str] | None = None, verb: Any = None):
        with self._admission.request():
            if self._metrics is None:
                return await self._call(body, headers, verb)
            with self._metrics.inflight():
                return await self._call(body, headers, verb)

    async def _call(self, body: Any, headers: dict[str, str] | None, verb: Any):
        if verb is None:
            return await super().__call__(body, headers)
        return await super().__call__(body, headers, verb)

    def validate(self, payload: Any) -> Any:
        """Codecs validate; KServe's dict checks would misread our payload."""
        return payload

    async def preprocess(
        self, payload: dict | InferRequest, headers: dict[str, str] | None = None
    ) -> _Prepared:
        """Stage 1: decode the request and prepare every tile; 400 on any bad input."""
        if self._admission.draining or self._pool is None:
            raise ModelNotReady(
                f"model {self.name!r} is not accepting requests (draining or not loaded)"
            )
        started = time.monotonic()
        decoded = self._decode(payload)
        try:
            mode = self._resolve_mode(decoded.mode)
            if decoded.protocol == "v2":
                select_outputs(
                    decoded, self.output_names(mode)
                )  # unknown outputs fail before compute
            samples = await self._prepare_staged(decoded)
        except InvalidInput:
            self._count("invalid", len(decoded.items))
            raise
        if self._metrics is not None:
            self._metrics.observe_preprocess(time.monotonic() - started)
        return _Prepared(decoded, mode, samples)

    async def predict(
        self, payload: _Prepared, headers: dict[str, str] | None = None
    ) -> tuple[_Prepared, list[ModelResponse]]:
        """Stage 2: enqueue the samples and await one response per tile, in order."""
        if self._batcher is None:
            raise ModelNotReady(f"model {self.name!r} has no running batcher")
        items = list(zip(payload.samples, payload.decoded.items, strict=True))
        futures = self._batcher.submit(items, key=payload.mode)
        try:
            results = await asyncio.gather(*futures)
        except Exception:
            self._count("failed", len(items))
            raise
        self._count("ok", len(items))
        return payload, list(results)

    async def postprocess(
        self, result: tuple[_Prepared, list[ModelResponse]], headers: dict[str, str] | None = None
    ) -> dict | InferResponse:
        """Encodes the responses in the protocol the request came in."""
        prepared, responses = result
        names = self.output_names(prepared.mode)
        if prepared.decoded.protocol == "v1":
            return encode_v1(responses, output_names=names)
        return encode_v2(
            responses,
            model_name=self.name,
            output_names=names,
            decoded=prepared.decoded,
            datatypes=self.output_datatypes(),
        )

    # -- stage 1 --------------------------------------------------------------------------
    def _decode(self, payload: dict | InferRequest) -> DecodedRequest:
        limits = self._options.limits
        if isinstance(payload, InferRequest):
            decoded = decode_v2(payload, spec=self._spec, limits=limits)
        else:
            decoded = decode_v1(payload, spec=self._spec, limits=limits)
        return decoded

    def _resolve_mode(self, mode: str | None) -> str:
        if mode is None:
            return self._spec.default_mode
        if mode not in self._spec.modes:
            raise InvalidInput(
                f"unknown mode {mode!r}; model {self.name!r} supports {list(self._spec.modes)}",
                input_name="parameters.mode",
            )
        return mode

    async def _prepare_staged(self, decoded: DecodedRequest) -> list[PreparedSample]:
        """Stage 1 for every tile, refused up front (fast 503) when the queue is full."""
        depth = self._batcher.queue_depth if self._batcher is not None else 0
        with self._admission.staged(len(decoded.items), depth):
            return await self._pool.prepare(decoded.items, decoded.tile_input, self.prepare_sample)

    def prepare_sample(self, request: ModelRequest) -> PreparedSample:
        """Decodes, validates and transforms one tile; ``InvalidInput`` becomes a 400.

        Called in the stage-1 thread pool. Subclasses extend it for extra
        inputs (bulk RNA). The tile stays ``uint8``; normalisation happens on
        the device, in the batch.
        """
        pixels = request.pixels
        if pixels is None:
            if request.image_data is None:
                raise InvalidInput("no image data")
            pixels = decode_tile(request.image_data, limits=self._options.limits)
        size = self._spec.tile_size
        if pixels.dtype != np.uint8 or pixels.shape != (size, size, 3):
            raise InvalidInput(
                f"expected a {size}x{size} RGB uint8 tile, got shape {tuple(pixels.shape)} {pixels.dtype}"
            )
        return PreparedSample(tile=torch.from_numpy(pixels).permute(2, 0, 1))

    def preprocess_bulk_rna(self, raw: list[float] | np.ndarray) -> np.ndarray:
        """Applies the spec's omics transform to raw counts (unchanged when none)."""
        values = np.asarray(raw, dtype=np.float32)
        if self._spec.bulk_rna_transform == "log1p":
            return np.log1p(values)
        return values

    # -- stage 2 --------------------------------------------------------------------------
    def _run_batch(
        self, items: list[tuple[PreparedSample, ModelRequest]], mode: str
    ) -> list[ModelResponse]:
        samples = [sample for sample, _ in items]
        requests = [request for _, request in items]
        return self.forward_batch(samples, requests, mode)

    @torch.inference_mode()
    def forward_batch(
        self, samples: list[PreparedSample], requests: list[ModelRequest], mode: str = "prediction"
    ) -> list[ModelResponse]:
        """Runs one batch on the device; any failure is the whole batch's ``ForwardError``.

        Stacks, moves to the device, normalises there, runs the package,
        synchronises, copies back and builds one response per sample,
        positionally aligned with ``samples``.
        """
        try:
            if self._fault_hook is not None:
                self._fault_hook.check([s.tile for s in samples])
            outputs = self._package(*self.batch_inputs(samples))
            host = self._to_host(outputs, len(samples))
        except Exception as exc:
            raise as_forward_error(exc, len(samples)) from exc
        return self.build_responses(host, requests, mode)

    def batch_inputs(self, samples: Sequence[PreparedSample]) -> tuple[torch.Tensor, ...]:
        """The package's inputs for a batch, on the device (tiles first)."""
        return (self._normalizer([s.tile for s in samples]),)

    def _to_host(self, outputs: Sequence[torch.Tensor], n: int) -> list[np.ndarray]:
        host = [self.output_to_host(out[:n]) for out in outputs]
        synchronize(self._device)
        return [t.numpy() for t in host]

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        """Device output (trimmed to the real batch) to a host tensor; fp32 by default."""
        return output.float().cpu() if output.is_floating_point() else output.cpu()

    def build_responses(
        self, outputs: Sequence[np.ndarray], requests: Sequence[ModelRequest], mode: str
    ) -> list[ModelResponse]:
        """One response per sample from the host outputs (views, no copies)."""
        embeddings = outputs[0]
        return [
            ModelResponse({"embedding": embeddings[i]}, r.metadata) for i, r in enumerate(requests)
        ]

    # -- description ----------------------------------------------------------------------
    def output_names(self, mode: str) -> tuple[str, ...]:
        """Output tensor names a mode returns, primary first."""
        return ("embedding",)

    def output_datatypes(self) -> Mapping[str, str]:
        """V2 datatype of every output the model can return."""
        return {"embedding": "FP32"}

    def output_shapes(self) -> Mapping[str, list[int]]:
        """V2 shape of every output (``-1`` for the batch axis)."""
        return {"embedding": [-1, self._spec.embedding_dim]}

    def input_descriptions(self) -> list[dict[str, Any]]:
        """V2 metadata of the inputs a request may carry."""
        size = self._spec.tile_size
        return [
            {"name": "tiles", "datatype": "BYTES", "shape": [-1]},
            {"name": "pixels", "datatype": "UINT8", "shape": [-1, size, size, 3]},
        ]

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.input_descriptions()

    def get_output_types(self) -> list[dict[str, Any]]:
        types = self.output_datatypes()
        return [
            {"name": n, "datatype": types[n], "shape": s} for n, s in self.output_shapes().items()
        ]

    def get_metadata(self) -> dict[str, Any]:
        """Model name, inputs/outputs, the spec, the package's provenance and the batching config."""
        package = self._package
        return {
            "name": self.name,
            "spec": self._spec.to_dict(),
            "inputs": self.get_input_types(),
            "outputs": self.get_output_types(),
            "checkpoint": str(self._checkpoint),
            "device": str(self._device),
            "package_metadata": dict(package.metadata) if package else {},
            "batching": asdict(self._options.batching),
            "limits": asdict(self._options.limits),
            "preprocess_workers": self._options.preprocess_workers,
        }

    @torch.inference_mode()
    def forward(self, requests: list[ModelRequest]) -> torch.Tensor:
        """Runs the model on a list of tile requests in one call (legacy path, no batcher)."""
        samples = [self.prepare_sample(r) for r in requests]
        outputs = self._package(*self.batch_inputs(samples))
        synchronize(self._device)
        return outputs[0][: len(samples)].float().cpu()

    def _count(self, outcome: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.count_tiles(outcome, n)
