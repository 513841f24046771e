# Set-up commands: `make demo` (the main job), `make demo-real` (the same on real Multi30k text;
# DEMO_ARGS="--orig DIR" for a local copy of its six files) and `make test` (the full test suite);
# `make test-fast` is the fast loop (tests not marked slow). All create the virtualenv .venv if missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch: an install the virtualenv already has is kept (e.g. VENV_FLAGS=--system-site-packages
# on a cluster whose Python has a CUDA torch); otherwise pip installs TORCH_SPEC.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
VENV_FLAGS ?=
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: venv demo demo-real test test-fast bench clean-venv

venv: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@# upstream fairseq 0.12.2 (Python < 3.11) does not resolve with pip >= 24.1 (omegaconf 2.0 metadata)
	$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || $(PY) -m pip install -q "pip<24.1"
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -e '.[test]'
	touch $@

demo: venv
	$(PY) -m fairseq_lnpos.demo $(DEMO_ARGS)

demo-real: venv
	$(PY) -m fairseq_lnpos.demo --data multi30k $(DEMO_ARGS)

test: venv
	$(PY) -m pytest tests -rs $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest tests -m "not slow" -rs $(PYTEST_ARGS)

bench: venv
	PYTHON=$(PY) scripts/bench.sh

clean-venv:
	rm -rf $(VENV)
