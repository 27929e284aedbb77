# shardwise: one venv, CPU stack by default. `make run` and `make test` set up on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORK ?= runs/local
# the image every pipeline step runs (shardwise.pipelines.components.IMAGE); BASE_IMAGE: see the Dockerfile
IMAGE ?= ghcr.io/shardwise/shardwise:0.1.0
BASE_IMAGE ?=
# requirements/<STACK>.txt in the image: cuda (GPU nodes) or cpu (make image-cpu)
STACK ?= cuda
# where torch's CPU wheel is for make image-cpu (default: this host's pip find-links)
WHEELS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)

.PHONY: setup run model-large test test-all lint bench clean image image-cpu base-image

$(STAMP): requirements/cpu.txt requirements/dev.txt requirements/torchrec.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/cpu.txt -r requirements/dev.txt
	# torchrec's metadata asks for the CUDA fbgemm-gpu; its real dependencies are pinned in cpu.txt
	$(BIN)/pip install -q --no-deps -r requirements/torchrec.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/shardwise pipeline run --local --workdir $(WORK)

# a larger cost model for the paper task sets (presets.yaml: local-large), registered beside make run's
model-large: $(STAMP)
	$(BIN)/shardwise pipeline run --local --preset local-large --workdir runs/large

# after each change: unit tests and the fast integration tests on real kernels (not marked slow or e2e: the rule is
# in pyproject.toml's markers), one pytest worker a core up to 4 (pytest-xdist: one test's Python and subprocess
# start-up overlap another's kernels); PYTEST_ARGS adds options (e.g. --durations=15, -n 0 for one process)
TEST_WORKERS ?= -n auto --maxprocesses 4
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not e2e" $(TEST_WORKERS) $(PYTEST_ARGS) tests

# everything (CI): + the slow tests (process groups, DMP, the MLflow server, whole benchmark and refinement sessions),
# the pipeline end to end, and the image and the pipeline in containers where a Docker engine runs
test-all: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) tests

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks components pipelines
	$(BIN)/mypy
	$(BIN)/lint-imports

# the quick suite of benchmarks (CPU minutes, no cost model needed; `python -m benchmarks --list`: every experiment)
bench: $(STAMP)
	$(BIN)/python -m benchmarks --suite quick

# the GPU image: CUDA torch, fbgemm-gpu and torchrec from the package index; this host's CA certificates reach
# the build stage only (for hosts behind a TLS-inspecting proxy)
image:
	mkdir -p .build/ca .build/wheels
	if [ -f /etc/ssl/certs/ca-certificates.crt ]; then cp /etc/ssl/certs/ca-certificates.crt .build/ca/ca.crt; \
	else : > .build/ca/ca.crt; fi
	rm -f .build/wheels/*.whl
	if [ "$(STACK)" = cpu ]; then cp $(WHEELS)/torch-2.13.0+cpu-*.whl .build/wheels/ || { echo \
	  "make image-cpu needs torch's CPU wheel (torch-2.13.0+cpu, download.pytorch.org/whl/cpu) in WHEELS=DIR" >&2; \
	  exit 2; }; fi
	docker build $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) --build-arg STACK=$(STACK) -t $(IMAGE) .
	# Docker's classic builder leaves the build stage as an untagged image (2.35 GB for image-cpu): drop it
	docker image prune -f --filter label=shardwise.stage=build

# the same image with the CPU builds of torch and fbgemm: the pipeline's steps in containers on a machine
# without a GPU (shardwise pipeline run --local --containers); BASE_IMAGE as for make image
image-cpu:
	$(MAKE) image STACK=cpu IMAGE=$(IMAGE)-cpu

# a Debian base made here, for machines that cannot pull images: make image BASE_IMAGE=shardwise-base:bookworm
base-image:
	docker/make-base.sh shardwise-base:bookworm

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts mlruns .build
