"""Fixtures: the tiny model (tinymodel.py, written once per session) and llama-server on it (once per module).

`make test-thirdparty` builds the server (`make thirdparty`) and sets PERFKIT_LLAMA_SERVER (the
binary) and PERFKIT_THIRDPARTY_PYTHON (the python with gguf and tokenizers that tinymodel.py needs);
without them these tests are skipped. The model is written to the session's temporary folder (a
second or so), never into the checkout.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from llamaserver import HERE, LlamaServer, llama_server, needed


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny GGUF model (tinymodel.py), written with .venv-thirdparty's python."""
    python = needed("PERFKIT_THIRDPARTY_PYTHON")
    path = tmp_path_factory.mktemp("model") / "tiny-llama.gguf"
    subprocess.run([str(python), str(HERE / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=120)
    return path


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[LlamaServer]:
    with llama_server(tiny_model) as running:
        yield running
