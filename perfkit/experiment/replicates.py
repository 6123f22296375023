"""The replicate policy: how many processes a run measures, when it adds more, and at what confidence.

Everything that decides "when does a run add replicates?" is here:
- a run starts with `first` replicates per execution (DEFAULT_REPLICATES per mode, `--replicates`,
  or a record's `probe.replicates`);
- after judging, an inconclusive verdict whose interval straddles an edge gets a forecast
  (`forecast`: how many replicates would likely clear the edge at the measured spread, from
  perfkit.stats.replicates_to_decide); the run grows those executions toward it (`grow`), up to
  `most`, and looks again, at most MORE_LOOKS more times;
- every look spends part of the 5%: a run that may look 1 + MORE_LOOKS times judges each look at
  1 - 0.05 / looks (Bonferroni), and that level is the one every view prints for its verdicts;
- `stopped` says, per hypothesis, why the run added no more.
Quick runs add none by default (they must stay quick); full runs up to three times `first`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfkit import stats, units
from perfkit.experiment.verdict import UNFIT_REASON, Judgement, Verdict

#: independent kernel processes per execution when neither the command nor the record says
DEFAULT_REPLICATES = {"quick": 3, "full": 5}
MORE_LOOKS = 2  # times a run may add replicates to verdicts the first look left undecided


@dataclass(frozen=True)
class Policy:
    first: int  # replicates planned per execution
    most: int  # the most a run may grow an execution to

    @property
    def looks(self) -> int:
        """How many times the run may judge the evidence (each look after the first adds replicates)."""
        return 1 + (MORE_LOOKS if self.most > self.first else 0)

    def confidence(self) -> float:
        """The level each look judges at: the 5% split over the looks (Bonferroni)."""
        return 1.0 - (1.0 - stats.CONFIDENCE) / self.looks

    def grow(
        self, replicates: dict[str, int], needs: dict[str, tuple[str, ...]], judged: dict[str, Judgement]
    ) -> dict[str, int] | None:
        """More replicates (execution key -> count) where more would likely decide a hypothesis's verdict.

        `needs` maps each hypothesis id to the execution keys it reads; None: nothing to add.
        """
        counts = dict(replicates)
        for hid, judgement in judged.items():
            needed = judgement.needed
            if judgement.verdict is not Verdict.INCONCLUSIVE or needed is None:
                continue
            for key in needs[hid]:
                counts[key] = max(counts[key], min(self.most, max(needed, counts[key] + 1)))
        return None if counts == replicates else counts

    def stopped(self, judgement: Judgement, ran_counts: list[int]) -> str:
        """Why no more replicates were run for a hypothesis whose executions ran `ran_counts` replicates."""
        counts = sorted(set(ran_counts))
        ran = "/".join(str(n) for n in counts)
        j = judgement
        if j.verdict in (Verdict.CONFIRMED, Verdict.REFUTED):
            return f"decided at {ran} replicates"
        if j.verdict is Verdict.ERROR:
            return f"the probe failed; {ran} ran"
        if j.reason and j.reason.startswith(UNFIT_REASON):
            return f"the machine was busy; {ran} ran"
        if j.needed is None:
            return f"more replicates would not decide it; {ran} ran"
        if max(counts) < self.most:
            return f"{ran} replicates after {MORE_LOOKS} looks added more; --max-replicates allows {self.most}"
        if self.most <= self.first:
            return f"{ran} replicates planned; --max-replicates would let the run add more"
        return f"reached --max-replicates ({self.most})"


def policy(*, quick: bool, replicates: int | None, max_replicates: int | None) -> Policy:
    """The run's policy from its options (`--quick`, `--replicates`, `--max-replicates`)."""
    first = replicates or DEFAULT_REPLICATES["quick" if quick else "full"]
    if max_replicates is not None:
        return Policy(first=first, most=max(max_replicates, first))
    return Policy(first=first, most=first * (1 if quick else 3))


def forecast(est: stats.Estimate, edges: list[float]) -> tuple[str, int | None]:
    """Why an interval straddling `edges` is undecided, and the replicates that would likely decide it."""
    why = f"the interval straddles {units.format_number(edges[0])}"
    forecasts = [stats.replicates_to_decide(est, e) for e in edges]
    needed = None if None in forecasts else max(forecasts)
    if needed is None:
        return f"{why}: too close to it to decide at this noise", None
    if est.replicates == 1:
        return f"{why}: one process cannot decide it; about {needed} replicates would", needed
    return f"{why}: about {needed} replicates would likely decide it ({est.replicates} ran)", needed
