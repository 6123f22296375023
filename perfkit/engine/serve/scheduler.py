"""The queue of `perfkit engine serve`: requests wait here, and one thread batches them into generations.

Requests queue; a thread runs one Workers.generate at a time over up to --max-batch queued requests
that can share it (equal max_tokens; prompts of APPROX_FROM tokens or more of equal length), waiting
up to --batch-wait-ms for more. A sampled request runs alone (the engine keys its noise on the batch
slot). Each job's tokens, its end or its error reach the request's event loop as events, and each
job's times go to the server's metrics (perfkit.engine.serve.metrics) as they happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

from perfkit.engine.serve.api import Failure
from perfkit.engine.serve.metrics import RequestClock, ServerMetrics
from perfkit.engine.serve.workers import RankError, Workers
from perfkit.engineoptions import APPROX_FROM
from perfkit.errors import UserError

__all__ = ["Job", "Scheduler"]


class Job:
    """One request's generation; its events ("tokens", ids) ... ("done",) or ("error", status, text)
    arrive on `events` in the event loop's thread."""

    def __init__(self, tokens: list[int], max_tokens: int, temperature: float, seed: int, clock: RequestClock):
        self.tokens, self.max_tokens, self.temperature, self.seed = tokens, max_tokens, temperature, seed
        self.clock = clock  # GET /metrics' times of this request, kept in the scheduler's thread
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

    def key(self) -> tuple:
        """Requests with equal keys can share one Engine.generate."""
        long = len(self.tokens) if len(self.tokens) >= APPROX_FROM else 0
        return self.max_tokens, long, id(self) if self.temperature > 0 else 0

    def send(self, event: tuple) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Scheduler:
    """Queued jobs, batched and run one generate at a time in a thread of its own."""

    def __init__(self, workers: Workers, *, max_batch: int, wait_s: float):
        self.workers, self.max_batch, self.wait_s = workers, max_batch, wait_s
        self.metrics: ServerMetrics | None = None  # set by State once the model's name is known
        self.running = 0  # requests in the batch being generated (GET /metrics)
        self.queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopped: str | None = None
        self.counts = {"batches": 0, "requests": 0, "largest_batch": 0}  # what GET /stats shows
        self.thread = threading.Thread(target=self._run, name="perfkit-scheduler", daemon=True)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopped is not None:
                raise Failure(503, self._stopped)
            self.queue.append(job)
            self._cond.notify_all()

    def stop(self, reason: str) -> None:
        """Refuse new jobs and fail the queued ones with 503."""
        with self._cond:
            self._stopped = self._stopped or reason
            queued = list(self.queue)
            self.queue.clear()
            self._cond.notify_all()
        for job in queued:
            job.send(("error", 503, reason))

    def _take(self) -> list[Job]:
        """The next batch: the oldest job and those that can join it, after waiting up to wait_s for more."""
        with self._cond:
            while not self.queue and self._stopped is None:
                self._cond.wait()
            if self._stopped is not None:
                return []
            key = self.queue[0].key()
            deadline = time.monotonic() + self.wait_s
            while True:
                batch = [job for job in self.queue if job.key() == key][: self.max_batch]
                left = deadline - time.monotonic()
                if len(batch) >= self.max_batch or left <= 0 or self._stopped is not None:
                    break
                self._cond.wait(left)
            for job in batch:
                self.queue.remove(job)
            return batch

    def _run(self) -> None:
        while batch := self._take():
            self._generate(batch)

    def _generate(self, batch: list[Job]) -> None:  # the events of its jobs, whatever happens
        def on_tokens(step: list[list[int]]) -> None:
            for job, tokens in zip(batch, step):
                if tokens:
                    job.clock.tokens(len(tokens))
                    job.send(("tokens", tokens))

        first, counts = batch[0], self.counts
        counts.update(batches=counts["batches"] + 1, requests=counts["requests"] + len(batch))
        counts["largest_batch"] = max(counts["largest_batch"], len(batch))
        prompts, options = [job.tokens for job in batch], dict(temperature=first.temperature, seed=first.seed)
        self.running = len(batch)
        try:
            summary = self.workers.generate(prompts, max_new_tokens=first.max_tokens, on_tokens=on_tokens, **options)
            if self.metrics is not None:
                self.metrics.generated(summary)
            event = ("done",)
        except UserError as exc:  # the request's fault, unless it broke the workers
            event = ("error", 503 if self.workers.dead else 400, str(exc))
        except RankError as exc:
            event = ("error", 503, str(exc).splitlines()[0])
        except Exception as exc:
            event = ("error", 500, f"{type(exc).__name__}: {exc}")
        self.running = 0
        for job in batch:
            job.clock.finished(event[0] == "done", len(job.tokens))
            job.send(event)
