"""`perfkit overhead`: what instrumentation costs per call, measured side by side in one run.

Prints, for a trivial function: the bare call, the function decorated with `@timed` while profiling
is off (the function itself, by construction), `@timed` while profiling is on, and a `with span()`
block on and off, each as nanoseconds per call with a 95% interval and the difference to the bare
call. A profiler that moves the number it measures is worse than none; this says by how much.
"""

from __future__ import annotations

import argparse

from perfkit import stats
from perfkit.probe import spans
from perfkit.probe.timing import bench


def _work(x: int = 1) -> int:
    return x + 1


def measure(*, calls: int = 20_000, repeat: int = 15) -> list[tuple[str, list[float]]]:
    """(label, nanoseconds per call samples) for each variant, interleaved round by round."""
    was = spans.enabled()
    spans.set_enabled(False)
    off = spans.timed("overhead.timed")(_work)
    spans.set_enabled(True)
    on = spans.timed("overhead.timed")(_work)
    spans.set_enabled(False)
    every = spans._log_every
    spans.set_log_every(10**12)  # the periodic log line is not the cost per call

    def span_block():
        with spans.span("overhead.span"):
            _work()

    def enabled(fn):
        def run():
            spans.set_enabled(True)
            try:
                fn()
            finally:
                spans.set_enabled(False)

        return run

    variants = [
        ("bare call", _work),
        ("@timed, profiling off", off),
        ("@timed, profiling on", on),
        ("with span(), profiling off", span_block),
        ("with span(), profiling on", span_block),
    ]
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    try:
        for _ in range(repeat):  # interleave so that drift on a busy machine hits every variant
            for label, fn in variants:
                if label.endswith("profiling on"):
                    spans.set_enabled(True)
                try:
                    (s,) = bench(fn, warmup=1, repeat=1, inner=calls, sync="none")
                finally:
                    spans.set_enabled(False)
                samples[label].append(s * 1e9)
    finally:
        spans.set_log_every(every)
        spans.set_enabled(was)
        spans.reset()
    return [(label, samples[label]) for label, _ in variants]


def report(rows: list[tuple[str, list[float]]]) -> str:
    base = stats.mean_interval(rows[0][1])
    lines = [f"{'variant':<28} {'ns/call':>9} {'95% interval':>17} {'vs bare':>9}"]
    for label, values in rows:
        est = stats.mean_interval(values)
        lines.append(
            f"{label:<28} {est.value:>9.1f} [{est.low:>6.1f}, {est.high:>6.1f}] {est.value - base.value:>+8.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="perfkit overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per sample (default 20000)")
    parser.add_argument("--repeat", type=int, default=15, help="samples per variant (default 15)")
    args = parser.parse_args(argv)
    print(report(measure(calls=args.calls, repeat=args.repeat)))
    return 0
