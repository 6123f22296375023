"""Rank processes: the engine behind `perfkit engine serve`, one process per tensor-parallel rank,
seen from the parent.

    workers = Workers(EngineOptions(tp=2, preset="shipped"))
    workers.start()                                   # returns at once; the ranks load in parallel
    workers.wait_ready(timeout=120)
    summary = workers.generate([[104, 105]], max_new_tokens=32, on_tokens=print)
    workers.close()

Each rank is a `python -c` process (perfkit.engine.serve.rank) with RANK, WORLD_SIZE and LOCAL_RANK in
its environment (so its profile lines say `rank=R`), its share of the CPU threads, the same engine
(`load_engine(preset, seed=0)`, then `tp.shard`) and a pipe to the parent. A job goes to every rank
over its own pipe rather than through a collective, because an idle rank waiting in a collective
would hit the group's timeout. Every rank runs `Engine.generate` with the same arguments; rank 0
sends each step's tokens, then every rank says it is done (rank 0 with the summary). The pipe speaks
the dataclasses of perfkit.engine.serve.messages. Nothing here imports torch: the parent starts the
ranks at once, and each imports it for itself, in parallel.

A dead rank never hangs the parent: the parent waits on every rank's pipe at once, a pipe closes
when its rank dies (killed, out of memory, crashed), and the parent then kills the others (they
would wait in an all-reduce) and raises RankDied; later calls raise at once. A rank's exception
comes back with its message; when every rank raised it before entering any collective, the workers
stay usable. Ranks exit when the parent dies (a thread in each watches the parent pid).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing import connection

from perfkit.endpoints import free_port
from perfkit.engine.serve.messages import Done, Failed, Job, Ready, Step
from perfkit.engineoptions import APPROX_FROM, EngineOptions
from perfkit.errors import PerfkitError, UserError
from perfkit.paths import PACKAGE_HOME

__all__ = ["Workers", "RankError", "RankDied"]

ERROR_GRACE_S = 10.0  # after one rank reports an error, how long the others have to report theirs
PEER_DEATH_S = 1.0  # how long a rank's collective error waits for a peer's death to show
_RANK_CODE = "from perfkit.engine.serve.rank import main; main()"


class RankError(PerfkitError):
    """A rank failed; the message names it and says why."""


class RankDied(RankError):
    """A rank process exited, e.g. "rank 1 (pid 1234) died: killed by SIGKILL"."""


class Workers:
    """`options.tp` rank processes serving one engine; one `generate` at a time. `identity` says which
    engine: every field of its options (threads resolved, per rank) and perfkit's version."""

    def __init__(self, options: EngineOptions, *, stderr=None):
        from perfkit import __version__

        options = options.checked()  # before any rank starts, as each rank's engine would
        self.options = replace(options, threads=options.threads or max(1, _threads() // options.tp))
        self.identity = {**self.options.asdict(), "version": __version__}
        self.limits: dict = {}  # rank 0's model limits once ready: max_seq_len, block (see max_prompt_tokens)
        self._stderr = stderr
        self._procs: list[subprocess.Popen] = []
        self._conns: list[connection.Connection] = []
        self._ready: set[int] = set()
        self._lock = threading.Lock()  # one job (or start-up wait) at a time
        self._fail_lock = threading.Lock()
        self._dead: str | None = None
        self._dead_as: type[Exception] = RankDied

    @property
    def tp(self) -> int:
        return self.options.tp

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the rank processes and return at once (they import torch and load in parallel)."""
        if self._procs:
            raise UserError("these workers were already started")
        port = free_port() if self.tp > 1 else 0
        root = str(PACKAGE_HOME)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        out = self._stderr if self._stderr is not None else 2  # ranks print nothing on our stdout
        for rank in range(self.tp):
            mine, theirs = connection.Pipe()
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(self.tp), LOCAL_RANK=str(rank), PYTHONPATH=path)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if self.identity["device"] == "cpu":
                env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
            config = dict(options=self.options.asdict(), rank=rank, fd=theirs.fileno(), parent=os.getpid())
            proc = subprocess.Popen(
                [sys.executable, "-c", _RANK_CODE, json.dumps(config)],
                env=env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=self._stderr,
            )
            theirs.close()
            self._procs.append(proc)
            self._conns.append(mine)

    def wait_ready(self, timeout: float) -> None:
        """Block until every rank has loaded and the group has formed. A rank that failed raises
        its error (UserError for a bad preset, device or --tp) or RankDied; not ready within
        `timeout` seconds is a UserError (the ranks keep loading; close() stops them)."""
        if not self._procs:
            raise UserError("start() the workers before waiting for them")
        deadline = time.monotonic() + timeout
        with self._lock:
            self._raise_if_dead()
            while len(self._ready) < self.tp:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UserError(f"{len(self._ready)} of {self.tp} ranks ready after {timeout:g} s")
                for rank, message in self._receive(left):
                    self._starting(rank, message)

    def _starting(self, rank: int, message: Ready | Failed) -> None:
        if isinstance(message, Ready):
            self._ready.add(rank)
            if rank == 0:
                self.limits = {"max_seq_len": message.max_seq_len, "block": message.block}
        elif isinstance(message, Failed):
            self._rank_failed(rank, message, during="start-up")

    def max_prompt_tokens(self, max_new_tokens: int) -> int:
        """The longest prompt that leaves room for `max_new_tokens` (Engine.generate's rule); needs ready."""
        from perfkit.engine.decode import growth

        block = self.limits["block"]
        return self.limits["max_seq_len"] - 1 - growth(self.options.mode, max_new_tokens, self.options.budget, block)

    @property
    def ready(self) -> bool:
        """All ranks loaded and the group formed (does not block)."""
        if self._procs and len(self._ready) < self.tp and self._dead is None and self._lock.acquire(blocking=False):
            try:
                for rank, message in self._receive(0):
                    self._starting(rank, message)
            except PerfkitError:
                pass  # recorded in self.dead
            finally:
                self._lock.release()
        return self.dead is None and len(self._ready) == self.tp

    @property
    def loaded(self) -> bool:
        """Every rank has said it is ready (set up its signal handlers too); never blocks or reads."""
        return len(self._ready) == self.tp

    @property
    def dead(self) -> str | None:
        """Why the workers are unusable (a rank died, failed, or close() was called); None while fine."""
        if self._dead is None:
            for rank, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    self._fail(self._death(rank), RankDied)
                    break
        return self._dead

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self, grace: float = 5.0) -> None:
        """SIGTERM every rank, SIGKILL those still there after `grace` seconds; idempotent."""
        if self._dead is None:
            self._fail("the workers were closed", RankError, kill=False)
        _terminate(self._procs, grace)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- generation -------------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, on_tokens, temperature: float = 0.0, seed: int = 0
    ) -> dict:
        """Greedy (temperature 0) or seeded sampled generation on every rank; blocks until done.

        `on_tokens(list[list[int]])` is called in this thread with the tokens each request gained,
        after the first token and after every decode step. Returns the summary: tokens, steps,
        accept_lengths, prefill_s, ttft_s, decode_s, decode_tok_s, fill, prompt_tokens,
        generated_tokens, experts_touched. With fill "auto", prompts of APPROX_FROM tokens or more
        use the approximate fill, which needs prompts of equal length."""
        job = Job(prompts, max_new_tokens, temperature, seed, self._fill(prompts))
        with self._lock:
            self._raise_if_dead()
            if len(self._ready) < self.tp:
                raise UserError("the workers are not ready yet (wait_ready first)")
            for rank, conn in enumerate(self._conns):
                try:
                    conn.send(job)
                except OSError:
                    self._raise_died(rank)
            return self._collect(on_tokens)

    def _fill(self, prompts) -> str:
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, list) and p for p in prompts):
            raise UserError("prompts must be a non-empty list of non-empty token lists")
        lengths = sorted({len(p) for p in prompts})
        fill = self.options.fill
        fill = fill if fill != "auto" else ("approx" if lengths[-1] >= APPROX_FROM else "prefill")
        if fill == "approx" and len(lengths) > 1:
            raise UserError(
                f"the approximate fill (--fill auto from {APPROX_FROM} prompt tokens on) needs prompts of "
                f"equal length, got lengths {lengths[0]}..{lengths[-1]}: send them in separate batches"
            )
        return fill

    def _collect(self, on_tokens) -> dict:
        """Messages of one job until every rank is done; step tokens go to on_tokens."""
        done: dict[int, Done] = {}
        errors: dict[int, Failed] = {}
        first_error = None
        callback_error = None
        while len(done) + len(errors) < self.tp:
            wait = None if first_error is None else max(0.0, first_error + ERROR_GRACE_S - time.monotonic())
            got = self._receive(wait)
            if not got and first_error is not None:
                break  # a rank raised and another did not: it may be waiting in a collective
            for rank, message in got:
                if isinstance(message, Step) and callback_error is None:
                    try:
                        on_tokens(message.tokens)
                    except Exception as exc:  # keep reading the job's messages, then re-raise
                        callback_error = exc
                elif isinstance(message, Done):
                    done[rank] = message
                elif isinstance(message, Failed):
                    errors[rank] = message
                    first_error = first_error or time.monotonic()
                    if not message.usable:  # it had entered a collective: its peers are stuck
                        self._rank_failed(rank, message, during="generation")
        if errors:
            rank = min(errors)
            if len(errors) < self.tp or not all(m.usable for m in errors.values()):
                self._rank_failed(rank, errors[rank], during="generation")
            raise _error(errors[rank])
        if callback_error is not None:
            raise callback_error
        steps = {rank: message.steps for rank, message in sorted(done.items()) if message.steps is not None}
        return {**done[0].summary, "rank_steps": steps}

    # --- messages and failures --------------------------------------------------------------------

    def _receive(self, timeout: float | None) -> list[tuple[int, Ready | Step | Done | Failed]]:
        """(rank, message) for each message that arrives within `timeout`; RankDied when a rank's
        pipe closes (its process ended)."""
        try:
            ready = connection.wait(self._conns, timeout)
        except (OSError, ValueError):  # closed under us by close()
            raise self._dead_as(self._dead or "the workers were closed") from None
        got = []
        for conn in ready:
            rank = self._conns.index(conn)
            try:
                got.append((rank, conn.recv()))
            except (EOFError, OSError):
                self._raise_died(rank)
        return got

    def _death(self, rank: int) -> str:
        proc = self._procs[rank]
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its pipe closed but it lingers
            proc.kill()
            code = proc.wait()
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        return f"rank {rank} (pid {proc.pid}) died: {how}"

    def _raise_died(self, rank: int):
        self._fail(self._death(rank), RankDied)
        raise self._dead_as(self._dead)

    def _rank_failed(self, rank: int, message: Failed, *, during: str):
        """A rank's error left the group unusable: record it, stop every rank, raise it. When a
        peer was killed (the error is then only its echo: a collective lost that peer), the peer's
        death is what is raised."""
        deadline = time.monotonic() + (0.0 if message.user else PEER_DEATH_S)  # a UserError is never an echo
        while True:
            killed = [r for r, p in enumerate(self._procs) if r != rank and (p.poll() or 0) < 0]
            if killed:
                self._raise_died(killed[0])
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        pid = self._procs[rank].pid
        self._fail(
            f"rank {rank} (pid {pid}) failed during {during}: {message.text}", UserError if message.user else RankError
        )
        raise _error(message, f"rank {rank} (pid {pid}): ")

    def _fail(self, reason: str, kind: type[Exception], *, kill: bool = True) -> None:
        with self._fail_lock:
            if self._dead is None:
                self._dead, self._dead_as = reason, kind
        if kill:
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
            for proc in self._procs:
                proc.wait()

    def _raise_if_dead(self) -> None:
        if self.dead is not None:
            raise self._dead_as(self._dead)


def _error(message: Failed, prefix: str = "") -> Exception:
    """The parent's exception for a rank's Failed message."""
    if message.user:
        return UserError(prefix + message.text)
    return RankError(f"{prefix}{message.text}\n{message.trace}".rstrip())


def _terminate(procs: list[subprocess.Popen], grace: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time or otherwise unnamed signal
        return f"signal {number}"


def _threads() -> int:
    """The CPU threads the ranks share: OMP_NUM_THREADS when set (perfkit sets it for every replicate
    of a probe, so a server the probe starts uses the same count), else this process's CPUs."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else len(os.sched_getaffinity(0))
