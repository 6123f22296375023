"""The replicate policy: how many processes a run measures, when it adds more, and at what confidence.

Everything that decides "when does a run add replicates?" is here:
- a run starts with `first` replicates per execution (DEFAULT_REPLICATES per mode, `--replicates`,
  or a record's `probe.replicates`);
- after judging, an inconclusive verdict whose interval straddles an edge gets a forecast
  (`forecast`: how many replicates would likely clear the edge at the measured spread, from
  perfkit.stats.replicates_to_decide); the run grows those executions toward it (`grow`), up to
  `most`, and looks again, at most MORE_LOOKS more times;
- every look spends part of the 5% (Bonferroni with unequal shares, fixed before any data): the
  first look FIRST_SHARE of it, each later one an equal part of the rest, so a verdict the first
  look decides is judged at 96% rather than 98.3%; the level a verdict was judged at is the one
  every view prints for it;
- a time budget (`--budget`, QUICK_BUDGET_S by default with --quick) lets the run add only the
  replicates whose forecast cost, from the replicates it already ran, fits in the time left
  (`afford`); the hypotheses left out say so;
- `stopped` says, per hypothesis, why the run added no more.
Full runs add up to three times `first` with no time limit unless given one; quick runs as many,
within their budget (`--budget 0`: none).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfkit import stats, units
from perfkit.experiment.verdict import UNFIT_REASON, Judgement, Verdict

#: independent kernel processes per execution when neither the command nor the record says
DEFAULT_REPLICATES = {"quick": 3, "full": 5}
MORE_LOOKS = 2  # times a run may add replicates to verdicts the first look left undecided
FIRST_SHARE = 0.8  # of the 5% error rate, what the first look spends when the run may look again
QUICK_BUDGET_S = 330.0  # --quick's default --budget: replicates are added only while the run is under 5.5 min


@dataclass(frozen=True)
class Policy:
    first: int  # replicates planned per execution
    most: int  # the most a run may grow an execution to
    budget_s: float | None = None  # the run's wall-clock seconds within which it may add replicates

    @property
    def looks(self) -> int:
        """How many times the run may judge the evidence (each look after the first adds replicates)."""
        return 1 + (MORE_LOOKS if self.most > self.first and self.budget_s != 0 else 0)

    def confidence(self, look: int = 0) -> float:
        """The level look `look` (0: the first) judges at: its share of the 5%, fixed before any data."""
        alpha = 1.0 - stats.CONFIDENCE
        if self.looks == 1:
            return stats.CONFIDENCE
        share = FIRST_SHARE if look == 0 else (1.0 - FIRST_SHARE) / (self.looks - 1)
        return 1.0 - alpha * share

    def afford(
        self,
        grown: dict[str, int],
        have: dict[str, int],
        needs: dict[str, tuple[str, ...]],
        seconds: dict[str, float],
        left_s: float,
    ) -> tuple[dict[str, int], dict[str, float]]:
        """The part of `grown` that fits in `left_s`: hypothesis by hypothesis, cheapest first.

        `seconds` is each execution key's forecast wall seconds per replicate (as executions run at
        once, already divided). Returns the counts to run and, for each hypothesis whose replicates
        do not fit, the seconds they would have needed.
        """
        counts, spent, left_out = dict(have), 0.0, {}

        def cost(hid: str) -> float:
            return sum(max(0, grown[k] - counts[k]) * seconds.get(k, 0.0) for k in needs[hid])

        wanting = [hid for hid, keys in needs.items() if any(grown[k] > have[k] for k in keys)]
        for hid in sorted(wanting, key=lambda h: (cost(h), h)):
            more = cost(hid)
            if spent + more > left_s:
                left_out[hid] = more
                continue
            spent += more
            for k in needs[hid]:
                counts[k] = max(counts[k], grown[k])
        return counts, left_out

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

    def stopped(self, judgement: Judgement, ran_counts: list[int], out_of_time: float | None = None) -> str:
        """Why no more replicates were run for a hypothesis whose executions ran `ran_counts` replicates.

        `out_of_time`: the seconds its next replicates would have needed when the budget left too few.
        """
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
        if out_of_time is not None:
            return (
                f"the time budget ran out (--budget {self.budget_s:g} s; its next replicates needed about "
                f"{out_of_time:.0f} s); {ran} ran"
            )
        if self.budget_s == 0 and self.most > self.first:
            return f"{ran} replicates planned; --budget 0 adds none"
        if max(counts) < self.most:
            return f"{ran} replicates after {MORE_LOOKS} looks added more; --max-replicates allows {self.most}"
        if self.most <= self.first:
            return f"{ran} replicates planned; --max-replicates would let the run add more"
        return f"reached --max-replicates ({self.most})"


def policy(*, quick: bool, replicates: int | None, max_replicates: int | None, budget_s: float | None = None) -> Policy:
    """The run's policy from its options (`--quick`, `--replicates`, `--max-replicates`, `--budget`)."""
    first = replicates or DEFAULT_REPLICATES["quick" if quick else "full"]
    budget = QUICK_BUDGET_S if budget_s is None and quick else budget_s
    most = first * 3 if max_replicates is None else max(max_replicates, first)
    return Policy(first=first, most=most, budget_s=budget)


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
