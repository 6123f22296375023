"""llama.cpp's llama-server started and stopped for a test: a free loopback port, its own process group.

The binary is PERFKIT_LLAMA_SERVER (`make test-thirdparty` sets it; a test without it is skipped).
The log goes beside the model. Stopping sends SIGTERM to the group, waits, then SIGKILLs what is left,
and is checked: no process of that group outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfkit.endpoints import free_port

HERE = Path(__file__).resolve().parent
MODEL_NAME = "perfkit-tiny-llama"  # the server's --alias: the id /v1/models names
STARTUP_S = 120.0
STOP_S = 15.0


@dataclass
class LlamaServer:
    url: str
    process: subprocess.Popen
    log: Path
    model: Path

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def needed(name: str) -> Path:
    value = os.environ.get(name, "")
    if not value or not os.access(value, os.X_OK):
        pytest.skip(f"{name} is not set to an executable (`make test-thirdparty` builds and sets it)")
    return Path(value)


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code  # 503 while the model loads
    except (urllib.error.URLError, OSError):
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_ready(server, name: str, *, within_s: float, poll_s: float) -> None:
    """Until `server.url`/health answers 200; a test failure with the log's tail when its process exits
    first or `within_s` pass (`server`: anything with `url`, `process` and `log_tail()`)."""
    deadline = time.monotonic() + within_s
    while _health(server.url) != 200:
        if server.process.poll() is not None:
            pytest.fail(f"{name} exited with {server.process.returncode} before it was ready:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{name} was not ready at {server.url}/health in {within_s:g} s:\n{server.log_tail()}")
        time.sleep(poll_s)


def completed(results: list) -> list:
    """perfkit.serving's results, each request asserted ok (the failed ones named with their errors)."""
    failed = [f"request {r.index}: {r.error}" for r in results if not r.ok]
    assert not failed, failed
    return results


def stop(server: LlamaServer) -> int:
    """SIGTERM, a grace, then SIGKILL to the server's process group; its exit status."""
    process = server.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait(timeout=STOP_S)


@contextlib.contextmanager
def llama_server(model: Path, *args: str) -> Iterator[LlamaServer]:
    """llama-server with `model` on a free loopback port, `--metrics` on, until `/health` answers 200."""
    binary = needed("PERFKIT_LLAMA_SERVER")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = model.parent / f"llama-server-{port}.log"
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL_NAME]
    command += ["--metrics", "--no-webui", "-c", "4096", "-np", "2", "-t", "1", "-tb", "1", *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LlamaServer(url, process, log, model)
    try:
        wait_ready(server, "llama-server", within_s=STARTUP_S, poll_s=0.1)
        yield server
    finally:
        stop(server)
        assert not group_alive(process.pid), f"llama-server's process group {process.pid} outlived its stop"
