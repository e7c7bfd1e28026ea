"""The `helm test` client (charts/histoserve/files/v2_smoke_test.py) against fake V2 servers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.chart.helpers import CHART

CLIENT = CHART / "files" / "v2_smoke_test.py"


class FakeV2(BaseHTTPRequestHandler):
    """Ready after `not_ready` polls; metadata declares a pixels input; infer echoes a shape."""

    state: dict

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        st = self.state
        if self.path == f"/v2/models/{st['model']}/ready":
            st["polls"] += 1
            self._send(200 if st["polls"] > st["not_ready"] else 503, {})
        elif self.path == f"/v2/models/{st['model']}":
            self._send(
                200,
                {
                    "name": st["model"],
                    "inputs": [
                        {"name": "tiles", "datatype": "BYTES", "shape": [-1]},
                        {
                            "name": "pixels",
                            "datatype": "UINT8",
                            "shape": [-1, st["tile"], st["tile"], 3],
                        },
                    ],
                },
            )
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        st["request"] = body
        if st["infer_status"] != 200:
            self._send(st["infer_status"], {"error": "boom"})
            return
        (inp,) = body["inputs"]
        n = inp["shape"][0]
        self._send(
            200,
            {
                "model_name": st["model"],
                "outputs": [
                    {
                        "name": "embedding",
                        "datatype": "FP32",
                        "shape": [n, 4],
                        "data": [0.5] * 4 * n,
                    }
                ],
            },
        )


@pytest.fixture
def fake_server():
    servers = []

    def start(**state):
        defaults = {
            "model": "h0-mini",
            "tile": 224,
            "not_ready": 0,
            "infer_status": 200,
            "polls": 0,
        }
        handler = type("Handler", (FakeV2,), {"state": {**defaults, **state}})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", handler.state

    yield start
    for s in servers:
        s.shutdown()


def run_client(targets: str, model: str = "h0-mini", protocol: str = "http", timeout: str = "20"):
    env = {
        "HISTOSERVE_MODEL": model,
        "HISTOSERVE_PROTOCOL": protocol,
        "HISTOSERVE_TARGETS": targets,
        "HISTOSERVE_TIMEOUT_S": timeout,
        "HISTOSERVE_POLL_S": "0.05",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, str(CLIENT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_waits_for_readiness_then_sends_one_valid_pixels_tile(fake_server, monkeypatch):
    url, state = fake_server(not_ready=1)
    # the first candidate never answers (like port 80 on a headless Service)
    proc = run_client(f"http://127.0.0.1:9 {url}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    assert state["polls"] >= 2
    (inp,) = state["request"]["inputs"]
    assert inp["name"] == "pixels" and inp["datatype"] == "UINT8"
    assert inp["shape"] == [1, 224, 224, 3]
    assert len(inp["data"]) == 224 * 224 * 3
    assert all(0 <= v <= 255 for v in inp["data"]) and len(set(inp["data"])) > 1


def test_tile_geometry_comes_from_model_metadata(fake_server):
    url, state = fake_server(model="tissue-seg", tile=512)
    proc = run_client(url, model="tissue-seg")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert state["request"]["inputs"][0]["shape"] == [1, 512, 512, 3]


def test_fails_on_a_non_200_inference(fake_server):
    url, _ = fake_server(infer_status=503)
    proc = run_client(url)
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "503" in proc.stdout


def test_fails_when_never_ready(fake_server):
    url, _ = fake_server(not_ready=10**6)
    proc = run_client(url, timeout="1")
    assert proc.returncode == 1
    assert "not ready in time" in proc.stdout


def test_grpc_path_sends_raw_pixels():
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("kserve.protocol.grpc.grpc_predict_v2_pb2")
    pb_grpc = pytest.importorskip("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc")
    seen = {}

    class Servicer(pb_grpc.GRPCInferenceServiceServicer):
        def ModelReady(self, request, context):
            return pb.ModelReadyResponse(ready=request.name == "h0-mini")

        def ModelMetadata(self, request, context):
            return pb.ModelMetadataResponse(
                name=request.name,
                inputs=[
                    pb.ModelMetadataResponse.TensorMetadata(
                        name="pixels", datatype="UINT8", shape=[-1, 224, 224, 3]
                    )
                ],
            )

        def ModelInfer(self, request, context):
            seen["request"] = request
            return pb.ModelInferResponse(
                model_name=request.model_name,
                outputs=[
                    pb.ModelInferResponse.InferOutputTensor(
                        name="embedding", datatype="FP32", shape=[1, 1536]
                    )
                ],
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        proc = run_client(f"127.0.0.1:{port}", protocol="grpc")
    finally:
        server.stop(None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = seen["request"]
    assert list(req.inputs[0].shape) == [1, 224, 224, 3] and req.inputs[0].datatype == "UINT8"
    assert len(req.raw_input_contents[0]) == 224 * 224 * 3
