"""The words a verdict is written in: the verdicts, what was measured (and a floor), a point of evidence, a judgement.

Confirmed only when the whole interval (95%, or the replicate policy's level when a run looks more
than once) satisfies the claim, refuted only when the whole interval violates it; everything else
is inconclusive with the reason, and missing, too few or NaN samples are always inconclusive,
loudly. A failed probe is an error naming the cell. The kinds (perfkit/experiment/records/kinds/) judge in
these words; perfkit/experiment/run/judging.py turns a hypothesis's executions into one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perfkit import units


@dataclass(frozen=True)
class Measured:
    """The quantity a verdict compares: a metric's mean, a share, an exponent or a speedup."""

    label: str
    unit: str | None
    value: float
    low: float
    high: float
    replicates: int | None = None  # processes the interval rests on (format 3 on)
    samples: int | None = None  # samples in all
    between: float | None = None  # share of the variance between processes (None: one process)
    confidence: float | None = (
        None  # of the interval: 0.95, or less than 5% left per look when the run added replicates
    )
    spread: float | None = None  # standard deviation of its unit estimates (log scale when `log`; format 9 on)
    log: bool | None = None  # the interval was taken on the log scale
    machines: int | None = None  # machines the interval was taken over, each one unit (None: one machine)
    between_machines: float | None = None  # the machines' own spread, as a share of the value (format 10 on)
    paired: str | None = None  # how a comparison's arms were paired: "within each process: ..." (format 12 on)

    def text(self, *, level: bool = False) -> str:
        """'0.18 ms [0.16, 0.21]', 'share 2.47% [1.05, 4.17]': the one way a measured value is written.
        `level`: with its confidence, '0.18 ms [0.16, 0.21] (95% interval)', for a line no header explains."""
        label = "" if self.label == "mean" else f"{self.label} "
        said = (
            f"{label}{units.format_quantity(self.value, self.unit)} "
            f"[{units.format_number(self.low)}, {units.format_number(self.high)}]"
        )
        return f"{said} ({self.level()} interval)" if level else said

    def level(self) -> str:
        """The interval's confidence in words: '95%', or '96%' when the run could look more than once."""
        return f"{(self.confidence if self.confidence is not None else 0.95) * 100:.3g}%"

    def evidence(self) -> str | None:
        """'3 processes x 30 samples, 12% of the variance between them': what the interval rests on."""
        if self.replicates is None:
            return None
        per = f" x {self.samples // self.replicates} samples" if self.samples else ""
        level = ""
        if self.confidence is not None and abs(self.confidence - 0.95) > 1e-9:
            level = f"; a {self.level()} interval (its look's share of the 5%: the run could look again)"
        level += f"; {self.paired}" if self.paired else ""
        if self.replicates == 1:
            return f"1 process{per}{level}"
        if self.machines and self.machines > 1:
            apart = ""
            if self.between_machines is not None:
                apart = f", the machines {units.format_number(100 * self.between_machines)}% apart (sd)"
            return f"{self.replicates} processes{per} on {self.machines} machines{apart}{level}"
        between = f", {self.between:.0%} of the variance between them" if self.between is not None else ""
        return f"{self.replicates} processes{per}{between}{level}"


@dataclass(frozen=True)
class Floor:
    """A recorded floor (e.g. a roofline figure) that an expectation was measured against."""

    metric: str
    value: float
    unit: str
    note: str | None = None
    low: float | None = None  # its interval when it was measured in each replicate (format 7 on)
    high: float | None = None
    replicates: int | None = None

    def text(self) -> str:
        """'27 ms [26, 28]' when measured with an interval; '27 ms' for an exact figure or an older record."""
        value = units.format_quantity(self.value, self.unit)
        if self.low is None or self.high is None or self.low == self.high:
            return value
        return f"{value} [{units.format_number(self.low)}, {units.format_number(self.high)}]"

    def overlaps(self, other: Floor) -> bool:
        """Whether the two floors agree within their intervals (a floor without one is its own interval)."""
        scale = units.factor(other.unit, self.unit)
        low, high = (other.low, other.high) if other.low is not None and other.high is not None else (other.value,) * 2
        mine = (self.low, self.high) if self.low is not None and self.high is not None else (self.value,) * 2
        return low * scale <= mine[1] * (1 + 1e-9) and high * scale >= mine[0] * (1 - 1e-9)


#: how the reason of a verdict begins when no replicate was measured on a fit machine
UNFIT_REASON = "the machine was not fit to measure on"
#: ... and when the run's time budget left its probe unexecuted (replicates.Policy.fit)
NOT_MEASURED = "not measured"


class Verdict(StrEnum):
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


@dataclass(frozen=True)
class Point:
    """One metric where it was measured (its own `at` plus the sweep point), from every replicate.

    `replicates` holds one tuple of samples per replicate that recorded it, in replicate order,
    in `unit`; `records` counts the records merged, `duplicated` says one execution recorded the
    metric more than once at this point (which of them a claim means is then unknown).
    """

    name: str
    unit: str
    at: dict[str, Any]
    replicates: tuple[tuple[float, ...], ...]
    note: str | None = None
    breakdown: str | None = None
    records: int = 1
    duplicated: bool = False
    machines: tuple[str, ...] | None = None  # the machine each replicate ran on (None: not said, one machine)

    def where(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.at.items())) or "the only point"

    def samples(self) -> list[float]:
        """Every sample of every replicate."""
        return [s for r in self.replicates for s in r]


@dataclass(frozen=True)
class MachineMeasured:
    """One machine's own measurement, when a verdict rests on replicates of several machines."""

    machine: str  # its id (stable across runs)
    label: str  # its host and CPU, for a reader
    measured: Measured | None  # None: nothing to measure on it (its `reason` says why)
    verdict: str | None = None  # the claim judged on its replicates alone
    reason: str | None = None  # why that verdict, when it is not confirmed
    off_by: str | None = None  # how far its measurement is from the claim


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str | None
    expected: str
    measured: Measured | None = None
    off_by: str | None = None
    floor: Floor | None = None
    warnings: tuple[str, ...] = ()
    used: tuple[Point, ...] = ()  # the records the verdict was computed from (for plots, summaries)
    needed: int | None = None  # replicates that would likely decide an inconclusive verdict
    per_machine: tuple[MachineMeasured, ...] = ()  # each machine's own measurement, when there were several

    def line(self) -> str:
        """One readable line: 'measured 0.18 ms [0.16, 0.21], 1,100x below the expected 200 ms'."""
        if self.measured is None:
            return self.reason or ""
        text = f"measured {self.measured.text(level=True)}"
        if self.off_by:
            text += f", {self.off_by}"
        if self.reason:
            text += f" ({self.reason})"
        return text


class Inconclusive(Exception):
    """The evidence cannot support a verdict; the message says why (raised by the kinds' judging)."""
