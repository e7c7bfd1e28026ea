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
PYTEST_ARGS ?=

.PHONY: all install serve test test-long lint format manifests helm bench bench-tiny soak clean

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

$(MODEL_DIR)/$(DEMO_SPEC).pt2: | $(STAMP)
	mkdir -p $(MODEL_DIR)
	$(BIN)/python -m predictor.export --spec $(DEMO_SPEC) --demo --output $@

serve: $(STAMP) $(MODEL_DIR)/$(DEMO_SPEC).pt2
	$(BIN)/python -m predictor --model_dir $(MODEL_DIR) --checkpoint $(DEMO_SPEC).pt2 --device cpu --http_port 8080 --grpc_port 8081

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: $(STAMP) $(HELM) lint
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

test-long: $(STAMP) $(HELM)
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/pytest -m slow $(PYTEST_ARGS)

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

clean:
	rm -rf $(VENV) .venv-triton .tools .cache $(MODEL_DIR)
