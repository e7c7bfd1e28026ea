"""An outside V2 gRPC client (tritonclient.grpc) in its own interpreter.

tritonclient.grpc and kserve register the same protobuf symbols, so they
cannot share the pytest process. The test side
(:class:`harness.grpc_client.GrpcClient`) runs ``python -m
harness.grpc_worker`` and sends one JSON line per call on stdin; this worker
answers one JSON line: outputs as base64 ``.npy`` and the answer's
parameters, or the gRPC status and message.
"""

from __future__ import annotations

import base64
import io
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def _load(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=True)


def _dump(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return base64.b64encode(buf.getvalue()).decode()


REPOSITORY_OPS = ("index", "load", "unload")
"""The model repository extension's calls (tritonclient's own methods)."""


def repository(client: grpcclient.InferenceServerClient, call: dict) -> dict:
    """``index`` (its models), ``load`` or ``unload`` (``{}``), or the gRPC status and message."""
    try:
        if call["op"] == "index":
            index = client.get_model_repository_index(as_json=True)
            return {"models": index.get("models", [])}
        if call["op"] == "load":
            client.load_model(call["model"])
        else:
            client.unload_model(call["model"])
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return {}


def handle(call: dict, clients: dict) -> dict:
    client = clients.setdefault(call["url"], grpcclient.InferenceServerClient(call["url"]))
    if call["op"] == "ready":
        return {"ready": client.is_model_ready(call["model"])}
    if call["op"] in REPOSITORY_OPS:
        return repository(client, call)
    inputs = []
    for spec in call["inputs"]:
        data = _load(spec["data"])
        inp = grpcclient.InferInput(spec["name"], list(data.shape), spec["datatype"])
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    requested = [grpcclient.InferRequestedOutput(n) for n in call.get("outputs") or ()]
    try:
        result = client.infer(
            call["model"],
            inputs,
            outputs=requested or None,
            parameters=call.get("parameters") or None,
            headers=call.get("headers") or None,
            client_timeout=call.get("timeout_s", 120),
        )
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    response = result.get_response()
    outputs = {out.name: _dump(result.as_numpy(out.name)) for out in response.outputs}
    parameters = {
        k: getattr(v, v.WhichOneof("parameter_choice") or "string_param")
        for k, v in response.parameters.items()
    }
    return {"outputs": outputs, "parameters": parameters}


def main() -> None:
    clients: dict = {}
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line), clients)), flush=True)


if __name__ == "__main__":
    main()
