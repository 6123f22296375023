"""The writing side of `[perfkit-prof]` lines over time: a live process's periodic reports.

`Reporter` is the daemon thread behind `PERFKIT_PROFILE_INTERVAL` (every name's cumulative line every
S seconds) and SIGUSR1 (one report at once); spans owns one (`perfkit.probe.spans.set_interval`).
A process that never exits, a server, reports this way; perfkit/probe/logsources.py reads the lines
back over a window.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from perfkit.probe import proflines


def seconds(value: str | None) -> float | None:
    """A positive, finite number of seconds from text, None when unset or 0; ValueError when not a number."""
    number = float(value) if value and value.strip() else 0.0
    return number if number > 0 and math.isfinite(number) else None


def seconds_env(name: str) -> float | None:
    """A positive number of seconds from the environment, or None (unset, 0, or not a number: said once)."""
    value = os.environ.get(name, "").strip()
    try:
        return seconds(value)
    except ValueError:
        print(f"{proflines.PREFIX}] ignoring {name}={value!r}: not a number of seconds", file=sys.stderr)
        return None


class Reporter:
    """A daemon thread calling `report()` every `interval` seconds, and at once when asked (SIGUSR1).

    The thread waits on an event: nothing on the timed calls' path knows it exists. `report` runs
    only while `active()` says profiling is on. After a fork the child starts its own thread.
    """

    def __init__(self, report: Callable[[], Any], active: Callable[[], bool], interval: float | None) -> None:
        self._report, self._active = report, active
        self.interval = interval
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._asked = False
        self._signal = False
        if interval is not None:
            self._start()
        os.register_at_fork(after_in_child=self._after_fork)

    def set_interval(self, seconds: float | None) -> None:
        if seconds is not None and not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"interval must be a number of seconds >= 0, got {seconds!r}")
        self.interval = float(seconds) if seconds else None
        if self.interval is not None:
            self._start()
        self._wake.set()  # wakes without asking: the thread waits again, with the new interval

    def ask(self) -> None:
        """Report now (from the thread: a signal may arrive inside a span's own bookkeeping)."""
        self._asked = True
        self._wake.set()

    def install_signal(self) -> bool:
        """Report on SIGUSR1, chaining the handler there was; from the main thread only. Whether installed."""
        if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGUSR1)

        def on_usr1(signum, frame):
            self.ask()
            if callable(previous):
                previous(signum, frame)

        try:
            signal.signal(signal.SIGUSR1, on_usr1)
        except (ValueError, OSError):  # an interpreter without signals
            return False
        self._signal = True
        self._start()  # now, not in the handler: starting a thread there could meet a lock the frame holds
        return True

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(self._wake,), name="perfkit-prof", daemon=True)
            self._thread.start()

    def _after_fork(self) -> None:
        self._thread, self._wake, self._asked = None, threading.Event(), False
        if self.interval is not None or self._signal:
            self._start()

    def _run(self, wake: threading.Event) -> None:
        while True:
            woken = wake.wait(self.interval)  # None: only when asked
            wake.clear()
            if woken and not self._asked:
                continue
            self._asked = False
            if self._active():
                try:
                    self._report()
                except Exception as exc:  # a report must never take the server down
                    print(f"{proflines.PREFIX}] report failed: {exc!r}", file=sys.stderr)
