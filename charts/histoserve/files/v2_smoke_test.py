"""histoserve `helm test`: wait for readiness, then run one real V2 inference.

Runs inside the histoserve image (any Python 3.9+ works for HTTP: standard
library only; gRPC needs grpcio and KServe's V2 stubs, which the image has).
Configuration comes from the environment:

HISTOSERVE_MODEL        model name in URLs
HISTOSERVE_PROTOCOL     http (V2 REST) or grpc (V2 gRPC)
HISTOSERVE_TARGETS      space-separated candidates: base URLs (http) or host:port (grpc);
                        the first that reports the model ready is used
HISTOSERVE_TIMEOUT_S    seconds to wait for readiness (default 900)
HISTOSERVE_TILE_SIZE    tile edge when the model metadata does not say (default 224)
HISTOSERVE_POLL_S       seconds between readiness polls (default 5)

The tile is a `pixels` UINT8 tensor of shape [1, H, W, 3] with H and W read
from the model's metadata, filled with a deterministic texture. Exit 0 only on
a 200 / OK answer whose outputs all have batch size 1.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request

REQUEST_TIMEOUT_S = 120.0
POLL_S = float(os.environ.get("HISTOSERVE_POLL_S", "5"))


def log(message: str) -> None:
    print(f"histoserve-test: {message}", flush=True)


def tile_bytes(height: int, width: int) -> bytes:
    """A deterministic RGB texture (not constant, so normalisation sees variance)."""
    return bytes(
        ((x * 7 + y * 13 + c * 101) % 256)
        for y in range(height)
        for x in range(width)
        for c in range(3)
    )


def tile_geometry(inputs: list, default: int) -> tuple[int, int]:
    for spec in inputs or []:
        if spec.get("name") == "pixels":
            shape = list(spec.get("shape") or [])
            if len(shape) == 4 and int(shape[1]) > 0 and int(shape[2]) > 0:
                return int(shape[1]), int(shape[2])
    return default, default


def check_outputs(outputs: list) -> None:
    if not outputs:
        raise RuntimeError("response has no outputs")
    for out in outputs:
        shape = list(out.get("shape") or [])
        if not shape or int(shape[0]) != 1:
            raise RuntimeError(f"output {out.get('name')!r} has shape {shape}, expected batch 1")
        data = out.get("data")
        floats = isinstance(data, list) and out.get("datatype", "").startswith("FP")
        if floats and not all(isinstance(v, (int, float)) and math.isfinite(v) for v in data):
            raise RuntimeError(f"output {out.get('name')!r} holds non-finite values")
        log(f"output {out.get('name')} {out.get('datatype')} {shape}")


# ---------------------------------------------------------------- HTTP (V2 REST)


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def run_http(targets: list[str], model: str, deadline: float, default_tile: int) -> None:
    base = None
    last = "no answer yet"
    while base is None:
        for candidate in targets:
            url = f"{candidate.rstrip('/')}/v2/models/{model}/ready"
            try:
                status, _ = http_get(url)
            except OSError as exc:
                last = f"{url}: {exc}"
                continue
            if status == 200:
                base = candidate.rstrip("/")
                break
            last = f"{url}: HTTP {status}"
        if base is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"model {model!r} not ready in time (last: {last})")
            time.sleep(POLL_S)
    log(f"model {model!r} ready at {base}")

    status, body = http_get(f"{base}/v2/models/{model}")
    inputs = json.loads(body).get("inputs", []) if status == 200 else []
    height, width = tile_geometry(inputs, default_tile)
    payload = {
        "id": "helm-test",
        "inputs": [
            {
                "name": "pixels",
                "datatype": "UINT8",
                "shape": [1, height, width, 3],
                "data": list(tile_bytes(height, width)),
            }
        ],
    }
    request = urllib.request.Request(
        f"{base}/v2/models/{model}/infer",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    log(f"POST {request.full_url} pixels [1, {height}, {width}, 3]")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    if status != 200:
        raise RuntimeError(f"infer returned HTTP {status}: {body[:500]!r}")
    check_outputs(json.loads(body).get("outputs", []))


# ---------------------------------------------------------------- gRPC (V2)


def run_grpc(targets: list[str], model: str, deadline: float, default_tile: int) -> None:
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    stub = None
    last = "no answer yet"
    while stub is None:
        for target in targets:
            candidate = pb_grpc.GRPCInferenceServiceStub(
                grpc.insecure_channel(target, options=options)
            )
            try:
                if candidate.ModelReady(pb.ModelReadyRequest(name=model), timeout=10).ready:
                    stub = candidate
                    log(f"model {model!r} ready at {target}")
                    break
                last = f"{target}: not ready"
            except grpc.RpcError as exc:
                last = f"{target}: {exc.code()}"
        if stub is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"model {model!r} not ready in time (last: {last})")
            time.sleep(POLL_S)

    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=30)
    inputs = [{"name": t.name, "shape": list(t.shape)} for t in meta.inputs]
    height, width = tile_geometry(inputs, default_tile)
    request = pb.ModelInferRequest(
        model_name=model,
        id="helm-test",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="pixels", datatype="UINT8", shape=[1, height, width, 3]
            )
        ],
        raw_input_contents=[tile_bytes(height, width)],
    )
    log(f"ModelInfer pixels [1, {height}, {width}, 3]")
    try:
        response = stub.ModelInfer(request, timeout=REQUEST_TIMEOUT_S)
    except grpc.RpcError as exc:
        raise RuntimeError(f"ModelInfer failed: {exc.code()} {exc.details()}") from exc
    check_outputs(
        [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)} for o in response.outputs]
    )


def main() -> int:
    model = os.environ.get("HISTOSERVE_MODEL", "")
    protocol = os.environ.get("HISTOSERVE_PROTOCOL", "http")
    targets = os.environ.get("HISTOSERVE_TARGETS", "").split()
    timeout_s = float(os.environ.get("HISTOSERVE_TIMEOUT_S", "900"))
    default_tile = int(os.environ.get("HISTOSERVE_TILE_SIZE", "224"))
    if not model or not targets:
        log("HISTOSERVE_MODEL and HISTOSERVE_TARGETS must be set")
        return 2
    deadline = time.monotonic() + timeout_s
    runner = run_grpc if protocol == "grpc" else run_http
    try:
        runner(targets, model, deadline, default_tile)
    except Exception as exc:  # the test's verdict: one line, non-zero exit
        log(f"FAIL: {exc}")
        return 1
    log("PASS: one V2 inference answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
