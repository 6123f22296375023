"""Strict YAML with line numbers, and a checker that collects every `file:line: field: message`.

Hypothesis records (and the expectation kinds that own part of their schema) are read through
this, so that a typo never turns silently into a default and every error names where it is.

A record arrives in a pull request, so the reader cannot be bombed: before any Python object is
built, the event stream is scanned and a record with anchors or aliases (a "billion laughs"),
tags (`!!python/name`), nesting deeper than a record needs, or more bytes than a record needs is
refused with `file:line: message`; merge keys, non-scalar keys and numbers too long to read are
refused while walking it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from perfkit.errors import RecordError

MAX_RECORD_BYTES = 1_000_000  # a record is a page of YAML; 1 MB is far more than any needs
MAX_TEXT = 4_000  # characters in one value: a rationale is a paragraph, never a book
MAX_DEPTH = 8  # record -> expect/probe -> params -> a list of values -> ...: 8 levels is plenty
MAX_NODES = 10_000  # values, lists and mappings in one record: a sweep of thousands of points is still far below


def _refuse_unsafe(text: str, path: str) -> None:
    """Scan the YAML events (no objects built, nothing expanded) and refuse what a record never needs."""
    if len(text.encode("utf-8")) > MAX_RECORD_BYTES:
        raise RecordError(f"the record is larger than {MAX_RECORD_BYTES:,} bytes; a record never needs that", path=path)
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = event.start_mark.line + 1
            if isinstance(event, yaml.NodeEvent):
                nodes += 1
                if nodes > MAX_NODES:  # counted before anything is built: a 490,000-item list stops here
                    raise RecordError(
                        f"more than {MAX_NODES:,} values; a record never needs that", path=path, line=line
                    )
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise RecordError("anchors and aliases (&, *) are not allowed in a record", path=path, line=line)
            tag = getattr(event, "tag", None)
            implicit = getattr(event, "implicit", True)
            explicit = tag is not None and not (all(implicit) if isinstance(implicit, tuple) else implicit)
            if explicit and tag != "!":
                raise RecordError(f"tags are not allowed in a record (got {tag})", path=path, line=line)
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise RecordError(
                        f"nested deeper than {MAX_DEPTH} levels; a record never needs that", path=path, line=line
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # compose reports it, with its line


class Located:
    """Plain data from YAML, plus the line of every key path, for file:line errors."""

    def __init__(self, text: str, path: str):
        self.path = path
        self.lines: dict[tuple, int] = {}
        self.errors: list[RecordError] = []
        _refuse_unsafe(text, path)
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(exc, "problem", None) or str(exc)
            raise RecordError(f"not valid YAML: {problem}", path=path, line=line) from None
        if node is None:
            raise RecordError(
                "empty file; expected a mapping with id, claim, rationale, expect, probe", path=path, line=1
            )
        self.data = self._walk(node, ())

    def _walk(self, node, where: tuple):
        self.lines.setdefault(where, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    raise RecordError("keys must be plain names, not lists or mappings", path=self.path, line=line)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise RecordError("merge keys (<<) are not allowed in a record", path=self.path, line=line)
                key = self._scalar(key_node)
                if key in out:
                    self.errors.append(self.error(where + (key,), "duplicate key", line=key_node.start_mark.line + 1))
                self.lines[where + (key,)] = key_node.start_mark.line + 1
                out[key] = self._walk(value_node, where + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[where + (i,)] = item.start_mark.line + 1
                items.append(self._walk(item, where + (i,)))
            return items
        return self._scalar(node)

    def _scalar(self, node):
        loader = yaml.SafeLoader("")
        if len(node.value) > MAX_TEXT:
            raise RecordError(
                f"a value of {len(node.value):,} characters; a record's values are at most {MAX_TEXT:,}",
                path=self.path,
                line=node.start_mark.line + 1,
            )
        try:
            return loader.construct_object(node, deep=True)
        except (ValueError, OverflowError, yaml.YAMLError) as exc:  # an integer of 5,000 digits, a bad date
            raise RecordError(
                f"cannot read this value: {exc}"[:200], path=self.path, line=node.start_mark.line + 1
            ) from None
        finally:
            loader.dispose()

    def line(self, where: tuple) -> int | None:
        while where and where not in self.lines:
            where = where[:-1]
        return self.lines.get(where)

    def error(self, where: tuple, message: str, *, line: int | None = None) -> RecordError:
        name = ".".join(str(p) for p in where) or None
        return RecordError(message, path=self.path, line=line or self.line(where), field=name)


@dataclass(frozen=True)
class Key:
    """One key a record's mapping may hold: whether it must, and what it says (docs/reference/records.md
    is rendered from these, so the reference is the schema the checker enforces)."""

    required: bool
    says: str


def required(says: str) -> Key:
    return Key(True, says)


def optional(says: str) -> Key:
    return Key(False, says)


def type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Checker:
    """Walks one parsed record, collecting every error instead of stopping at the first."""

    def __init__(self, doc: Located):
        self.doc = doc
        self.errors = doc.errors

    def fail(self, where: tuple, message: str) -> None:
        self.errors.append(self.doc.error(where, message))

    def missing(self, where: tuple, key: str, message: str) -> None:
        """An error about a key that is absent, reported at the line of its parent mapping."""
        self.errors.append(self.doc.error(where + (key,), message, line=self.doc.line(where)))

    def keys(self, mapping: dict, where: tuple, allowed: dict[str, Key]) -> None:
        for key in mapping:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                self.fail(where + (key,), f"unknown key; expected one of: {hint}")
        for key, declared in allowed.items():
            if declared.required and key not in mapping:
                self.missing(where, key, "missing; this key is required")

    def mapping(self, value: Any, where: tuple) -> dict | None:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {type_name(value)}")
            return None
        for key in value:
            if not isinstance(key, str):
                self.fail(where + (key,), f"keys must be strings, got {type_name(key)}")
        return value

    def string(
        self, mapping: dict, key: str, where: tuple, *, pattern: re.Pattern | None = None, what: str = ""
    ) -> str | None:
        if key not in mapping:
            return None
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(where + (key,), f"expected a non-empty string, got {type_name(value)}")
            return None
        if pattern is not None and not pattern.match(value):
            self.fail(where + (key,), f"{value!r} is not {what}")
            return None
        return value

    def number(
        self, mapping: dict, key: str, where: tuple, *, positive: bool = False, at_least: float | None = None
    ) -> float | None:
        if key not in mapping:
            return None
        value = mapping[key]
        if not is_number(value):
            self.fail(where + (key,), f"expected a number, got {type_name(value)} {value!r}")
            return None
        if not finite(value):  # `factor: .inf` would make a claim that cannot fail
            self.fail(where + (key,), f"expected a finite number, got {shown(value)}")
            return None
        if positive and not value > 0:
            self.fail(where + (key,), f"expected a number > 0, got {value!r}")
            return None
        if at_least is not None and value < at_least:
            self.fail(where + (key,), f"expected a number >= {at_least:g}, got {value!r}")
            return None
        return float(value)

    def integer(self, mapping: dict, key: str, where: tuple, *, low: int, high: int | None = None) -> int | None:
        if key not in mapping:
            return None
        value = mapping[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            wanted = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
            self.fail(where + (key,), f"expected {wanted}, got {shown(value)}")
            return None
        return value


def finite(value: int | float) -> bool:
    """Whether a number is finite as a float (an integer of 310 digits is not: it overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def shown(value: object) -> str:
    """A value as an error message shows it: an integer of thousands of digits is said, not printed."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"  # str() may refuse
    return repr(value)


def check_scalars(checker: Checker, mapping: dict, where: tuple) -> None:
    for key, value in mapping.items():
        if not isinstance(value, (str, int, float, bool)):
            checker.fail(where + (key,), f"expected a number, string or boolean, got {type_name(value)}")
        elif isinstance(value, int | float) and not finite(value):
            checker.fail(where + (key,), f"expected a finite number, got {shown(value)}")
