"""The history of the results format, the same numbers for execution.json and the results files.

Format history (`format_version`), the same numbers for both files:
  1: first format; a reused execution named its origin in `cached_from` (execution.json) or
     `cached` (results).
  2: one execution shape in both files: `run_id` is the run that executed it, `reused` says the
     run took it from there instead of executing it again.
  3: replicates: an execution has a `replicate` index (each replicate is its own kernel process)
     and `unfit`, why its machine was not fit to measure on (or null); a metric summary says over
     how many `replicates` and what share of the variance lies `between` them; a result's
     `measured` says the same of the verdict's quantity, and `stopped` why no more replicates ran,
     `not_reproduced` when nothing changed since the last verdict and the intervals are disjoint.
  4: a run's results say the `profile`r it ran under (null: none; a profiled measurement is marked
     and never stands for an unprofiled one) and the `machine` it measured on (CPU, cores, GPUs).
  5: an execution says the `host` a cluster worker ran it on (null: the machine of the run).
  6: a result says what `changed` since the standing measurement when its executions' keys differ
     (the code under test, packages, environment, machine, probe) and how far the measurement moved;
     an execution says the CPU `threads` it ran with (null: not decided by the run, before format 6).
  7: a result's `floor` has its interval (`low`, `high`) over the `replicates` it was measured in,
     when the probe measured it in each of them (null: an exact figure, or measured once before format 7);
     an execution says the `cpus` it was pinned to ("0-3"; null: not pinned).
  8: an execution says the `server` it measured, when its probe drives one (`experiment/served.py`:
     the model, root and engine identity a live server gave, or that the probe started its own).
  9: a result's `measured` has the `spread` of its unit estimates (log scale when `log`), for a later
     run's forecast; an execution says what its `setup_s` cost (from its launch to its first recording cell) and
     whether it was `warm` (forked from its round's template) or a fresh process (null: not said).
  10: an execution says the `machine` it ran on (`id`, stable across runs, `host`, `cpu`, `gpus`; null:
     not said, one machine of the run); a result's `measured` says over how many `machines` its interval
     was taken and their own spread (`between_machines`, a share of the value; null: one machine), and
     `per_machine` holds each machine's own measurement when there were several.
  11: an execution that drove a server the run did not start says which process of it it measured, read
     before and after its window of requests (`server_instance`: `before`, `after`, each the server's
     `pid`, rank `pids`, `start_time` where it says them; null: a server the probe started, or not read).
  12: an execution says the foreign CPU `load` it ran under (`cores` used by processes outside its tree on
     average, of the `of` CPUs it ran on, the `busy_share` of seconds most of them were, the `top` processes;
     null: not said): on a shared machine load is measured through, not made unfit; a result's `measured`
     says how a comparison's arms were `paired` (null: one quantity, or not said).
Older files are upgraded on load by UPGRADES (version n -> n + 1); a newer file is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable


def _execution_1_to_2(old: dict) -> dict:
    """execution.json: `cached_from` (the origin of a reused execution) becomes `run_id` + `reused`."""
    origin = old.pop("cached_from", None)
    return {**old, "run_id": origin or old.get("run_id"), "reused": origin is not None}


def _results_1_to_2(old: dict) -> dict:
    """results: each execution reference `cached` becomes `reused`; `run_id` already named its origin."""
    for h in old.get("hypotheses", []):
        for x in h.get("executions", []):
            if isinstance(x, dict) and "cached" in x:
                x["reused"] = x.pop("cached")
    return old


def _1_to_2(old: dict) -> dict:
    return _results_1_to_2(old) if "hypotheses" in old else _execution_1_to_2(old)


def _executions_in(old: dict) -> list[dict]:
    """The execution records in either file: a results file's, or the execution.json itself."""
    found = [x for h in old.get("hypotheses", []) for x in h.get("executions", [])] if "hypotheses" in old else [old]
    return [x for x in found if isinstance(x, dict)]


def _2_to_3(old: dict) -> dict:
    """Every earlier execution was one process: replicate 0, its fitness not judged."""
    for x in _executions_in(old):
        x.setdefault("replicate", 0)
        x.setdefault("unfit", None)
    return old


#: version n -> function turning a version-n dict into a version-(n + 1) dict (either file).
def _3_to_4(old: dict) -> dict:
    """Results say the profiler and the machine; older runs did not record them (null)."""
    if "hypotheses" in old:
        old.setdefault("profile", None)
        old.setdefault("machine", None)
    return old


def _4_to_5(old: dict) -> dict:
    """Every earlier execution ran on the run's own machine."""
    for x in _executions_in(old):
        x.setdefault("host", None)
    return old


def _5_to_6(old: dict) -> dict:
    """Earlier results did not say what changed, nor executions their threads (null)."""
    for h in old.get("hypotheses", []):
        if isinstance(h, dict):
            h.setdefault("changed", None)
    for x in _executions_in(old):
        x.setdefault("threads", None)
    return old


def _6_to_7(old: dict) -> dict:
    """Earlier floors were one number without an interval, earlier executions not pinned (null)."""
    for h in old.get("hypotheses", []):
        if isinstance(h, dict) and isinstance(h.get("floor"), dict):
            for key in ("low", "high", "replicates"):
                h["floor"].setdefault(key, None)
    for x in _executions_in(old):
        x.setdefault("cpus", None)
    return old


def _7_to_8(old: dict) -> dict:
    """Earlier executions drove no server (null)."""
    for x in _executions_in(old):
        x.setdefault("server", None)
    return old


def _8_to_9(old: dict) -> dict:
    """Earlier executions did not say what their set-up cost, nor how their process started; earlier
    measurements did not keep their spread and edges (null: a later run pilots them afresh)."""
    for h in old.get("hypotheses", []):
        if isinstance(h, dict) and isinstance(h.get("measured"), dict):
            for key in ("spread", "log"):
                h["measured"].setdefault(key, None)
    for x in _executions_in(old):
        x.setdefault("setup_s", None)
        x.setdefault("warm", None)
    return old


#: a move of a rounding error's size, as results before format 10 could word it: '2.22e-14% higher than 8.88 tok ...'
_NO_MOVE = re.compile(r"\b\d(?:\.\d+)?e-(?:\d{2,}|9)% (?:higher|lower) than (\S+ \S+)(?: \[[^\]]*\])?$")


def _9_to_10(old: dict) -> dict:
    """Earlier replicates did not say which machine they ran on; earlier results were of one machine.
    A `changed` note that called a rounding error a move says it as perfkit now does: 'unchanged (8.88
    tok, identical)' (the values compared were identical; only the words were wrong)."""
    for h in old.get("hypotheses", []):
        if isinstance(h, dict):
            h.setdefault("per_machine", [])
            if isinstance(h.get("changed"), str):
                h["changed"] = _NO_MOVE.sub(r"unchanged (\1, identical)", h["changed"])
            if isinstance(h.get("measured"), dict):
                h["measured"].setdefault("machines", None)
                h["measured"].setdefault("between_machines", None)
    for x in _executions_in(old):
        x.setdefault("machine", None)
    return old


def _10_to_11(old: dict) -> dict:
    """Earlier windows on a running server did not say which of its processes they measured (null)."""
    for x in _executions_in(old):
        x.setdefault("server_instance", None)
    return old


def _11_to_12(old: dict) -> dict:
    """Earlier executions did not say their foreign load, nor measurements how their arms were paired (null)."""
    for h in old.get("hypotheses", []):
        if isinstance(h, dict):
            for m in [
                h.get("measured"),
                *(p.get("measured") for p in h.get("per_machine") or [] if isinstance(p, dict)),
            ]:
                if isinstance(m, dict):
                    m.setdefault("paired", None)
    for x in _executions_in(old):
        x.setdefault("load", None)
    return old


UPGRADES: dict[int, Callable[[dict], dict]] = {
    1: _1_to_2,
    2: _2_to_3,
    3: _3_to_4,
    4: _4_to_5,
    5: _5_to_6,
    6: _6_to_7,
    7: _7_to_8,
    8: _8_to_9,
    9: _9_to_10,
    10: _10_to_11,
    11: _11_to_12,
}
