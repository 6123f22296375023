"""Malformed records made by mutating the shipped ones: each is refused cleanly, quickly and writes nothing.

Every mutation makes the record invalid on purpose (a missing or mistyped field, a value no claim
can mean, YAML features a record never needs, sizes and paths out of bounds). For each one,
`perfkit validate` must exit 2 with a message naming the file, print no traceback, leave the
project as it was, and take well under the 2 s a reviewer's held-out corpus allows.
"""

from __future__ import annotations

import copy
import random
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from perfkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "hypotheses").glob("*.yaml"))
REQUIRED = [("id",), ("claim",), ("rationale",), ("expect",), ("probe",), ("expect", "kind"), ("probe", "notebook")]


def leaves(data, path=()):
    """(path, value) of every scalar in the record."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from leaves(v, path + (i,))
    else:
        yield path, data


def setting(data, path, value):
    out = copy.deepcopy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()


def structural(data, rng: random.Random) -> list[tuple[str, str]]:
    """Mutations of the parsed record, dumped back to YAML: (what, text)."""
    out = []
    for path in REQUIRED:
        out.append((f"no {'.'.join(path)}", yaml.safe_dump(setting(data, path, _DELETE))))
    numbers = [(p, v) for p, v in leaves(data) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    strings = [(p, v) for p, v in leaves(data) if isinstance(v, str)]
    for path, _ in numbers:
        for bad in (float("inf"), float("-inf"), float("nan")):
            out.append((f"{'.'.join(map(str, path))} = {bad}", yaml.safe_dump(setting(data, path, bad))))
    for path, _ in rng.sample(strings, min(4, len(strings))):
        out.append((f"{'.'.join(map(str, path))} a nested map", yaml.safe_dump(setting(data, path, {"a": {"b": [1]}}))))
    for where in ((), ("expect",), ("probe",)):
        node = data
        for key in where:
            node = node[key]
        extra = setting(data, where + ("surprise",), 1) if where else {**data, "surprise": 1}
        out.append((f"unknown key in {'.'.join(where) or 'the record'}", yaml.safe_dump(extra)))
    out.append(("id not the file name", yaml.safe_dump(setting(data, ("id",), "another-name"))))
    for notebook in ("../../../etc/passwd", "/etc/passwd", "missing.ipynb"):
        out.append((f"probe.notebook {notebook}", yaml.safe_dump(setting(data, ("probe", "notebook"), notebook))))
    out.append(("expect.kind unknown", yaml.safe_dump(setting(data, ("expect", "kind"), "vibes"))))
    return out


def textual(text: str) -> list[tuple[str, str | bytes]]:
    """Mutations of the record's text: YAML a record never needs, sizes, encodings."""
    nested = "x: " + "[" * 40 + "]" * 40 + "\n"
    laughs = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    return [
        ("billion laughs", laughs + text),
        ("an alias", text.replace("claim:", "claim: &c", 1) + "rationale2: *c\n"),
        ("python tag", text.replace("claim:", "claim: !!python/object/apply:os.system ['true'] #", 1)),
        ("custom tag", text.replace("claim:", "claim: !mine", 1)),
        ("merge key", text + "<<: {id: x}\n"),
        ("nesting 40 deep", text + nested),
        ("a 2 MB record", text + "# " + "x" * 2_000_000 + "\n"),
        ("a 300 kB claim", text.replace("claim:", "claim: " + "y" * 300_000 + " #", 1)),
        ("a 5000-digit number", text + "n: " + "9" * 5000 + "\n"),
        ("not UTF-8", text.encode("utf-8") + b"\nclaim2: \xff\xfe\n"),
        ("a NUL byte", text + "\x00\n"),
        ("empty", ""),
        ("a list, not a map", "- 1\n- 2\n"),
        ("a tab-indented map", text.replace("\n  ", "\n\t", 1) if "\n  " in text else text + "\t- x\n"),
        ("a key repeated", text + "claim: again\n"),
    ]


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def corpus():
    rng = random.Random(20261201)
    cases = []
    for path in SHIPPED:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        cases += [(path.stem, what, mutated) for what, mutated in structural(data, rng)]
        cases += [(path.stem, what, mutated) for what, mutated in textual(text)]
    return cases


def test_the_corpus_is_large_and_varied(corpus):
    assert len(SHIPPED) >= 10
    assert len(corpus) > 400
    assert len({what.split(" = ")[0].split(" ")[0] for _, what, _ in corpus}) > 20


def refuse_all(project: Path, cases, capsys) -> tuple[list[str], float, str]:
    """Validate each case alone in the project; (failures, slowest seconds, slowest case)."""
    failures, slowest = [], (0.0, "")
    for stem, what, mutated in cases:
        record = project / "hypotheses" / f"{stem}.yaml"
        if isinstance(mutated, bytes):
            record.write_bytes(mutated)
        else:
            record.write_text(mutated, encoding="utf-8")
        t0 = time.perf_counter()
        try:
            code = main(["--root", str(project), "validate"])
        except Exception as exc:  # a crash is a failure of this case, reported with the others
            code = f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - t0
        record.unlink()
        out, err = capsys.readouterr()
        slowest = max(slowest, (took, f"{stem}: {what}"))
        if code != 2 or f"hypotheses/{stem}.yaml" not in err or "Traceback" in err + out or took > 2.0:
            failures.append(f"{stem}: {what}: exit {code}, {took:.2f} s: {(err or out)[:200]!r}")
    return failures, *slowest


@pytest.fixture
def bare_project(tmp_path):
    project = tmp_path / "project"
    (project / "hypotheses").mkdir(parents=True)
    shutil.copytree(ROOT / "notebooks", project / "notebooks")
    return project


def test_every_mutated_record_is_refused_cleanly(corpus, bare_project, capsys):
    before = tree(bare_project)
    failures, slowest, which = refuse_all(bare_project, corpus, capsys)
    assert failures == [], f"{len(failures)} of {len(corpus)} failed:\n" + "\n".join(failures[:25])
    assert tree(bare_project) == before  # nothing written, nothing left
    print(f"{len(corpus)} mutated records refused; slowest {slowest:.3f} s ({which})")


HEAVY = ("billion laughs", "a 2 MB record", "a 300 kB claim", "a 5000-digit number", "nesting 40 deep")


def test_the_heaviest_mutations_stay_in_bounded_memory(corpus, bare_project, capsys):
    heavy = [case for case in corpus if case[1] in HEAVY][: 2 * len(HEAVY)]
    tracemalloc.start()
    try:
        failures, _, _ = refuse_all(bare_project, heavy, capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(heavy) == 2 * len(HEAVY)
    assert all("exit 2," in f for f in failures)  # refused (tracing makes them slow, so time is not judged here)
    assert peak < 50 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_the_shipped_records_themselves_pass(tmp_path, capsys):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "notebooks", project / "notebooks")
    shutil.copytree(ROOT / "hypotheses", project / "hypotheses", ignore=shutil.ignore_patterns("ledger", "*.md"))
    assert main(["--root", str(project), "validate"]) == 0
    assert f"{len(SHIPPED)} hypotheses valid" in capsys.readouterr().out


def test_a_fresh_validate_process_refuses_a_bomb_in_under_2_s_and_200_mb(corpus, bare_project):
    import json
    import subprocess
    import sys

    # a fresh go-between whose only child is `perfkit validate`, so the peak it reports is that child's
    measure = (
        "import json, resource, subprocess, sys, time; t0 = time.perf_counter(); "
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(json.dumps({'code': done.returncode, 'err': done.stderr, 's': time.perf_counter() - t0, "
        "'kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))"
    )
    for stem, what, mutated in [c for c in corpus if c[1] in ("billion laughs", "a 2 MB record")][:2]:
        record = bare_project / "hypotheses" / f"{stem}.yaml"
        record.write_text(mutated, encoding="utf-8")
        command = [sys.executable, "-m", "perfkit.cli", "--root", str(bare_project), "validate"]
        got = json.loads(
            subprocess.run([sys.executable, "-c", measure, *command], capture_output=True, text=True, timeout=60).stdout
        )
        record.unlink()
        assert got["code"] == 2 and f"hypotheses/{stem}.yaml" in got["err"] and "Traceback" not in got["err"], got
        assert got["s"] < 2.0 and got["kib"] < 200 * 1024, (what, got["s"], got["kib"])
