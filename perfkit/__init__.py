"""perfkit: performance investigations run like experiments.

`import perfkit` is cheap (no torch, no matplotlib): the public names below are resolved on first
use from the modules that define them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC = {
    "record": "perfkit.probe.recording",
    "record_breakdown": "perfkit.probe.recording",
    "record_profile_lines": "perfkit.probe.recording",
    "profile_window": "perfkit.probe.logsources",
    "metrics_window": "perfkit.probe.metrics",
    "record_metrics": "perfkit.probe.metrics",
    "span": "perfkit.probe.spans",
    "timed": "perfkit.probe.spans",
    "capture": "perfkit.probe.spans",
    "flush": "perfkit.probe.spans",
    "enabled": "perfkit.probe.spans",
    "set_enabled": "perfkit.probe.spans",
    "bench": "perfkit.probe.timing",
    "interleave": "perfkit.probe.timing",
    "instructions": "perfkit.probe.instructions",
    "steady_allocator": "perfkit.probe.allocator",
    "load_hypotheses": "perfkit.experiment.records.hypothesis",
    "Verdict": "perfkit.experiment.records.verdict",
}

# public name -> module that is it (`from perfkit import serving`)
_MODULES = {"serving": "perfkit.probe.serving"}

__all__ = sorted([*_PUBLIC, *_MODULES])


def __getattr__(name: str):
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        raise AttributeError(f"module 'perfkit' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC) | set(_MODULES))
