# histoserve: the README's commands. Everything installs itself from a clean clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build lies on disk on the development machines; an unpinned torch
# would pull a multi-GB CUDA wheel. GPU hosts may override TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
HELM := .tools/bin/helm
MODEL_DIR ?= model
DEMO_SPEC ?= h0-mini
HTTP_PORT ?= 8080
GRPC_PORT ?= 8081
# `make serve` answers this machine only (no authentication in front of it);
# the image and the chart listen on every interface. BIND_ADDRESS=0.0.0.0 opens it.
BIND_ADDRESS ?= 127.0.0.1
PYTEST_ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers, a test file per worker at a time.
TEST_WORKERS ?= 2

.PHONY: all install serve test test-long autoscale lint format manifests helm prometheus bench bench-tiny soak clean gpu-check wheelhouse

all: test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[server,test,slides]"
	touch $(STAMP)

install: $(STAMP)

$(HELM):
	$(PYTHON) scripts/install_helm.py --dest .tools/bin

helm: $(HELM)

# A real Prometheus for the queries' test (tests/integration/test_prometheus_queries.py):
# Debian's package; the test runs the binary itself on loopback (the service is not used).
PROMETHEUS := /usr/bin/prometheus
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
$(PROMETHEUS):
	$(SUDO) apt-get update -qq
	$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus

prometheus: $(PROMETHEUS)

$(MODEL_DIR)/$(DEMO_SPEC).pt2: | $(STAMP)
	mkdir -p $(MODEL_DIR)
	$(BIN)/python -m predictor.export --spec $(DEMO_SPEC) --demo --output $@

# `make serve MODELS="h0-mini tissue-seg abmil-demo"`: one server, one folder per model (demo packages)
MODELS ?=
REPOSITORY_DIR := $(MODEL_DIR)/repository

ifeq ($(strip $(MODELS)),)
serve: $(STAMP) $(MODEL_DIR)/$(DEMO_SPEC).pt2
	$(BIN)/python -m predictor --model_dir $(MODEL_DIR) --checkpoint $(DEMO_SPEC).pt2 --device cpu \
	  --http_port $(HTTP_PORT) --grpc_port $(GRPC_PORT) --bind_address $(BIND_ADDRESS)
else
serve: $(STAMP)
	for m in $(MODELS); do test -f $(REPOSITORY_DIR)/$$m/$$m.pt2 || { mkdir -p $(REPOSITORY_DIR)/$$m && \
	  $(BIN)/python -m predictor.export --spec $$m --demo --output $(REPOSITORY_DIR)/$$m/$$m.pt2; } || exit 1; done
	$(BIN)/python -m predictor --model_dir $(REPOSITORY_DIR) --models $(shell echo $(MODELS) | tr ' ' ,) \
	  --device cpu --http_port $(HTTP_PORT) --grpc_port $(GRPC_PORT) --bind_address $(BIND_ADDRESS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: $(STAMP) $(HELM) $(PROMETHEUS) lint
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-long: $(STAMP) $(HELM)
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m slow $(PYTEST_ARGS)

# The closed autoscaling loop for each chart preset (minutes; part of test-long):
# figures and plots under bench/results/autoscale (docs/deployment.md).
autoscale: $(STAMP) $(HELM)
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m slow -s tests/integration/test_autoscale_presets.py $(PYTEST_ARGS)

# The long soak (minutes, RSS sampled); HISTOSERVE_SOAK_S sets its length.
soak: $(STAMP)
	HISTOSERVE_SOAK_S=$${HISTOSERVE_SOAK_S:-180} $(BIN)/pytest -m slow tests/reliability/test_soak.py $(PYTEST_ARGS)

manifests: $(HELM)
	$(PYTHON) scripts/render_manifests.py --helm $(HELM)

# NVIDIA Triton for the benchmark's baseline: nvidia-pytriton pins numpy<2, so
# it gets its own venv (never .venv).
TRITON_VENV := .venv-triton
$(TRITON_VENV)/.installed:
	test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet "$(TORCH_SPEC)" nvidia-pytriton "numpy<2"
	touch $@

bench: $(STAMP) $(TRITON_VENV)/.installed
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/python -m bench.run --out bench/results

# The GPU check (bench/gpu/check.py, bench/README.md "GPU check"): on a lent GPU
# machine it is `python3 -m bench.gpu.check --out $OUT` (no make needed there;
# the wheels of `make wheelhouse` are unpacked by the check itself), or on the
# CPU with DRY_RUN=1 (what `make test` runs). Results as JSON and a table in
# $(OUT), written stage by stage.
CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
OUT ?= bench/results-gpu
gpu-check:
	$(CHECK_PYTHON) -m bench.gpu.check --out "$(OUT)" $(if $(DRY_RUN),--dry_run) $(GPU_CHECK_ARGS)

# Wheels for what the GPU machine lacks (Python 3.12, x86_64; it has torch, timm,
# numpy, pillow, grpcio, h5py): KServe and its web stack, tritonclient[grpc] for
# the gRPC load with the grpcio it needs (the machine's may be older), and the
# real H&E tile of the dry run's crops. Ignored by git; carried with the tree
# (64 MiB in all).
WHEELHOUSE := .gpu-wheels
WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any
PREINSTALLED := numpy-* pillow-* setuptools-* cryptography-* cffi-* pycparser-*
wheelhouse:
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE)
	$(CHECK_PYTHON) -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(foreach p,$(WHEEL_PLATFORMS),--platform $(p)) -d $(WHEELHOUSE) \
	  "kserve==0.21.0" "prometheus-client>=0.20" "tritonclient[grpc]>=2.50" aiohttp pyyaml httpx simplejpeg
	cd $(WHEELHOUSE) && rm -f $(PREINSTALLED)
	$(CHECK_PYTHON) -c "from harness.slides import he_tile; from PIL import Image; Image.fromarray(he_tile()).save('$(WHEELHOUSE)/he_tile.png')"
	du -sh $(WHEELHOUSE)

clean:
	rm -rf $(VENV) .venv-triton .tools .cache $(MODEL_DIR)
