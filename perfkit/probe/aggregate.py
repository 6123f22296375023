"""One span name's aggregate in constant memory: its host durations, folded in batches into a quantile
sketch, and the CUDA event pairs still waiting on the device (spans.py keeps one per name)."""

from __future__ import annotations

import time
from collections import deque

from perfkit.probe.proflines import SpanStats
from perfkit.sketch import QuantileSketch

#: host durations kept raw before they are folded into the sketch (the memory stays constant, 4096 floats a
#: name): a fold's fixed cost shared by more calls (about 50 ns a call at 4096, 160 at 256)
FOLD_EVERY = 4096


class Series:
    """The aggregate of one name (constant size), plus CUDA events still waiting on the device.

    A host duration is appended to `host` (a deque: appends from any thread, drained from the left, lose
    nothing) and folded into the sketch FOLD_EVERY at a time, in one vectorized pass: a span's own cost
    is then two clock reads and an append, not a logarithm and a dictionary update per call."""

    __slots__ = ("sketch", "pending", "calls", "logged_at", "host", "idle")

    def __init__(self) -> None:
        self.sketch = QuantileSketch()
        self.pending: deque[tuple] = deque()  # (start_event, end_event, sinks), oldest first
        self.host: deque[float] = deque()  # host durations not folded yet, oldest first
        self.idle: list = []  # spans.py's span objects of this name not in use: reused rather than made anew
        self.calls = 0
        self.logged_at = 0

    def fold(self) -> None:
        """Fold the host durations taken so far into the sketch (hold the spans' lock)."""
        host = self.host
        self.sketch.add_many([host.popleft() for _ in range(len(host))])

    def stats(self, name: str) -> SpanStats | None:
        """The aggregate, read consistently even while another thread adds to it (a report's thread)."""
        self.fold()
        k = self.sketch
        for _ in range(1000):
            n = k.n
            counted = k.zeros + sum(k.buckets.values())  # an add() updates n first and its bucket last
            total, last = k.total, k.last
            p50, p99 = k.quantiles(0.5, 0.99)
            if n == counted == k.n:
                break
            time.sleep(0)  # caught in the middle of an add(): let it finish
        if not n:
            return None
        return SpanStats(name=name, n=n, mean=total / n, p50=p50, p99=p99, last=last, total=total)

    def resolve(self, *, wait: bool) -> None:
        """Turn finished CUDA event pairs into durations, oldest first (all of them when `wait`); hold the
        spans' lock."""
        pending = self.pending
        while pending:
            if not wait and not pending[0][1].query():
                break
            start, end, sinks = pending.popleft()  # spans append on the right meanwhile: nothing is lost
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            self.sketch.add(seconds)
            for sink in sinks:
                sink.set(seconds)
