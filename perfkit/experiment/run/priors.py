"""What the ledger knows before a run measures: each hypothesis's last measurement and what its replicates
cost, and the first round planned from them (the replicate policy decides, replicates.py).

For each selected hypothesis, the latest fit measurement in the same mode (quick or full) of the same
record (its hash) is read back as a `replicates.Known`: the estimate, the spread of its unit estimates
(stored from format 9 on; rebuilt from the interval of an older one), the edges the claim compares it
with, and the share of a replicate's variance that lies between processes (from its metric summaries).
Each planned execution's cost per replicate (set-up, then measuring, with the sample counts it ran)
comes from the same measurement's executions of the same probe and parameters. The run then measures
the first round the policy chooses, within its budget, and says in one line per execution why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from perfkit import stats
from perfkit.experiment.records import history, replicates
from perfkit.experiment.records.hypothesis import Hypothesis
from perfkit.experiment.records.results import Execution, HypothesisResult, RunResults
from perfkit.experiment.records.verdict import NOT_MEASURED
from perfkit.experiment.run.plan import Plan
from perfkit.machine import pace

FRESH_SETUP_S = 7.5  # what a fresh replicate cost outside its measuring cells, when an older record does not say
WARM_SETUP_S = 1.0  # ... and a warm one (measured: 0.8-1.5 s for the shipped probes)
UNKNOWN_COST_S = 20.0  # a replicate of an execution never measured before
TEMPLATE_S = 4.0  # a round's warm template: an interpreter importing torch, papermill, ipykernel
REPLICATE_S = 0.8  # a replicate's cost outside its own wall time: waiting to see its cores free, its trace's plot
RUN_S = 12.0  # what a run spends outside its replicates: planning, the machine's snapshot, plots, the ledger


def _log_scale(value: float, low: float, high: float) -> bool | None:
    """Whether an interval was taken on the log scale (symmetric there), on the linear one, or neither."""
    if value > 0 and low > 0 and high > 0:
        up, down = math.log(high / value), math.log(value / low)
        if abs(up - down) <= 1e-6 * max(1e-12, up + down):
            return True
    if abs((high - value) - (value - low)) <= 1e-6 * max(1e-300, high - low):
        return False
    return None


def _spread(m) -> tuple[float, bool] | None:
    """The unit estimates' spread and scale of a stored measurement (rebuilt from its interval before format 9)."""
    if m.spread is not None and m.log is not None:
        return m.spread, m.log
    if not m.replicates or m.replicates < 2 or m.confidence is None:
        return None
    log = _log_scale(m.value, m.low, m.high)
    if log is None:
        return None
    half = math.log(m.high / m.value) if log else m.high - m.value
    return half * math.sqrt(m.replicates) / stats.t_quantile(0.5 + m.confidence / 2.0, m.replicates - 1), log


def _between(result: HypothesisResult) -> float:
    """The share of a replicate mean's variance between processes, the largest over the metrics it read."""
    shares = []
    for m in result.metrics:
        if m.between is None or not m.replicates or m.replicates < 2 or not m.n:
            continue
        per = m.n / m.replicates
        rho = m.between
        shares.append(rho / (rho + (1.0 - rho) / per) if rho > 0 else 0.0)
    return max(shares) if shares else 0.5


#: the estimate and spread a plan forecasts with: the medians of this many latest measurements' (one outlier
#: is not the rule)
RECENT = 3


def known(h: Hypothesis, entries: list[history.Entry], *, quick: bool) -> replicates.Known | None:
    """The hypothesis's latest fit measurement of this record in this mode, as the policy reads it: the
    median estimate and the median spread of its RECENT latest measurements (a run on a machine that was
    slowed for a while, but not busy enough to be unfit, or one process that happened to sit low, must
    not make it look undecidable for good: 2.05x once, after 2.36x, 2.25x and 2.21x, against a 2x bound)."""
    fit = [
        e
        for e in entries
        if history.attempt(e) is None
        and e.result.hash == h.hash
        and e.result.measured is not None
        and e.run is not None
        and e.run.quick == quick
    ]
    spreads = [found for e in fit[-RECENT:] if (found := _spread(e.result.measured)) is not None]
    values = sorted(e.result.measured.value for e in fit[-RECENT:])
    for entry in reversed(fit):
        r = entry.result
        spread = _spread(r.measured)
        if spread is None:
            return None
        same_scale = sorted(s for s, log in spreads if log == spread[1])
        if same_scale:
            spread = (same_scale[len(same_scale) // 2], spread[1])
        counts = dict(h.probe.sample_defaults)
        for x in r.executions:
            counts |= {n: v for n, v in x.params.items() if n in h.probe.samples and isinstance(v, int)}
        return replicates.Known(
            run_id=entry.run_id,
            verdict=r.verdict,
            value=values[len(values) // 2] if values else r.measured.value,
            spread=spread[0],
            log=spread[1],
            replicates=r.measured.replicates or 1,
            edges=h.expect.edges(),
            between=_between(r),
            counts=counts,
            measurements=max(len(values), 1),
        )
    return None


def _without(params: dict, names: set[str]) -> dict:
    return {k: v for k, v in params.items() if k not in names}


def cost(
    x: Execution,
    entries: list[history.Entry],
    counted: set[str],
    *,
    warm: bool,
    pace_s: float | None = None,
    defaults: dict[str, int] | None = None,
) -> replicates.Cost | None:
    """A replicate of planned execution `x`, as the latest measurement of the same probe and parameters
    (sample counts aside) cost; its set-up as a warm or fresh process, whichever this run starts; both
    scaled by how much faster or slower the machine does fixed work now (`pace_s`) than it did then.
    `defaults`: the notebook's sample counts, for those the stored parameters did not set."""
    for entry in reversed(entries):
        if history.attempt(entry) is not None:
            continue
        same = [e for e in _measured(entry) if e.notebook == x.notebook and _alike(e, x, counted)]
        if same:
            return _replicate_cost(entry, same, counted, warm=warm, pace_s=pace_s, defaults=defaults)
    return None


def nearest_cost(
    x: Execution,
    entries: dict[str, list[history.Entry]],
    counted: set[str],
    *,
    warm: bool,
    pace_s: float | None = None,
    defaults: dict[str, int] | None = None,
) -> replicates.Cost | None:
    """For an execution never measured with its parameters (a record's were just edited): the cost of the
    measured execution of the same probe, by any hypothesis, that shares the most parameter values with it
    (sample counts aside, which `Cost.at` scales); of those equally near, the latest, then the dearest. A
    forecast of what changed parameters cost is a guess either way; this one is of the same probe on this
    machine, where the flat UNKNOWN_COST_S is of nothing, and the run's own walls replace it after the
    first replicate. The caller offers the runs of its own mode first (`_cost_of`)."""
    want = _without(x.params, counted)
    best, best_rank = None, None
    for runs in entries.values():
        for entry in runs:
            if history.attempt(entry) is not None:
                continue
            for e in _measured(entry):
                if e.notebook != x.notebook:
                    continue
                have = _without(e.params, counted)
                shared = sum(1 for k, v in want.items() if k in have and have[k] == v)
                rank = (shared, entry.run_id, e.wall_s)
                if best_rank is None or rank > best_rank:
                    best_rank, best = rank, (entry, e)
    if best is None:
        return None
    entry, near = best
    same = [e for e in _measured(entry) if e.notebook == near.notebook and _alike(e, near, counted)]
    return _replicate_cost(entry, same, counted, warm=warm, pace_s=pace_s, defaults=defaults)


def _measured(entry: history.Entry) -> list[Execution]:
    """The executions an entry measured itself (not reused), with their wall time."""
    return [e for e in entry.result.executions if e.wall_s is not None and not e.reused]


def _alike(a: Execution, b: Execution, counted: set[str]) -> bool:
    return _without(a.params, counted) == _without(b.params, counted)


def _replicate_cost(entry, same: list[Execution], counted, *, warm, pace_s, defaults) -> replicates.Cost:
    walls = [e.wall_s for e in same]
    setups = [e.setup_s if e.setup_s is not None else min(FRESH_SETUP_S, 0.8 * w) for e, w in zip(same, walls)]
    was_warm = all(e.warm for e in same)
    setup = sum(setups) / len(setups)
    measure = max(0.0, sum(walls) / len(walls) - setup)
    faster = pace.scale(pace_s, entry.run.pace_s if entry.run is not None else None)
    now = setup * faster if was_warm == warm else (WARM_SETUP_S if warm else FRESH_SETUP_S)
    params = {**(defaults or {}), **same[0].params}
    counts = {n: v for n, v in params.items() if n in counted and isinstance(v, int)}
    return replicates.Cost(setup_s=now, measure_s=measure * faster, counts=counts)


@dataclass
class FirstRound:
    """The first round as planned: the plan to measure, one line per execution, who was left out."""

    plan: Plan
    lines: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # hypothesis id -> why it is not measured
    seconds: float = 0.0  # the forecast of the round's measuring
    short: dict[str, float] = field(default_factory=dict)  # measured at the minimum: the seconds its forecast wanted
    #: what was left out, kept for the run to measure after all if the round ran faster than forecast: the
    #: plan with every execution at its minimum, and each execution key's forecast seconds per replicate
    whole: Plan | None = None
    per_replicate_s: dict[str, float] = field(default_factory=dict)
    overhead_s: float = 0.0  # the run's own forecast cost (templates, plots, ledger), beside `seconds`
    template_s: float = 0.0  # of it, a warm template's start, once per round of replicates (0: none)
    pace_s: float | None = None  # machine.pace as it was planned: the run's results record it
    odds: dict[str, float] = field(default_factory=dict)  # hypothesis id -> how likely the plan decides it


@dataclass(frozen=True)
class Setting:
    """How the run measures, as the plan of its first round needs to know."""

    quick: bool
    warm: bool  # replicates forked from a warm template (their set-up is cheaper)
    fixed: set[str]  # sample-count parameters the command line set: never chosen
    reusable: Callable[[Execution], int]  # replicates earlier runs measured with this very key (0 with --force)
    replan: Callable[[dict[str, dict[str, int]]], Plan]  # the plan again, with sample counts per execution key
    choose_replicates: bool = True  # False: the command line said how many (--replicates): the plan keeps them
    pace_s: float | None = None  # machine.pace now: a stored cost is scaled by it over its run's


@dataclass
class _Executions:
    """Per execution key of the plan: replicates wanted and planned at least, sample counts, seconds each."""

    wanted: dict[str, int] = field(default_factory=dict)
    have: dict[str, int] = field(default_factory=dict)
    chosen: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _choices(hypotheses, the_plan: Plan, policy, entries, costs, setting: Setting) -> dict[str, replicates.Choice]:
    """Each hypothesis's forecast: the replicates and sample counts that would decide it soonest."""
    by_id = {h.id: h for h in hypotheses}
    by_key = {x.key: x for x in the_plan.executions}
    out = {}
    for hid, keys in the_plan.needs.items():
        h = by_id[hid]
        ranges = {n: r for n, r in h.probe.samples.items() if n not in setting.fixed}
        params = {**h.probe.sample_defaults, **by_key[keys[0]].params} if keys else {}
        given = {n: v for n, v in params.items() if n in ranges and isinstance(v, int)}
        out[hid] = replicates.choose(
            policy,
            known(h, entries.get(hid, []), quick=setting.quick),
            [c for k in keys if (c := costs[k]) is not None],
            ranges=ranges,
            given=given,
            confidence=policy.confidence(),
        )
    return out


def _per_execution(the_plan: Plan, choices, costs, setting: Setting) -> _Executions:
    """The hypotheses' choices per execution: the most replicates any reader wants, the largest counts.

    An execution an earlier run measured with the key it has now (with its counts as they were then) is
    measured again as it was, never with more replicates or other counts on the strength of its own last
    verdict: that would be looking again at the same evidence, across runs, without paying for the look."""
    last = setting.replan({k: c.counts for k, c in costs.items() if c is not None and c.counts})
    stored = {old.key: setting.reusable(new) for old, new in zip(the_plan.executions, last.executions)}
    out = _Executions()
    for x in the_plan.executions:
        k = x.key
        readers = [hid for hid, keys in the_plan.needs.items() if k in keys]
        if stored[k] >= the_plan.replicates[k]:
            out.wanted[k] = out.have[k] = the_plan.replicates[k]
            out.chosen[k] = costs[k].counts if costs[k] is not None else {}
            out.seconds[k] = 0.0
            continue
        out.have[k] = the_plan.replicates[k]
        asked = [choices[hid].replicates for hid in readers] if setting.choose_replicates else []
        out.wanted[k] = max([out.have[k], *asked])
        for hid in readers:
            for name, n in choices[hid].counts.items():
                out.chosen.setdefault(k, {})[name] = max(out.chosen.get(k, {}).get(name, 0), n)
        out.seconds[k] = (costs[k].at(out.chosen.get(k, {})) if costs[k] else UNKNOWN_COST_S) + REPLICATE_S
    return out


def first_round(
    hypotheses: list[Hypothesis],
    the_plan: Plan,
    policy: replicates.Policy,
    all_results: list[RunResults],
    setting: Setting,
) -> FirstRound:
    """The first round the policy chooses from what the ledger knows, within the run's budget."""
    entries = history.history(all_results)
    counted = {n for h in hypotheses for n in h.probe.samples}
    costs = {x.key: _cost_of(x, hypotheses, the_plan, entries, counted, setting) for x in the_plan.executions}
    choices = _choices(hypotheses, the_plan, policy, entries, costs, setting)
    ex = _per_execution(the_plan, choices, costs, setting)
    overhead = RUN_S + (TEMPLATE_S * max(ex.have.values(), default=0) if setting.warm else 0.0)  # a template a round
    ask = replicates.Ask(ex.wanted, ex.have, the_plan.needs, ex.seconds, {h: c.odds for h, c in choices.items()})
    budget = None if not policy.budget_s else policy.budget_s - overhead  # --budget 0: measure the plan, add none
    counts, left_out, short = policy.fit(ask, budget)
    new_plan = setting.replan(ex.chosen)
    if len(new_plan.executions) != len(the_plan.executions):  # sample counts are chosen per execution
        raise RuntimeError("the plan with the chosen sample counts has other executions than the first")
    old_of = {new.key: old.key for old, new in zip(the_plan.executions, new_plan.executions)}
    kept = [x for x in new_plan.executions if counts.get(old_of[x.key], 0) > 0]
    whole = replace(new_plan, replicates={x.key: ex.have[old_of[x.key]] for x in new_plan.executions})
    new_plan = replace(
        new_plan,
        executions=tuple(kept),
        replicates={x.key: counts[old_of[x.key]] for x in kept},
        needs={hid: () if hid in left_out else keys for hid, keys in new_plan.needs.items()},
    )
    out = FirstRound(
        new_plan,
        seconds=sum(counts[k] * ex.seconds[k] for k in counts if counts[k]),
        short=short,
        whole=whole if left_out else None,
        per_replicate_s={x.key: ex.seconds[old_of[x.key]] for x in whole.executions},
        overhead_s=overhead,
        template_s=TEMPLATE_S if setting.warm else 0.0,
        pace_s=setting.pace_s,
        odds={hid: c.odds for hid, c in choices.items()},
    )
    out.lines = _lines(the_plan, choices, ex, counts, left_out, short)
    for hid, need in left_out.items():
        why = "" if choices[hid].decides else f" ({choices[hid].why})"
        out.left_out[hid] = (
            f"{NOT_MEASURED}: its replicates did not fit the run's --budget "
            f"({policy.budget_s:g} s); its minimum would have needed about {need:.0f} s{why}"
        )
        out.lines.append(f"[plan]    {hid}: {out.left_out[hid]}")
    return out


def _cost_of(x: Execution, hypotheses, the_plan: Plan, entries, counted: set[str], setting: Setting):
    """A replicate's cost from the measurements of any hypothesis that reads the execution (the notebook's
    sample counts as every reader declares them), else from the nearest measured execution of its probe."""
    readers = [h for h in hypotheses if x.key in the_plan.needs[h.id]]
    defaults = {n: v for h in readers for n, v in h.probe.sample_defaults.items()}
    for h in readers:
        found = cost(x, entries.get(h.id, []), counted, warm=setting.warm, pace_s=setting.pace_s, defaults=defaults)
        if found is not None:
            return found
    same_mode = {
        hid: [e for e in runs if e.run is not None and e.run.quick == setting.quick] for hid, runs in entries.items()
    }
    for offered in (same_mode, entries):  # a quick run's costs for a quick run, before a full run's
        found = nearest_cost(x, offered, counted, warm=setting.warm, pace_s=setting.pace_s, defaults=defaults)
        if found is not None:
            return found
    return None


def _lines(the_plan: Plan, choices, ex: _Executions, counts, left_out, short) -> list[str]:
    """One line per execution: its replicates and sample counts, and why (the hypothesis that asked most)."""
    out = []
    for x in the_plan.executions:
        k = x.key
        readers = [hid for hid, keys in the_plan.needs.items() if k in keys and hid not in left_out]
        if not counts.get(k) or not readers:
            continue
        if ex.seconds[k] == 0.0:
            out.append(f"[plan]    {x.label()}: {counts[k]} replicates, as an earlier run measured it (reused)")
            continue
        lead = max(readers, key=lambda hid: (choices[hid].replicates, hid))
        shown = "".join(f", {n}={v}" for n, v in sorted(ex.chosen.get(k, {}).items()))
        why = choices[lead].why
        if any(hid in short for hid in readers):
            why += f"; the budget left too few for the {ex.wanted[k]} its forecast asks"
        out.append(f"[plan]    {x.label()}: {counts[k]} replicates{shown}: {why} ({lead})")
    return out
