"""Quantiles of a stream in bounded memory: what a span keeps of every duration (perfkit/probe/spans.py).

A leaf beside perfkit.stats, which holds every interval: this holds no interval, only a summary a
long-running process can afford to keep for each name it times.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from itertools import accumulate


class QuantileSketch:
    """Quantiles of a stream of positive numbers in bounded memory, each within `alpha` relative error.

    Values fall into logarithmic buckets (bucket k holds (gamma^(k-1), gamma^k], gamma =
    (1 + alpha) / (1 - alpha), the idea of DDSketch): adding is O(1), memory is one counter per
    occupied bucket (durations from 1 ns to an hour occupy at most ~1,450 at alpha = 1%), and the
    q-quantile returned is within `alpha` of the nearest-rank sample quantile, relative to it.
    Count, total and the last value are exact. Zero and negative values are counted as zeros
    (a duration cannot be negative; a clock can read 0).
    """

    __slots__ = ("alpha", "_inv_log_gamma", "_gamma", "buckets", "zeros", "n", "total", "last", "_keys")

    def __init__(self, alpha: float = 0.01):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        self.alpha = alpha
        self._gamma = (1 + alpha) / (1 - alpha)
        self._inv_log_gamma = 1.0 / math.log(self._gamma)
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.n = 0
        self.total = 0.0
        self.last = math.nan
        self._keys: list[int] = []  # the occupied buckets in order, kept as they appear (rarely, once warm)

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x
        self.last = x
        if x > 0:
            k = _ceil(_log(x) * self._inv_log_gamma)
            buckets = self.buckets
            buckets[k] = buckets.get(k, 0) + 1
        else:
            self.zeros += 1

    def add_many(self, values: list[float]) -> None:
        """`add` each of `values` in order, in one vectorized pass (a span's durations, folded in batches)."""
        if len(values) < 64:  # numpy's fixed cost is more than a few scalar adds: the loop of add(), inlined
            inv, buckets, zeros, total = self._inv_log_gamma, self.buckets, 0, 0.0
            for x in values:
                total += x
                if x > 0:
                    k = _ceil(_log(x) * inv)
                    buckets[k] = buckets.get(k, 0) + 1
                else:
                    zeros += 1
            if values:
                self.n += len(values)
                self.total += total
                self.zeros += zeros
                self.last = values[-1]
            return
        import numpy as np

        data = np.asarray(values, dtype=float)
        self.n += int(data.size)
        self.total += float(data.sum())
        self.last = float(data[-1])
        positive = data[data > 0]
        self.zeros += int(data.size - positive.size)
        if positive.size:
            ks = np.ceil(np.log(positive) * self._inv_log_gamma).astype(np.int64)
            low = int(ks.min())
            counts = np.bincount(ks - low)  # buckets are dense over a span's range: counting beats sorting
            found = np.flatnonzero(counts)
            buckets = self.buckets
            for k, c in zip((found + low).tolist(), counts[found].tolist()):
                buckets[k] = buckets.get(k, 0) + c

    def quantile(self, q: float) -> float:
        """The q-quantile (nearest rank, 0 <= q <= 1), within `alpha` of the exact one; NaN when empty."""
        return self.quantiles(q)[0]

    def quantiles(self, *qs: float) -> list[float]:
        """Several quantiles from one running count over the buckets in order (a log line asks for p50 and
        p99 together, every 50 calls of a name: no sort and no Python loop over the buckets per line)."""
        if self.n == 0:
            return [math.nan] * len(qs)
        buckets, keys = self.buckets, self._keys
        if len(keys) != len(buckets):  # buckets appeared since: put them in their places
            for k in buckets.keys() - set(keys):
                insort(keys, k)
        cumulative = list(accumulate(map(buckets.__getitem__, keys), initial=self.zeros))
        out = []
        for q in qs:
            rank = round(q * (self.n - 1))  # nearest rank, 0-based
            i = bisect_right(cumulative, rank)  # the first bucket whose running count passes the rank
            out.append(0.0 if i == 0 else 2 * self._gamma ** keys[i - 1] / (self._gamma + 1))  # within alpha of it
        return out

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan


_log, _ceil = math.log, math.ceil
