"""JUnit XML of judged results, for the test reports of GitLab, Jenkins and GitHub actions.

`run_junit` renders one run as one test suite: a test case per hypothesis, in id order, named by
its id with the classname `perfkit.<kind>`; its time is the wall seconds of the executions the run
itself executed (a reused one cost it nothing; the suite counts an execution that several
hypotheses share once). confirmed passes, refuted is a <failure>, inconclusive <skipped>, and error
(or any other verdict word) an <error>. Their message is one line: the verdict, the measured
interval and its confidence level (95% when an older result did not record it), how far off, the
expected cost and the reason; their text says the same at length, one fact a line, with warnings,
why the run stopped and `not_reproduced`. A confirmed case has no such element, so that same text
(a `not_reproduced` note included) is its <system-out>, which every one of those reporters shows.

`diff_junit` renders `perfkit diff` as one test suite: a test case per change, in the order given
(the diff's reading order), classname `perfkit.diff.<kind>`. What `diff.failing` fails the gate on
is a <failure>, a current verdict of error an <error>, an unchanged inconclusive one <skipped>;
the rest pass with their one-line description in <system-out>.

Both are pure and return the document as a str (UTF-8 declared). Every text and attribute goes
through ElementTree, which escapes it; characters XML 1.0 forbids (control characters other than
tab, newline and CR, lone surrogates, U+FFFE, U+FFFF) become U+FFFD first.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from datetime import datetime

from perfkit import units
from perfkit.experiment.records.compare import Change, failing
from perfkit.experiment.records.results import Execution, HypothesisResult, RunResults

_FORBIDDEN = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DATETIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})?")
#: verdict -> (element, its type attribute); confirmed has none, an unknown word is an error.
_OUTCOMES = {"refuted": ("failure", "refuted"), "inconclusive": ("skipped", None)}


def _clean(value: object) -> str:
    return _FORBIDDEN.sub("\ufffd", str(value))


def _add(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    """A child holding only characters XML 1.0 allows; attributes that are None are left out."""
    node = ET.SubElement(parent, tag, {k: _clean(v) for k, v in attrs.items() if v is not None})
    if text:
        node.text = _clean(text)
    return node


def _tally(node: ET.Element, name: str, seconds: float, timestamp: str | None = None) -> None:
    """Name a testsuite (or testsuites) and count the test cases under it, in a fixed attribute order."""
    cases = list(node.iter("testcase"))
    tags = [child.tag for case in cases for child in case]
    node.set("name", _clean(name))
    node.set("tests", str(len(cases)))
    for key, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        node.set(key, str(tags.count(tag)))
    node.set("time", f"{seconds:.3f}")
    if timestamp is not None:
        node.set("timestamp", timestamp)


def _document(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _seconds(executions: Iterable[Execution]) -> float:
    return sum(x.wall_s or 0.0 for x in executions if not x.reused)


def _timestamp(created: str) -> str | None:
    """`created` when it is an ISO 8601 date and time (what xs:dateTime reads), else None: left out."""
    if not _DATETIME.fullmatch(created):
        return None
    try:
        datetime.fromisoformat(created)
    except ValueError:
        return None
    return created


def _measured(result: HypothesisResult | None) -> str:
    """'2 ms [1.8, 2.2] (95% interval)'; 'nothing measured'; '—' for no result (not in that side of a diff)."""
    if result is None:
        return "—"
    if result.measured is None:
        return "nothing measured"
    return f"{result.measured.text()} ({result.measured.level()} interval)"


def _message(result: HypothesisResult) -> str:
    """'refuted: measured 2 ms [1.8, 2.2] (95% interval); off by 2x; expected ≈ 1 ms; reason: ...'."""
    parts = [f"measured {_measured(result)}" if result.measured else _measured(result)]
    parts += [f"off by {result.off_by}"] if result.off_by else []
    parts += [f"expected {result.expected}"]
    parts += [f"reason: {result.reason}"] if result.reason else []
    return " ".join(f"{result.verdict}: {'; '.join(parts)}".split())


def _explanation(result: HypothesisResult) -> str:
    """The result at length, one fact a line."""
    evidence = result.measured.evidence() if result.measured else None
    facts = [("verdict", result.verdict), ("claim", result.claim), ("expected", result.expected)]
    facts += [("measured", _measured(result) + (f"; {evidence}" if evidence else ""))]
    facts += [("off by", result.off_by), ("reason", result.reason)]
    facts += [("warning", w) for w in result.warnings]
    facts += [("stopped", result.stopped), ("not reproduced", result.not_reproduced)]
    return "".join(f"{key}: {value}\n" for key, value in facts if value)


def _case(suite: ET.Element, result: HypothesisResult) -> None:
    seconds = _seconds(result.executions)
    case = _add(suite, "testcase", classname=f"perfkit.{result.kind}", name=result.id, time=f"{seconds:.3f}")
    if result.verdict == "confirmed":
        _add(case, "system-out", _explanation(result))
        return
    tag, kind = _OUTCOMES.get(result.verdict, ("error", "error"))
    _add(case, tag, _explanation(result), message=_message(result), type=kind)


def run_junit(results: RunResults) -> str:
    """The run as one JUnit test suite, a test case per hypothesis in id order."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite")
    properties = ET.SubElement(suite, "properties")
    dirty = None if results.git_dirty is None else str(results.git_dirty).lower()
    for name, value in (
        ("run_id", results.run_id),
        ("mode", "quick" if results.quick else "full"),
        ("command", results.command),
        ("git_commit", results.git_commit),
        ("git_dirty", dirty),
        ("machine", results.machine),
        ("profile", results.profile),
    ):
        if value is not None:
            _add(properties, "property", name=name, value=value)
    for result in sorted(results.hypotheses, key=lambda h: h.id):
        _case(suite, result)
    distinct = {(x.run_id, x.id): x for h in results.hypotheses for x in h.executions}
    seconds = _seconds(distinct.values())
    _tally(suite, f"perfkit run {results.run_id}", seconds, _timestamp(results.created))
    _tally(root, "perfkit", seconds)
    return _document(root)


def _diff_message(change: Change) -> str:
    """'flip: confirmed → refuted; before 1 ms [0.9, 1.1] (95% interval), after ...; factor 2x'."""
    text = f"{change.kind}: {change.verdict_words}; before {_measured(change.base)}, after {_measured(change.current)}"
    if change.factor is not None:
        text += f"; factor {units.format_factor(change.factor)}"
    if change.shift is not None:
        text += f"; shift {'+' if change.shift >= 0 else '-'}{units.format_number(abs(change.shift))}"
    if change.expectation:
        text += f"; the expectation moved: {change.expectation}"
    if change.current is not None and change.current.reason:
        text += f"; reason: {change.current.reason}"
    return " ".join(text.split())


def _diff_body(change: Change) -> str:
    runs = f"base run: {change.base_run or '—'}\ncurrent run: {change.current_run or '—'}\n"
    shown = change.current or change.base
    return runs + (_explanation(shown) if shown else "")


def diff_junit(changes: list[Change], base_name: str, fail_on: tuple[str, ...]) -> str:
    """`perfkit diff` as one JUnit test suite, a test case per change in the order given."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite")
    failed = {id(c) for c in failing(changes, fail_on)}
    for change in changes:
        case = _add(suite, "testcase", classname=f"perfkit.diff.{change.kind}", name=change.id, time="0.000")
        verdict = change.current.verdict if change.current else None
        message = _diff_message(change)
        if id(change) in failed:
            _add(case, "failure", _diff_body(change), message=message, type=change.kind)
        elif verdict == "error":
            _add(case, "error", _diff_body(change), message=message, type="error")
        elif change.kind == "unchanged" and verdict == "inconclusive":
            _add(case, "skipped", _diff_body(change), message=message)
        else:
            _add(case, "system-out", message + "\n")
    _tally(suite, f"perfkit diff against {base_name}", 0.0)
    _tally(root, "perfkit diff", 0.0)
    return _document(root)
