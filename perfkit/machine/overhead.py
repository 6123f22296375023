"""`perfkit overhead`: what instrumentation costs per call, measured side by side in one run.

Prints, for a trivial function: the bare call, `@timed` off and on, a `with span()` block off and
on, the same span after 10^3 and after 10^6 earlier calls of its name (a span's cost must not
grow with its history), with its periodic log line on, and beside them torch.profiler's
`record_function` and, on CUDA, an NVTX range; each as nanoseconds per call with a 95% interval
and the difference to the bare call. A profiler that moves the number it measures is worse than
none; this says by how much. `--serving [URL]` measures instead what perfkit.serving's client
costs per streamed frame, beside a bare aiohttp loop reading the same streams.
"""

from __future__ import annotations

import argparse

from perfkit import stats
from perfkit.probe import spans
from perfkit.probe.timing import bench


def _work(x: int = 1) -> int:
    return x + 1


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _others() -> list[tuple[str, object]]:
    """torch's own annotations, for comparison: record_function, and an NVTX range on CUDA."""
    try:
        import torch
    except ImportError:
        return []
    out = []

    def record_function():
        with torch.autograd.profiler.record_function("overhead.rf"):
            _work()

    out.append(("torch record_function (no profiler)", record_function))
    if torch.cuda.is_available():

        def nvtx():
            torch.cuda.nvtx.range_push("overhead.nvtx")
            _work()
            torch.cuda.nvtx.range_pop()

        out.append(("torch NVTX range", nvtx))
    return out


def measure(*, calls: int = 20_000, repeat: int = 15, history: int = 10**6) -> list[tuple[str, list[float]]]:
    """(label, nanoseconds per call samples) for each variant, interleaved round by round.

    `history`: earlier calls of the long-lived span's name before it is measured (10^6 by default).
    """
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

    def named(name):
        def block():
            with spans.span(name):
                _work()

        return block

    spans.set_enabled(True)
    for name, earlier in (("overhead.after_1e3", 1_000), ("overhead.after_history", history)):
        for _ in range(earlier):  # the history a long-running engine builds up
            with spans.span(name):
                pass
    spans.set_enabled(False)
    stream = spans._stream
    logged = "span on, log line every 50"  # the same span with its line every 50 calls, written to nowhere

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
        ("span on, after 10^3 calls", named("overhead.after_1e3")),
        (f"span on, after {history:.0e} calls".replace("e+0", "e"), named("overhead.after_history")),
        (logged, named("overhead.logged")),
        *_others(),
    ]
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    try:
        for _ in range(repeat):  # interleave so that drift on a busy machine hits every variant
            for label, fn in variants:
                if label.endswith("profiling on") or label.startswith("span on"):
                    spans.set_enabled(True)
                if label == logged:  # around the timed calls, not inside each: the switch is not the span's cost
                    spans.set_log_every(50, stream=_Discard())
                try:
                    (s,) = bench(fn, warmup=1, repeat=1, inner=calls, sync="none")
                finally:
                    spans.set_enabled(False)
                    spans.set_log_every(10**12, stream=stream)
                samples[label].append(s * 1e9)
    finally:
        spans.set_log_every(every)
        spans.set_enabled(was)
        spans.reset()
    return [(label, samples[label]) for label, _ in variants]


def report(rows: list[tuple[str, list[float]]]) -> str:
    base = stats.mean_interval(rows[0][1])
    lines = [f"{'variant':<36} {'ns/call':>9} {'95% interval':>17} {'vs bare':>9}"]
    for label, values in rows:
        est = stats.mean_interval(values)
        lines.append(
            f"{label:<36} {est.value:>9.1f} [{est.low:>6.1f}, {est.high:>6.1f}] {est.value - base.value:>+8.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="perfkit overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per sample (default 20000)")
    parser.add_argument("--repeat", type=int, default=15, help="samples per variant (default 15)")
    parser.add_argument(
        "--history", type=int, default=10**6, help="earlier calls of the long-lived span (default 10^6)"
    )
    parser.add_argument(
        "--serving",
        nargs="?",
        const="start",
        metavar="URL",
        help="instead: perfkit.serving's cost per streamed frame beside a bare aiohttp read, against URL "
        "(or, without one, a `perfkit engine serve --tp 1 --chunk token` started for the measurement)",
    )
    parser.add_argument("--requests", type=int, default=8, help="with --serving: requests per reader (default 8)")
    args = parser.parse_args(argv)
    if args.serving is not None:
        print(serving_report(args.serving, requests=args.requests))
        return 0
    print(report(measure(calls=args.calls, repeat=args.repeat, history=args.history)))
    return 0


def serving_report(url: str, *, requests: int) -> str:
    """The client's own cost per streamed frame: perfkit.serving.overhead against `url`, or a server started here."""
    from perfkit.probe import serving

    if url != "start":
        return serving.overhead(url, requests=requests)["text"]
    with serving.Server(serving.EngineOptions(preset="tiny-random"), args=("--chunk", "token")) as server:
        return serving.overhead(server.url, requests=requests, gen=128)["text"]
