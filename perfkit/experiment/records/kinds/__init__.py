"""The expectation kinds: one class per kind, each in this package, found by its `KIND` word.

To add a kind, add a module here with a subclass of `Expect` that sets `KIND` and `KEYS` and
implements `read`, `metrics`, `expected`, `judge` and `plot`; nothing else needs to change.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from perfkit.experiment.records.checker import Key, optional
from perfkit.experiment.records.kinds.base import COMMON_KEYS, Expect


def _registry() -> dict[str, type[Expect]]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, type[Expect]] = {}
    todo = list(Expect.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "KIND" in cls.__dict__:
            found[cls.KIND] = cls
    return dict(sorted(found.items()))


KINDS: dict[str, type[Expect]] = _registry()


def all_keys() -> dict[str, Key]:
    """Every key any kind accepts, none required: what an unknown `kind` is checked against."""
    return {**COMMON_KEYS, **{k: optional(v.says) for cls in KINDS.values() for k, v in cls.KEYS.items()}}


def expectation(*, kind: str, **fields: Any) -> Expect:
    """An expectation built in code (tests, tools) rather than read from a record."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return KINDS[kind](kind=kind, **fields)


__all__ = ["KINDS", "Expect", "all_keys", "expectation"]
