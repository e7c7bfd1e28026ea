#!/usr/bin/env bash
# The same benchmark on a CUDA node: the demo package plus an H0-sized
# (ViT-g/14, ~1.1B parameters) random-weight package in bf16 (or fp16), both
# exported for CUDA and cached under .cache/test-packages/ (the ViT-g export
# takes minutes the first time). Untested here: the development machines have
# no GPU. See bench/README.md.
#
#   bash bench/gpu.sh                       # bf16, results in bench/results-gpu/
#   DTYPE=fp16 OUT=/tmp/gpu bash bench/gpu.sh --models vit-g
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DTYPE=${DTYPE:-bf16}
OUT=${OUT:-bench/results-gpu}
DEVICE=${DEVICE:-cuda}

"$PYTHON" - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("bench/gpu.sh: torch sees no CUDA device (is this the CPU build of torch?)")
print(f"bench/gpu.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", file=sys.stderr)
PY

exec "$PYTHON" -m bench.run --profile gpu --device "$DEVICE" --dtype "$DTYPE" --out "$OUT" "$@"
