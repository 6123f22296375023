"""Spans: named, nested timings that cost nothing when profiling is off.

    with span("prepare_for_verify"): ...
    @timed("tree_build") def build(...): ...

Profiling is on when `PERFKIT_PROFILE=1` (read once, at import), after `set_enabled(True)`, or
inside `capture()`. When off, `span` returns one shared do-nothing context manager and
`timed` returns the function itself, so instrumented code pays a global lookup and nothing else.

When on, every name keeps an aggregate (n, mean, p50, p99, last, total) in constant time and
memory: count, total and last exact, the quantiles within 1% (`perfkit.sketch.QuantileSketch`).
Every line (`proflines.format_line`) names the process (`pid=`) and its `rank=` once known
(torch.distributed's, kept once seen, else $RANK), so logs of many workers merge (`perfkit prof`,
`perfkit.record_profile_lines`). While profiling is on (not merely inside `capture()`, which
collects quietly), a line is logged every `log_every` calls (`PERFKIT_PROFILE_EVERY`, default
50), and `flush()` and interpreter exit print every name: a function called 40 times still reports.

A process that never exits (a server) reports every S seconds with `PERFKIT_PROFILE_INTERVAL=S`
(or `set_interval(S)`), and at once on SIGUSR1 when `PERFKIT_PROFILE` is set in its environment
(the handler chains any previous one). Lines are cumulative, so a window is the difference of
two reports; a report is one write, so processes sharing a log never split each other's lines.

On CUDA (when torch has initialised CUDA), a span records a pair of CUDA events instead of reading
the host clock, and the events are resolved later (at a log line only those already complete, at
`flush()` or at the end of `capture()` all of them), so there is no device synchronisation per
call. Each span is also an NVTX range (`nsys profile` shows the phases by name) and, while a
torch.profiler session runs, a `record_function` annotation (one check when none runs).

A step's phases are the spans that run directly inside a `step` span, whatever their names
(`capture().steps()`); the bundled engine's PHASES only fix the order they are shown in.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time

from perfkit import environment
from perfkit.phases import PHASES, STEP, UNATTRIBUTED
from perfkit.probe import proflines, reports
from perfkit.probe.aggregate import FOLD_EVERY, Series
from perfkit.probe.proflines import SpanStats

__all__ = ["span", "timed", "capture", "enabled", "set_enabled", "set_log_every", "set_interval", "flush"]
__all__ += ["report", "stats", "reset", "Capture", "SpanStats"]

_INTERVAL = "PERFKIT_PROFILE_INTERVAL"  # seconds between reports of every name (a process that never exits)

_enabled_by_env = os.environ.get("PERFKIT_PROFILE", "").strip().lower() in ("1", "true", "yes", "on")
_forced = False  # set_enabled(True)
_captures: list[Capture] = []  # active capture() blocks, innermost last
_log_every = environment.count_or_default("PERFKIT_PROFILE_EVERY", 50)
_stream = sys.stderr  # where log lines go; tests may swap it via set_log_every(stream=...)
_lock = threading.Lock()  # one resolver of CUDA events and reader of a CUDA series at a time
_active = _enabled_by_env


def _refresh() -> None:
    global _active
    _active = _enabled_by_env or _forced or bool(_captures)


def enabled() -> bool:
    """Whether spans are being recorded right now."""
    return _active


def set_enabled(on: bool) -> None:
    """Turn profiling on or off from code (`PERFKIT_PROFILE` still wins when set)."""
    global _forced
    _forced = bool(on)
    _refresh()


def set_log_every(n: int, *, stream=None) -> None:
    """Log a line for a name every `n` calls; optionally send lines to `stream`."""
    global _log_every, _stream
    if n < 1:
        raise ValueError(f"log_every must be >= 1, got {n}")
    _log_every = n
    if stream is not None:
        _stream = stream


# --- aggregates ---------------------------------------------------------------------------------


_series: dict[str, Series] = {}


def _series_for(name: str) -> Series:
    s = _series.get(name)
    if s is None:
        s = _series[name] = Series()
    return s


def _lines(*, wait: bool) -> dict[str, SpanStats]:
    out = {}
    for name in sorted(_series):
        series = _series[name]
        with _lock:
            if series.pending:
                series.resolve(wait=wait)
            st = series.stats(name)
        if st is not None:
            out[name] = st
    return out


def _write(lines) -> None:
    text = "".join(line + "\n" for line in lines)
    if text:
        _stream.write(text)  # one write: another process's output cannot land inside a report
        _stream.flush()


def stats() -> dict[str, SpanStats]:
    """Aggregates of every name seen so far, resolving all pending CUDA events."""
    return _lines(wait=True)


def flush() -> dict[str, SpanStats]:
    """Resolve pending device timings and print one summary line per name; returns the aggregates."""
    result = stats()
    _write(st.line() for st in result.values())
    return result


def report() -> dict[str, SpanStats]:
    """Print every name's cumulative line now, in one write; the periodic thread and SIGUSR1 call this.

    Only CUDA events already complete are resolved (as for the every-`log_every` line): no sync.
    """
    result = _lines(wait=False)
    _write(st.line() for st in result.values())
    return result


def reset() -> None:
    """Forget every aggregate (captures in progress keep their own samples)."""
    _series.clear()


@atexit.register
def _flush_at_exit() -> None:
    if _series and (_enabled_by_env or _forced):
        try:
            flush()
        except Exception as exc:  # the interpreter is going away; say why, never raise here
            print(f"{proflines.PREFIX}] summary at exit failed: {exc!r}", file=sys.stderr)


# --- reports of a process that never exits (the thread: reports.Reporter) ------------------------

_reporter = reports.Reporter(report, lambda: _enabled_by_env or _forced, reports.seconds_env(_INTERVAL))
if _enabled_by_env:
    _reporter.install_signal()  # SIGUSR1: only in a process that asked for profiling by its environment


def set_interval(seconds: float | None) -> None:
    """Print every name's line every `seconds` from a daemon thread (PERFKIT_PROFILE_INTERVAL); None stops."""
    _reporter.set_interval(seconds)


# --- CUDA detection ------------------------------------------------------------------------------


_cuda_available: bool | None = None  # asked once per process: is_available() costs ~0.6 us a call


def _cuda():
    """torch.cuda when CUDA timing applies (torch imported and CUDA initialised), else None."""
    global _cuda_available
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if _cuda_available is None:
        try:
            _cuda_available = bool(torch.cuda.is_available())
        except Exception:  # a broken driver means host timing, not a crash in the engine
            _cuda_available = False
    if _cuda_available and torch.cuda.is_initialized():
        return torch.cuda
    return None


# --- the span itself -----------------------------------------------------------------------------


_NULL = contextlib.nullcontext()  # the span while profiling is off: does nothing, shared by every call
_modules = sys.modules
_clock = time.perf_counter


class _Slot:
    """Where a span's duration lands in a capture once it is known (CUDA: later)."""

    __slots__ = ("record", "key")

    def __init__(self, record: dict, key: str):
        self.record = record
        self.key = key

    def set(self, seconds: float) -> None:
        self.record[self.key] = self.record.get(self.key, 0.0) + seconds


_profiler_check: tuple = (None, None)  # (the torch module, its profiler-enabled check), found once


def _profiler_find(torch):
    """torch's own check whether a torch.profiler (or autograd profiler) session is recording, found once."""
    global _profiler_check
    autograd = getattr(getattr(torch, "_C", None), "_autograd", None)
    # a torch without the check: never annotate, never crash
    _profiler_check = (torch, getattr(autograd, "_profiler_enabled", None) or (lambda: False))
    return _profiler_check[1]


class _Span:
    """One timed block. The plain path (host timing: no capture open, no CUDA, no torch profiler recording)
    is two clock reads, an append and three checks; anything else takes the traced path. `perfkit
    overhead` prints what each costs per call."""

    __slots__ = ("name", "series", "t0", "plain", "cuda", "start_event", "sinks", "annotation")

    def __init__(self, name: str, series: Series):
        self.name = name
        self.series = series

    def __enter__(self):
        torch = _modules.get("torch")
        if _captures or (
            torch is not None
            and (
                _cuda_available is not False  # not yet asked, or a CUDA machine: the traced path decides
                or (_profiler_check[1] if _profiler_check[0] is torch else _profiler_find(torch))()
            )
        ):
            return self._enter_traced(torch)
        self.plain = True
        self.t0 = _clock()
        return self

    def __exit__(self, kind, value, tb):
        if not self.plain:
            return self._exit_traced()
        seconds = _clock() - self.t0
        series = self.series
        series.calls += 1
        host = series.host
        host.append(seconds)
        if len(host) >= FOLD_EVERY:
            with _lock:
                series.fold()
        if series.calls - series.logged_at >= _log_every and (_enabled_by_env or _forced):
            self._log()
        series.idle.append(self)  # done: the next span of this name may use it
        return False

    def _enter_traced(self, torch):
        self.plain = False
        self.cuda = None if _cuda_available is False else _cuda()  # a machine without CUDA asks once
        self.annotation = None
        self.sinks = [c._open(self.name) for c in _captures] if _captures else ()
        if torch is not None:  # without torch no profiler can be recording
            check = _profiler_check[1] if _profiler_check[0] is torch else _profiler_find(torch)
            if check():
                self.annotation = torch.autograd.profiler.record_function(self.name)
                self.annotation.__enter__()
        cuda = self.cuda
        if cuda is None:
            self.t0 = _clock()
            return self
        cuda.nvtx.range_push(self.name)
        self.start_event = cuda.Event(enable_timing=True)
        self.start_event.record()
        return self

    def _exit_traced(self):
        cuda = self.cuda
        if cuda is None:
            seconds = _clock() - self.t0
        series = self.series
        series.calls += 1
        if cuda is None:
            host = series.host
            host.append(seconds)
            if len(host) >= FOLD_EVERY:
                with _lock:
                    series.fold()
            for sink in self.sinks:
                if sink is not None:
                    sink.set(seconds)
        else:
            end = cuda.Event(enable_timing=True)
            end.record()
            cuda.nvtx.range_pop()
            series.pending.append((self.start_event, end, [s for s in self.sinks if s is not None]))
        if self.annotation is not None:
            self.annotation.__exit__(None, None, None)
        if _captures:
            for c in _captures:
                c._close(self.name)
        if series.calls - series.logged_at >= _log_every and (_enabled_by_env or _forced):
            self._log()
        series.idle.append(self)
        return False

    def _log(self) -> None:
        """The name's log line, every _log_every calls."""
        series = self.series
        series.logged_at = series.calls
        with _lock:
            if series.pending:
                series.resolve(wait=False)
            st = series.stats(self.name)
        if st is not None:
            _write((st.line(),))


def span(name: str):
    """Time the enclosed block under `name` when profiling is on; do nothing otherwise."""
    if not _active:
        return _NULL
    series = _series.get(name) or _series_for(name)
    idle = series.idle
    return idle.pop() if idle else _Span(name, series)  # one per block in flight: nesting and threads each get theirs


def timed(name: str | None = None):
    """Decorator form of `span`: the call is timed whenever profiling is on at call time.

    Off (no PERFKIT_PROFILE, no set_enabled, no capture running), the wrapper calls `fn` straight
    away, at the cost of one extra call and one check; so a function decorated while profiling was
    off is still timed inside a later `capture()`.
    """

    def decorate(fn):
        label = name or fn.__qualname__

        def wrapper(*args, **kwargs):
            if not _active:
                return fn(*args, **kwargs)
            with span(label):
                return fn(*args, **kwargs)

        return functools.update_wrapper(wrapper, fn)

    return decorate


# --- capture -------------------------------------------------------------------------------------


class Capture:
    """Every span that ran inside a `capture()` block, with decode steps grouped.

    `samples(name)` gives one duration per occurrence; `steps()` one dict per step span with
    the step's duration, the time of each span that ran directly inside it (by name, whatever the
    name: a nested span's time is part of its parent's) and the unattributed remainder.
    `phases` declares the order names are shown in (default: the bundled engine's PHASES); names
    not declared follow, in the order first seen.
    """

    def __init__(self, phases: tuple[str, ...] | list[str] | None = None, step: str = STEP) -> None:
        self.phases, self.step = tuple(PHASES if phases is None else phases), step  # step: the outer span's name
        self._occurrences: dict[str, list[dict]] = {}
        self._steps: list[dict] = []
        self._stack: list[str] = []  # names of the spans open inside this capture, innermost last
        self._seen: dict[str, None] = {}  # direct children of a step, in the order first seen

    # called by spans while the capture is active
    def _open(self, name: str):
        record: dict = {}
        self._occurrences.setdefault(name, []).append(record)
        parent = self._stack[-1] if self._stack else None
        depth = self._stack.count(self.step)
        self._stack.append(name)
        if name == self.step and depth == 0:
            self._steps.append({"__step__": record})
            return _Slot(record, "seconds")
        if parent == self.step and depth == 1 and name not in (self.step, UNATTRIBUTED):
            self._seen.setdefault(name, None)
            return _Multi(_Slot(record, "seconds"), _Slot(self._steps[-1], name))
        return _Slot(record, "seconds")

    def _close(self, name: str) -> None:
        if self._stack and self._stack[-1] == name:
            self._stack.pop()

    def _finish(self) -> None:
        for series in list(_series.values()):
            with _lock:
                series.resolve(wait=True)

    def names(self) -> list[str]:
        return sorted(self._occurrences)

    def samples(self, name: str) -> list[float]:
        """Seconds, one per occurrence of `name` in the block."""
        return [r["seconds"] for r in self._occurrences.get(name, []) if "seconds" in r]

    def phase_names(self) -> list[str]:
        """A step's phases: every declared one (when any ran) in their order, then the others as first seen.

        A declared phase that did not run in a step reads 0 there, so an engine's breakdown always has
        the same columns; names of another engine's spans are phases as soon as they run in a step.
        """
        declared = list(self.phases) if any(p in self._seen for p in self.phases) else []
        return declared + [p for p in self._seen if p not in self.phases]

    def steps(self) -> list[dict[str, float]]:
        """One dict per step: `step`, each phase seen in any step (0.0 where absent), `unattributed`."""
        seen = self.phase_names()
        out = []
        for s in self._steps:
            total = s["__step__"].get("seconds")
            if total is None:
                continue
            row = {STEP: total}
            for p in seen:
                row[p] = s.get(p, 0.0)
            row[UNATTRIBUTED] = total - sum(row[p] for p in seen)
            out.append(row)
        return out


class _Multi:
    __slots__ = ("slots",)

    def __init__(self, *slots):
        self.slots = slots

    def set(self, seconds: float) -> None:
        for s in self.slots:
            s.set(seconds)


class capture:  # noqa: N801 - used as a context manager, reads like a function
    """Record every span inside the block, whatever `PERFKIT_PROFILE` says.

    `capture(phases=("schedule", "forward"))` declares the order a step's phases are shown in;
    `capture(step="decode_step")` takes another outer span for a step (its rows still say `step`).
    """

    def __init__(self, phases: tuple[str, ...] | list[str] | None = None, step: str = STEP) -> None:
        if not isinstance(step, str) or not step.strip():
            raise ValueError(f"capture(step=...) names a span, got {step!r}")
        self._phases, self._step = phases, step

    def __enter__(self) -> Capture:
        self._cap = Capture(self._phases, self._step)
        _captures.append(self._cap)
        _refresh()
        return self._cap

    def __exit__(self, *exc):
        _captures.remove(self._cap)
        _refresh()
        self._cap._finish()
        return False
