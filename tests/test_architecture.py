"""The layout holds: each package imports only what its audience may, and no module cycle exists.

Layers, from the bottom: shared leaves (errors, text, environment, paths, files, units, phases, stats,
samples) -> probe (what a notebook imports) -> engine and kernels -> machine -> experiment -> cli -> reference
(the documentation's reference pages, rendered from all of them; nothing imports it). A module
may import its own layer and the layers below it, except that the experiment (storage,
judging, the run) never imports the notebook side or the engine: it reads what probes recorded
through perfkit.samples. Imports inside functions count too.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perfkit"
LEAVES = {
    "errors",
    "text",
    "environment",
    "processes",
    "paths",
    "files",
    "units",
    "phases",
    "stats",
    "changepoints",
    "sketch",
    "samples",
    "endpoints",
    "engineoptions",
    "prometheus",
}
ALLOWED = {
    "leaf": {"leaf"},
    "probe": {"leaf", "probe"},
    "engine": {"leaf", "probe", "engine"},
    "machine": {"leaf", "probe", "engine", "machine"},
    "experiment": {"leaf", "machine", "experiment"},
    "cli": {"leaf", "probe", "engine", "machine", "experiment", "cli"},
    "reference": {"leaf", "probe", "engine", "machine", "experiment", "cli", "reference"},
}


def layer(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in LEAVES:
        return "leaf"
    if top in ("engine", "kernels"):
        return "engine"
    if top in ("probe", "machine", "experiment", "cli", "reference"):
        return top
    raise AssertionError(f"{module}: no layer; add it to tests/test_architecture.py")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _nodes(tree: ast.AST, *, type_only: bool):
    """Every node of the tree; without `type_only`, not those under `if TYPE_CHECKING:` (annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if (
            not type_only
            and isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        ):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(path: Path, *, type_only: bool = False) -> set[str]:
    """Every perfkit module `path` imports when it runs, at any depth (a `from a import b` of a submodule counts b);
    with `type_only`, the imports for annotations (under `if TYPE_CHECKING:`) too."""
    found = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8")), type_only=type_only):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("perfkit.")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base != "perfkit" and not base.startswith("perfkit."):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
    found.discard("perfkit")
    return found


def graph(*, type_only: bool = False) -> dict[str, set[str]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name == "perfkit":  # the public API resolves its names lazily, from strings
            continue
        imports = imports_of(path, type_only=type_only)
        out[name] = {m for m in imports if m != name and not name.startswith(m + ".")}
    return out


def violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) not in ALLOWED[layer(module)]:
                bad.append(f"{module} ({layer(module)}) imports {target} ({layer(target)})")
    return bad


#: The rooms of perfkit/experiment, from the bottom: a room imports its own and those below it, never one
#: beside it or above. records (what is stored and judged) <- outputs (views of the records) <- run (a run's
#: stages) <- bisect and repo (features built on whole runs; neither imports the other). The three modules
#: at experiment/'s top are the old paths of a clean filter, a merge driver and a kernel that repositories
#: set up earlier still name: each imports only the module that replaced it.
ROOMS = {"records": 0, "outputs": 1, "run": 2, "bisect": 3, "repo": 3}
COMPAT = {"strip": "repo.strip", "merge": "repo.merge", "kernel": "run.kernel"}


def room(module: str) -> str | None:
    """The room of a module of perfkit.experiment (None: the package itself)."""
    parts = module.split(".")
    if parts[:2] != ["perfkit", "experiment"] or len(parts) == 2:
        return None
    if parts[2] in ROOMS:
        return parts[2]
    if len(parts) == 3 and parts[2] in COMPAT:
        return "compat"
    raise AssertionError(f"{module}: no room of perfkit/experiment; put it in one of {sorted(ROOMS)}")


def arrows_up(edges: dict[str, set[str]], room_of, may_import) -> list[str]:
    """Each import between two rooms that `may_import(module, here, target, there)` refuses."""
    bad = []
    for module, targets in sorted(edges.items()):
        here = room_of(module)
        for target in sorted(targets):
            there = room_of(target)
            if here is None or there is None or here == there:
                continue
            if not may_import(module, here, target, there):
                bad.append(f"{module} ({here}) imports {target} ({there})")
    return bad


def _experiment_may_import(module: str, here: str, target: str, there: str) -> bool:
    if here == "compat":  # an old path imports only the module that replaced it
        return target == f"perfkit.experiment.{COMPAT[module.split('.')[2]]}"
    return there != "compat" and ROOMS[there] < ROOMS[here]


def room_violations(edges: dict[str, set[str]]) -> list[str]:
    return arrows_up(edges, room, _experiment_may_import)


#: The rooms of perfkit/engine, from the bottom: the model (the modules at engine/'s top: model, drafter,
#: decode, sampling, checkpoints, data) <- serve, training and benchmarks (each a job built on the model;
#: none imports another) <- cli (the command line over all three). perfkit.kernels sits beside the model.
ENGINE_ROOMS = {"model": 0, "serve": 1, "training": 1, "benchmarks": 1, "cli": 2}


def engine_room(module: str) -> str | None:
    """The room of a module of perfkit.engine (None: the package itself, or not the engine)."""
    parts = module.split(".")
    if parts[:2] != ["perfkit", "engine"] or len(parts) == 2:
        return None
    if parts[2] in ENGINE_ROOMS and parts[2] != "model":
        return parts[2]
    if len(parts) == 3:
        return "model"
    raise AssertionError(f"{module}: no room of perfkit/engine; put it in one of {sorted(ENGINE_ROOMS)}")


def engine_room_violations(edges: dict[str, set[str]]) -> list[str]:
    return arrows_up(edges, engine_room, lambda module, here, target, there: ENGINE_ROOMS[there] < ENGINE_ROOMS[here])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_import_runs_the_allowed_way():
    edges = graph()
    assert len(edges) > 40  # the walk found the package
    assert violations(edges) == []


def test_experiment_rooms_import_only_down():
    edges = graph()
    rooms = {room(m) for m in edges if m.startswith("perfkit.experiment.")}
    assert rooms == {*ROOMS, "compat"}  # every module sits in a room
    assert room_violations(edges) == []


def test_the_rooms_check_catches_an_arrow_up_or_sideways():
    edges = {
        "perfkit.experiment.records.results": {"perfkit.experiment.run.options"},  # up
        "perfkit.experiment.outputs.ledger": {"perfkit.experiment.records.results"},  # down: fine
        "perfkit.experiment.bisect.measure": {"perfkit.experiment.repo.init", "perfkit.experiment.run.runner"},
        "perfkit.experiment.strip": {"perfkit.experiment.repo.strip", "perfkit.experiment.run.kernel"},
        "perfkit.experiment.run.kernel": {"perfkit.experiment.kernel"},  # through an old path
    }
    assert room_violations(edges) == [
        "perfkit.experiment.bisect.measure (bisect) imports perfkit.experiment.repo.init (repo)",
        "perfkit.experiment.records.results (records) imports perfkit.experiment.run.options (run)",
        "perfkit.experiment.run.kernel (run) imports perfkit.experiment.kernel (compat)",
        "perfkit.experiment.strip (compat) imports perfkit.experiment.run.kernel (run)",
    ]
    try:
        room("perfkit.experiment.loose")
    except AssertionError as e:
        assert "no room" in str(e)
    else:
        raise AssertionError("a module outside every room was not seen")


def test_engine_rooms_import_only_down():
    edges = graph()
    rooms = {engine_room(m) for m in edges if m.startswith("perfkit.engine.")}
    assert rooms == set(ENGINE_ROOMS)  # every module sits in a room, and every room has one
    assert engine_room_violations(edges) == []


def test_the_engine_rooms_check_catches_an_arrow_up_or_sideways():
    edges = {
        "perfkit.engine.decode": {"perfkit.engine.serve.tp", "perfkit.engine.model"},  # up, then beside
        "perfkit.engine.serve.workers": {"perfkit.engine.benchmarks.bench", "perfkit.engine.decode"},
        "perfkit.engine.cli": {"perfkit.engine.serve.app", "perfkit.engine.training.train"},  # down: fine
    }
    assert engine_room_violations(edges) == [
        "perfkit.engine.decode (model) imports perfkit.engine.serve.tp (serve)",
        "perfkit.engine.serve.workers (serve) imports perfkit.engine.benchmarks.bench (benchmarks)",
    ]
    try:
        engine_room("perfkit.engine.loose.module")
    except AssertionError as e:
        assert "no room" in str(e)
    else:
        raise AssertionError("a module outside every room was not seen")


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_cycles_through_imports_for_annotations_either():
    """A loop that only `if TYPE_CHECKING:` closes is still two modules that cannot be read apart."""
    assert cycles(graph(type_only=True)) == []


def test_a_type_only_back_edge_is_seen():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from perfkit.experiment.records import hypothesis\n"
    )

    def seen(type_only: bool) -> set[str]:
        return {
            f"{n.module}.{a.name}"
            for n in _nodes(ast.parse(source), type_only=type_only)
            if isinstance(n, ast.ImportFrom)
            for a in n.names
        }

    assert seen(type_only=False) == {"typing.TYPE_CHECKING"}
    assert "perfkit.experiment.records.hypothesis" in seen(type_only=True)
    loop = {
        "perfkit.experiment.records.verdict": {"perfkit.experiment.records.hypothesis"},
        "perfkit.experiment.records.hypothesis": set(),
    }
    loop["perfkit.experiment.records.hypothesis"].add(
        "perfkit.experiment.records.verdict"
    )  # the old type-only loop, closed
    assert cycles(loop) == [["perfkit.experiment.records.hypothesis", "perfkit.experiment.records.verdict"]]


#: Limits that keep every module readable in one sitting (issue 18). They count code: a docstring, a
#: comment or a blank line never counts, so explaining a module costs nothing and shortening its words
#: gains nothing (issue 32). A smoke alarm, not a target: a module is as long as its one job needs.
MOST_MODULE_CODE_LINES = 400
MOST_FUNCTION_CODE_LINES = 80
MOST_PARAMETERS = 6  # in the experiment package, where contexts and records replace long parameter lists
#: Modules whose one job is longer, and why (a split would be arbitrary): STYLE asks for the statistics in
#: one module, one path for every interval; with the machine level (issue 33) and the process apart
#: (issue 34) it holds 402 lines of code.
LONGER = {"perfkit/stats.py": 450}


def code_lines(text: str, tree: ast.Module) -> set[int]:
    """The line numbers that hold code: a token other than a comment, and not a docstring."""
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, first.end_lineno + 1))
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docs


def oversized(path: Path, shown: str | None = None) -> list[str]:
    """What in one module breaks the size limits (`shown`: its path under the repository, when it is elsewhere)."""
    text = path.read_text(encoding="utf-8")
    shown = shown or path.relative_to(PACKAGE.parent).as_posix()
    tree = ast.parse(text)
    code = code_lines(text, tree)
    found = []
    if len(code) > LONGER.get(shown, MOST_MODULE_CODE_LINES):
        found.append(f"{shown}: {len(code)} lines of code")
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = sum(1 for line in code if node.lineno <= line <= node.end_lineno)
        if length > MOST_FUNCTION_CODE_LINES:
            found.append(f"{shown}:{node.lineno}: {node.name} is {length} lines of code")
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
        names += ["*args"] * bool(a.vararg) + ["**kwargs"] * bool(a.kwarg)
        if "/experiment/" in f"/{shown}" and len(names) > MOST_PARAMETERS:
            found.append(f"{shown}:{node.lineno}: {node.name} takes {len(names)} parameters")
    return found


def test_no_module_function_or_parameter_list_outgrows_its_limit():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 40
    assert [problem for path in paths for problem in oversized(path)] == []


def test_the_size_check_catches_each_kind_of_growth_and_counts_only_code(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_FUNCTION_CODE_LINES))
    assignments = "\n".join(f"y{i} = {i}" for i in range(MOST_MODULE_CODE_LINES))
    fake = tmp_path / "big.py"
    fake.write_text(f"def long():\n{body}\n\n\ndef wide(a, b, c, d, e, f, *, g):\n    pass\n{assignments}\n")
    found = oversized(PACKAGE / "experiment" / "records" / "verdict.py") + oversized(fake, "perfkit/experiment/big.py")
    assert [p.split(": ", 1)[1] for p in found] == [
        f"{MOST_MODULE_CODE_LINES + MOST_FUNCTION_CODE_LINES + 3} lines of code",
        f"long is {MOST_FUNCTION_CODE_LINES + 1} lines of code",
        "wide takes 7 parameters",
    ]
    words = '"""' + "a word\n" * 900 + '"""\n'  # a docstring, comments and blank lines: none of them code
    fits = "\n".join(f"    x{i} = {i}" for i in range(MOST_FUNCTION_CODE_LINES - 1))  # with its def line, the limit
    explained = tmp_path / "explained.py"
    explained.write_text(
        words + f"def long():\n    {words}    # a comment\n\n{fits}\n" + "# more words\n\n" * 400 + "z = 1\n"
    )
    assert oversized(explained, "perfkit/experiment/explained.py") == []


def test_the_checks_catch_a_wrong_direction_and_a_cycle():
    edges = {
        "perfkit.engine.decode": {"perfkit.experiment.run.runner"},  # the engine reaching into the experiment
        "perfkit.experiment.records.results": {"perfkit.probe.recording"},  # storage importing the notebook side
        "perfkit.machine.a": {"perfkit.machine.b"},
        "perfkit.machine.b": {"perfkit.machine.a"},
    }
    assert violations(edges) == [
        "perfkit.engine.decode (engine) imports perfkit.experiment.run.runner (experiment)",
        "perfkit.experiment.records.results (experiment) imports perfkit.probe.recording (probe)",
    ]
    assert cycles(edges) == [["perfkit.machine.a", "perfkit.machine.b"]]


def test_function_level_and_submodule_imports_are_seen():
    imports = imports_of(PACKAGE / "experiment" / "run" / "schedule.py")
    assert "perfkit.experiment.run.execute" in imports  # `from perfkit.experiment import execute as executor`
    assert "perfkit.machine.utilization" in imports
    assert "perfkit.experiment.records.hypothesis" not in imports_of(
        PACKAGE / "experiment" / "records" / "verdict.py"
    )  # nor for types


def test_every_shipped_probe_imports_what_exists():
    """Notebooks are code outside the package: a moved module must not break them silently."""
    import importlib
    import json

    notebooks = sorted((PACKAGE.parent / "notebooks").glob("*.ipynb"))
    assert notebooks
    problems = []
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perfkit"):
                module = importlib.import_module(node.module)
                problems += [
                    f"{path.name}: from {node.module} import {a.name}"
                    for a in node.names
                    if not hasattr(module, a.name) and not _is_module(f"{node.module}.{a.name}")
                ]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("perfkit") and not _is_module(a.name):
                        problems.append(f"{path.name}: import {a.name}")
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "perfkit"
                and not hasattr(importlib.import_module("perfkit"), node.attr)
            ):
                problems.append(f"{path.name}: perfkit.{node.attr}")
    assert problems == []


def test_every_shipped_probe_types_its_parameters_for_papermill():
    """`papermill --help-notebook` shows each parameter's type; `-y 'contexts: [8192]'` passes a list."""
    import papermill

    notebooks = sorted((PACKAGE.parent / "notebooks").glob("*.ipynb"))
    assert notebooks
    for path in notebooks:
        untyped = [
            name for name, d in papermill.inspect_notebook(str(path)).items() if d["inferred_type_name"] == "None"
        ]
        assert untyped == [], f"{path.name}: {untyped}"
