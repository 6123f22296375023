"""perfkit: performance investigations run like experiments.

`import perfkit` is cheap (no torch, no matplotlib): the public names below are resolved on first
use from the modules that define them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC = {
    "record": "perfkit.probe",
    "record_breakdown": "perfkit.probe",
    "span": "perfkit.spans",
    "timed": "perfkit.spans",
    "capture": "perfkit.spans",
    "flush": "perfkit.spans",
    "enabled": "perfkit.spans",
    "set_enabled": "perfkit.spans",
    "bench": "perfkit.measure",
    "load_hypotheses": "perfkit.hypothesis",
    "Verdict": "perfkit.verdict",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'perfkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
