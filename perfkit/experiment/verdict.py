"""The words a verdict is written in: the verdicts, a point of evidence, a judgement.

Confirmed only when the whole interval (95%, or the replicate policy's level when a run looks more
than once) satisfies the claim, refuted only when the whole interval violates it; everything else
is inconclusive with the reason, and missing, too few or NaN samples are always inconclusive,
loudly. A failed probe is an error naming the cell. The kinds (perfkit/experiment/kinds/) judge in
these words; perfkit/experiment/judging.py turns a hypothesis's executions into one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perfkit.experiment.results import Floor, Measured

#: how the reason of a verdict begins when no replicate was measured on a fit machine
UNFIT_REASON = "the machine was not fit to measure on"


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

    def where(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.at.items())) or "the only point"

    def samples(self) -> list[float]:
        """Every sample of every replicate."""
        return [s for r in self.replicates for s in r]


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

    def line(self) -> str:
        """One readable line: 'measured 0.18 ms [0.16, 0.21], 1,100x below the expected 200 ms'."""
        if self.measured is None:
            return self.reason or ""
        text = f"measured {self.measured.text()}"
        if self.off_by:
            text += f", {self.off_by}"
        if self.reason:
            text += f" ({self.reason})"
        return text


class Inconclusive(Exception):
    """The evidence cannot support a verdict; the message says why (raised by the kinds' judging)."""
