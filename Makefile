# shardwise: one venv, CPU stack by default. `make run` and `make test` set up on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORK ?= runs/local

.PHONY: setup run test test-fast lint bench clean

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

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks components pipelines
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts mlruns
