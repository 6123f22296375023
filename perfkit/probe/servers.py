"""The server a probe drives: `perfkit engine serve` started as a subprocess, or one already running.

A probe never imports the engine: it starts `python -m perfkit.engine.cli serve` on a free loopback
port, in a process group of its own, with stdout and stderr in a log file (the evidence a failed
start or a profile run leaves behind), and waits for `GET /health` to answer 200. Stopping sends
SIGTERM, waits, then SIGKILLs whatever of the group is left: a probe leaves no process behind,
whatever happened in it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.endpoints import free_port, get_json, identity
from perfkit.engineoptions import EngineOptions
from perfkit.errors import UserError
from perfkit.processes import alive

STARTUP_TIMEOUT_S = 600.0  # loading weights and spawning TP ranks on a busy CPU takes a while
STOP_GRACE_S = 15.0  # SIGTERM, then this long, then SIGKILL
TAIL_LINES = 30


def _health(url: str) -> int | None:
    """The status `GET /health` answers, None when nothing answers yet."""
    try:
        return get_json(f"{url}/health", timeout=2.0)[0]
    except (urllib.error.URLError, OSError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Server:
    """`perfkit engine serve` run as a subprocess: `with Server(EngineOptions(tp=2)) as s: run(s.url, ...)`.

    `options` is what every rank loads and decodes with; `args` are further `serve` arguments of the
    server itself (e.g. ["--chunk", "token"]); `env` is added to this process's environment (e.g.
    {"PERFKIT_PROFILE": "1"}); the log goes to `log_dir` (a new temporary folder when None) and stays
    there after the server stops.
    """

    options: EngineOptions = field(default_factory=EngineOptions)
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    log_dir: str | os.PathLike | None = None
    host: str = "127.0.0.1"
    startup_timeout: float = STARTUP_TIMEOUT_S
    stop_grace: float = STOP_GRACE_S
    url: str = field(default="", init=False)
    log_path: Path | None = field(default=None, init=False)
    _process: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _pids: list[int] = field(default_factory=list, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    def command(self, port: int) -> list[str]:
        """The command line that starts the server on `port`."""
        head = [sys.executable, "-m", "perfkit.engine.cli", "serve", "--host", self.host, "--port", str(port)]
        return head + self.options.argv() + list(self.args)

    def start(self) -> Server:
        """Start the server and wait until `/health` answers 200; on failure, stop it and raise with the log's tail."""
        if self._process is not None:
            raise UserError(f"this server was already started (pid {self.pid})")
        self.options.checked()  # a bad option is the caller's error here, not a server that exits
        folder = Path(self.log_dir) if self.log_dir is not None else Path(tempfile.mkdtemp(prefix="perfkit-serve-"))
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port(self.host)
        self.url = f"http://{self.host}:{port}"
        self.log_path = folder / f"serve-{port}.log"
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1", "PERFKIT_SERVE_PARENT": str(os.getpid())}
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: the TP ranks are stopped with it
            )
        atexit.register(self.stop)  # a probe whose cell failed leaves no server behind when its kernel exits
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise UserError(f"perfkit engine serve exited with status {code} before it was ready{self._tail()}")
            if _health(self.url) == 200 and self._ours():
                break
            if time.monotonic() > deadline:
                raise UserError(
                    f"perfkit engine serve was not ready at {self.url}/health within {self.startup_timeout:g} s"
                    + self._tail()
                )
            time.sleep(0.2)

    def _ours(self) -> bool:
        """Whether the server answering at our URL is the process we started, and then its ranks' pids.
        The port was free when chosen and is bound a moment later: another server may have taken it."""
        try:
            engine = identity(self.url).get("engine", {})
        except UserError:
            return False
        if engine.get("server_pid") != self._process.pid:
            return False
        self._pids = [int(p) for p in engine.get("pids", []) or []]
        return True

    def report(self, *, dry: bool = False) -> bool:
        """Ask the server's ranks to print their profile lines now (SIGUSR1 to the server, which
        passes it on); whether it can, i.e. it runs with PERFKIT_PROFILE on. `dry`: only say."""
        env = {**os.environ, **(self.env or {})}
        profiling = env.get("PERFKIT_PROFILE", "").strip().lower() in ("1", "true", "yes", "on")
        if not profiling or self._process is None or self._process.poll() is not None or not self._pids:
            return False
        if not dry:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGUSR1)
        return True

    def log_text(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _tail(self) -> str:
        lines = self.log_text().splitlines()[-TAIL_LINES:]
        return f"; the end of {self.log_path}:\n" + "\n".join(lines) if lines else f"; {self.log_path} is empty"

    def identity(self) -> dict[str, Any]:
        return identity(self.url)

    def stop(self) -> int | None:
        """SIGTERM the server, wait `stop_grace`, SIGKILL what is left of its process group; its exit status."""
        process = self._process
        if process is None:
            return None
        atexit.unregister(self.stop)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=self.stop_grace)
        self._kill_remains(process.pid, wait=process.poll() is not None)
        return process.wait()

    def _remains(self, pgid: int) -> bool:
        return _group_alive(pgid) or any(alive(p) for p in self._pids)

    def _kill_remains(self, pgid: int, *, wait: bool) -> None:
        """Its ranks (its process group, the pids its identity named): a grace after the leader exits, then SIGKILL."""
        deadline = time.monotonic() + (self.stop_grace if wait else 0.0)
        while self._remains(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in self._pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Server:
        return self if self._process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Remote:
    """A server someone else started: used as is, never stopped."""

    url: str
    pid: None = None
    log_path: None = None

    def identity(self) -> dict[str, Any]:
        return identity(self.url)

    def log_text(self) -> str:
        raise UserError(f"the server at {self.url} was not started by this probe: its log is not here")


@contextlib.contextmanager
def server(
    url: str = "",
    options: EngineOptions | None = None,
    *,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    log_dir: str | os.PathLike | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[Server | Remote]:
    """The server a probe drives: `url` as is (checked with /v1/models), or, when empty, one started here
    with `options` (the engine's defaults when None) and the server's own `args`; with a `url` those are
    not used."""
    url = (url or "").strip().rstrip("/")
    if url:
        identity(url)  # raises, naming the URL, when nothing answers
        yield Remote(url)
        return
    started = Server(
        options or EngineOptions(), args=tuple(args), env=env, log_dir=log_dir, startup_timeout=startup_timeout
    )
    with started:
        yield started
