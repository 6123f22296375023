"""How fast this machine does a fixed piece of work now: the yardstick a run's costs are carried by.

A run plans its first round from what its probes cost in earlier runs (experiment/priors.py). Those
seconds were measured on the machine as it was that day: a shared host that ran 5x slower then (other
tenants, a lower clock) makes every stored cost 5x too dear today, and the plan leaves out work that
would fit. Each run times the same pure-Python work when it starts (about 50 ms) and records it; a
later run scales a stored cost by the ratio of its own time to the stored one. Pure Python, one
thread: like starting a kernel and importing a probe's modules, which is most of a short replicate.
"""

from __future__ import annotations

import time

WORK = 50_000  # iterations of the loop below: about 10 ms on a 2020s server core
REPEAT = 5


def _work(n: int) -> int:
    table: dict[int, int] = {}
    total = 0
    for i in range(n):
        table[i & 1023] = i
        total += table[(i * 7) & 1023] if (i * 7) & 1023 in table else i
    return total


def pace_s(*, work: int = WORK, repeat: int = REPEAT) -> float:
    """Seconds the fixed work takes now: the median of `repeat` timings (one catching a stranger's burst
    of load does not move it)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        _work(work)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def scale(now_s: float | None, then_s: float | None) -> float:
    """What a cost measured when the yardstick took `then_s` costs now that it takes `now_s` (1 when either
    is unknown: a run from before runs were timed against it, or one that could not time it)."""
    if not now_s or not then_s or now_s <= 0 or then_s <= 0:
        return 1.0
    return now_s / then_s
