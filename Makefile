# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint format lab bench validate ledger clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lab]'
	$(BIN)/python -m ipykernel install --sys-prefix --name perfkit --display-name "perfkit (.venv)" >/dev/null
	touch $(STAMP)

run: $(STAMP)  ## every shipped hypothesis in quick mode; writes runs/<id>/ and hypotheses/LEDGER.md
	$(BIN)/perfkit run --all --quick

test: $(STAMP) lint  ## lint, then the test suite
	$(BIN)/python -m pytest -q

lint: $(STAMP)  ## ruff: formatting and lint rules (pyproject.toml); `make format` applies the formatting
	$(BIN)/ruff format --check --quiet perfkit tests
	$(BIN)/ruff check --quiet perfkit tests

format: $(STAMP)
	$(BIN)/ruff format --quiet perfkit tests
	$(BIN)/ruff check --quiet --fix perfkit tests

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

bench: $(STAMP)
	$(BIN)/perfkit engine benchmarks

validate: $(STAMP)
	$(BIN)/perfkit validate

ledger: $(STAMP)
	$(BIN)/perfkit ledger

clean-venv:
	rm -rf $(VENV)
