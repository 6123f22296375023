# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where torch comes from. Empty: the ordinary pip search (PyPI's torch for Linux is the CUDA build,
# several GB; a machine with a local CPU wheel gets that). A laptop without an NVIDIA GPU:
#   make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: run test lint format lab kernel bench validate ledger clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet torch==2.13.0 --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[engine,test,lab,cluster,serve]'
	# the `perfkit` kernel (the project on its import path), the notebook clean filter and the LEDGER.md merge
	# driver: what `perfkit init` sets up in any repository, here through this checkout's .venv
	-$(BIN)/perfkit init . >/dev/null
	touch $(STAMP)

run: $(STAMP)  ## every shipped hypothesis in quick mode; writes runs/<id>/ and hypotheses/LEDGER.md
	$(BIN)/perfkit run --all --quick

# every run of the suite takes its modules, and the tests inside each, in a shuffled order (pytest-random-order):
# a test that passes only after another fails somewhere; the seed it prints reruns that order
TEST_SEED ?= $(shell date +%s)

test: $(STAMP) lint  ## lint, then the test suite, in a shuffled order
	@echo "tests in a shuffled order: make test TEST_SEED=$(TEST_SEED) repeats it"
	$(BIN)/python -m pytest -q --random-order-bucket=module --random-order-seed=$(TEST_SEED)

lint: $(STAMP)  ## ruff: formatting and lint rules (pyproject.toml); `make format` applies the formatting
	$(BIN)/ruff format --check --quiet perfkit tests
	$(BIN)/ruff check --quiet perfkit tests

format: $(STAMP)
	$(BIN)/ruff format --quiet perfkit tests
	$(BIN)/ruff check --quiet --fix perfkit tests

lab: $(STAMP)  ## JupyterLab on notebooks/ (works as root too, as in containers)
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/

kernel: $(STAMP)  ## register the `perfkit` kernel for your own Jupyter (user-wide, outside .venv)
	$(BIN)/perfkit kernel --user

bench: $(STAMP)
	$(BIN)/perfkit engine benchmarks

validate: $(STAMP)
	$(BIN)/perfkit validate

ledger: $(STAMP)
	$(BIN)/perfkit ledger

clean-venv:
	rm -rf $(VENV)
