#!/usr/bin/env bash
# The same benchmark on a CUDA node: the demo package plus an H0-sized
# (ViT-g/14, ~1.1B parameters) random-weight package in bf16 (or fp16), both
# exported for CUDA and cached under .cache/test-packages/ (the ViT-g export
# takes minutes the first time). Untested here: the development machines have
# no GPU. See bench/README.md.
#
#   bash bench/gpu/bench.sh                 # bf16, results in bench/results-gpu/
#   DTYPE=fp16 OUT=/tmp/gpu bash bench/gpu/bench.sh --models vit-g
#   bash bench/gpu/bench.sh parts           # issue 12's GPU-only parts, < 10 minutes
#
# `parts` runs bench/gpu/parts.py on the demo package exported for CUDA:
# tiles/s on cuda:0 alone vs --device auto (one worker per visible GPU) with
# each worker's batch count, the pinned copy vs the forward per batch (how
# much of the copy compute hides), and tiles/s with 1 vs 2 instances on cuda:0
# (--instances_per_device 2). Output: $OUT/gpu-parts.json (and the lines on stdout).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
DTYPE=${DTYPE:-bf16}
OUT=${OUT:-bench/results-gpu}
DEVICE=${DEVICE:-cuda}

"$PYTHON" - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("bench/gpu/bench.sh: torch sees no CUDA device (is this the CPU build of torch?)")
print(f"bench/gpu/bench.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", file=sys.stderr)
PY

if [[ "${1:-}" == parts ]]; then
    shift
    mkdir -p "$OUT"
    timeout "${PARTS_TIMEOUT_S:-570}" "$PYTHON" -m bench.gpu.parts --device "${PARTS_DEVICE:-auto}" \
        --dtype "$DTYPE" "$@" | tee "$OUT/gpu-parts.log"
    tail -n 1 "$OUT/gpu-parts.log" >"$OUT/gpu-parts.json"
    exit 0
fi

exec "$PYTHON" -m bench.run --profile gpu --device "$DEVICE" --dtype "$DTYPE" --out "$OUT" "$@"
