# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-all lab bench validate ledger clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lab]'
	$(BIN)/python -m ipykernel install --sys-prefix --name perfkit --display-name "perfkit (.venv)" >/dev/null
	touch $(STAMP)

run: $(STAMP)  ## every shipped hypothesis in quick mode; writes runs/<id>/ and hypotheses/LEDGER.md
	$(BIN)/perfkit run --all --quick

test: $(STAMP)  ## the test suite (slow tests excluded; see `make test-all`)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

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
