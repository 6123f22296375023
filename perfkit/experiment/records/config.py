"""A project's perfkit settings: `[tool.perfkit]` in its pyproject.toml, or perfkit.toml when it has none.

Keys:
- `cluster = "ADDRESS"` (or "local:N", or "slurm:KEY=VALUE,..."): where `perfkit run` sends its executions
  by default; `cluster = {slurm = {partition = "gpu", jobs = 4}}` is the Slurm form as a table (SLURM_KEYS
  below; what each key does and its default: perfkit/experiment/run/slurm.py);
- `code = ["src", "ownlib", "numpy", ...]`: what the code under test is, as paths under the project
  root and installed distribution names (default: the whole working tree and every installed
  distribution; perfkit/experiment/records/code.py);
- `fitness = "shared"` (the default: other processes' load is recorded per replicate and measured
  through), `"strict"` (a dedicated machine: load above the limits makes a replicate unfit), or a table
  of strict limits, `{foreign_share = 0.25, episode_share = 0.5, episodes = 0.25}`, as shares of the
  machine's cores (perfkit/machine/fitness.py);
- `install = "REQUIREMENT"`: how the pull-request workflow (`perfkit init --ci github`) installs perfkit,
  one argument to `pip install`: a pinned VCS URL (`perfkit[review] @ git+https://...@SHA`), a wheel in the
  repository (`./vendor/perfkit-0.1.0-py3-none-any.whl[review]`) or, from a package index, `perfkit[review]`;
  `perfkit init` writes the way the perfkit that ran it was installed, when a CI runner can get it that way.
An unknown key is refused, naming the file: a typo must not silently change what is measured.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.machine import fitness
from perfkit.paths import Project

#: each key, and what it does (docs/reference/settings.md is rendered from these and the tables below)
SETTINGS = {
    "cluster": (
        'where `perfkit run` sends its executions by default: a Dask scheduler address, "local:N" (N local '
        'workers), "slurm:KEY=VALUE,..." or the Slurm table {slurm = {...}} (its keys below)'
    ),
    "code": (
        "what the code under test is, as paths under the project and installed distribution names; part of "
        "every measurement's cache key (default: the whole git working tree and every installed distribution)"
    ),
    "fitness": (
        '"shared" (the default: other processes\' load is recorded per replicate and measured through), '
        '"strict" (a dedicated machine: load above the limits makes a replicate unfit) or a table of strict '
        "limits as shares of the machine's cores (its keys below)"
    ),
    "install": (
        "how the pull-request workflow installs perfkit: one argument to `pip install` (a pinned git URL, a "
        "wheel in the repository); `perfkit init` fills it in from how the perfkit that ran it was installed"
    ),
    "strip": (
        'more notebook metadata keys the git clean filter drops, like "metadata.jupytext" or "cell.metadata.tags"'
    ),
}
KEYS = tuple(SETTINGS)

#: `cluster = {slurm = {...}}` and `--cluster slurm:KEY=VALUE,...`: each key and the kind of its value.
#: What each does and its default: `Slurm` in perfkit/experiment/run/slurm.py, one field per key.
SLURM_KEYS = {
    "partition": "text",
    "account": "text",
    "jobs": "count",
    "cores": "count",
    "memory": "size",
    "walltime": "walltime",
    "directives": "lines",
    "prologue": "lines",
    "resources": "amounts",
    "python": "program",
    "interface": "text",
    "logs": "text",
    "wait_s": "seconds",
}
_KINDS = {
    "text": "a string of one line, without control characters",
    "program": "a Python executable's path or name (the job script runs it quoted, as one word)",
    "count": "a whole number of 1 or more",
    "seconds": "a number of seconds above 0",
    "size": 'a size like "4GB" or "500MB"',
    "walltime": 'a Slurm time limit like "01:00:00", "90" (minutes) or "2-00:00:00"',
    "lines": "a list of strings",
    "amounts": "a table of resource names and amounts above 0, like {GPU = 1}",
}
_NAME = re.compile(r"[a-z][a-z_]*")  # a key of the one-line form: what starts a new KEY=VALUE
_RESOURCE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_SIZE = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B|[KMGT])", re.IGNORECASE)
_WALLTIME = re.compile(r"\d+(-\d+)?(:\d+){0,2}")


@dataclass(frozen=True)
class Settings:
    cluster: str | None = None
    code: tuple[str, ...] | None = None  # None: the default (everything); see perfkit/experiment/records/code.py
    fitness: fitness.Limits = fitness.LIMITS
    source: str | None = None  # the file they came from, as the user sees it
    strip: tuple[str, ...] = ()  # more keys the notebook clean filter drops (perfkit/experiment/repo/strip.py)
    install: str | None = None  # what the pull-request workflow gives `pip install` (perfkit/experiment/repo/init.py)


def where(project: Project) -> Path:
    """The file holding the settings: pyproject.toml when the project has one, else perfkit.toml."""
    pyproject = project.root / "pyproject.toml"
    return pyproject if pyproject.is_file() else project.root / "perfkit.toml"


def _table(path: Path, shown: str) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{shown}: cannot read [tool.perfkit]: {exc}") from None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("perfkit", {})
    if not isinstance(data, dict):
        raise UserError(f"{shown}: [tool.perfkit] must be a table")
    return data


def read(project: Project) -> Settings:
    """The project's settings (defaults when there is no file or no table)."""
    path = where(project)
    if not path.is_file():
        return Settings()
    shown = project.relative(path)
    table = _table(path, shown)
    label = "[tool.perfkit]" if path.name == "pyproject.toml" else shown
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise UserError(f"{shown}: {label} has no key {', '.join(unknown)} (known: {', '.join(KEYS)})")
    cluster = table.get("cluster")
    if isinstance(cluster, dict):
        cluster = _slurm(cluster, path, shown, label)
    elif isinstance(cluster, str) and cluster.startswith("slurm:"):
        try:
            slurm_table(cluster)
        except ValueError as exc:
            raise UserError(f"{shown}:{_line(path, 'cluster')}: {label} cluster {exc}") from None
    elif cluster is not None and not isinstance(cluster, str):
        raise UserError(f"{shown}: {label} cluster must be a string or {{slurm = {{...}}}}, got {cluster!r}")
    code = table.get("code")
    if code is not None and (
        not isinstance(code, list) or not all(isinstance(c, str) and c.strip() for c in code) or not code
    ):
        raise UserError(f"{shown}: {label} code must be a list of paths and package names, got {code!r}")
    try:
        parsed = fitness.Limits.parse(table.get("fitness", fitness.SHARED), f"{label} fitness")
    except ValueError as exc:
        raise UserError(f"{shown}:{_line(path, 'fitness')}: {exc}") from None
    strip = table.get("strip", [])
    if not isinstance(strip, list) or not all(
        isinstance(k, str) and k.startswith(("metadata.", "cell.metadata.")) and "" not in k.split(".") for k in strip
    ):
        raise UserError(
            f'{shown}: {label} strip must be a list of keys like "metadata.jupytext" or "cell.metadata.tags", '
            f"got {strip!r}"
        )
    install = table.get("install")
    if install is not None and (not isinstance(install, str) or not install.strip() or not install.isprintable()):
        raise UserError(
            f"{shown}:{_line(path, 'install')}: {label} install must be one line for `pip install`, like "
            f'"perfkit[review] @ git+https://example.org/perfkit.git@SHA", got {install!r}'
        )
    return Settings(
        cluster=cluster,
        install=install,
        code=None if code is None else tuple(code),
        fitness=parsed,
        source=shown,
        strip=tuple(strip),
    )


def _slurm(cluster: dict, path: Path, shown: str, label: str) -> str:
    """`cluster = {slurm = {...}}` as its one-line form; every bad key at once, each at its line."""
    if set(cluster) != {"slurm"} or not isinstance(cluster["slurm"], dict):
        raise UserError(
            f"{shown}:{_line(path, 'cluster')}: {label} cluster as a table takes one key, "
            f"slurm = {{...}}; got {cluster!r}"
        )
    table = cluster["slurm"]
    problems = slurm_problems(table) or [
        (key, f".{key} cannot be said on one line (a ';' or ',name=' inside it), got {value!r}")
        for key, value in table.items()
        if not _reads_back(key, value)
    ]
    if problems:
        raise UserError(
            "\n".join(f"{shown}:{_line(path, key)}: {label} cluster.slurm{words}" for key, words in problems)
        )
    return slurm_spec(table)


def _line(path: Path, key: str) -> int:
    """The line where `key = ` is first written in the settings (after [tool.perfkit] in a pyproject.toml)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = 0
    if path.name == "pyproject.toml":
        start = next((i for i, line in enumerate(lines) if line.strip().startswith("[tool.perfkit")), 0)
    written = re.compile(rf"(^|[\s{{,]){re.escape(key)}\s*=")
    return next((i + 1 for i in range(start, len(lines)) if written.search(lines[i])), start + 1)


def slurm_problems(table: dict) -> list[tuple[str, str]]:
    """What is wrong in a Slurm table: (key, the words that follow `slurm`) for each unknown key or bad value."""
    problems = []
    for key, value in table.items():
        kind = SLURM_KEYS.get(key)
        if kind is None:
            problems.append((key, f" has no key {key} (known: {', '.join(SLURM_KEYS)})"))
        elif not _fits(kind, value):
            problems.append((key, f".{key} must be {_KINDS[kind]}, got {value!r}"))
    return problems


def _fits(kind: str, value: Any) -> bool:
    def number(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < float("inf")

    def text(x: Any) -> bool:  # it lands in a job script: no line break or control character may forge one
        return isinstance(x, str) and bool(x.strip()) and not any(c < " " or c == "\x7f" for c in x)

    if kind == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if kind == "seconds":
        return number(value)
    if kind == "lines":
        return isinstance(value, list) and all(text(v) for v in value)
    if kind == "amounts":
        return isinstance(value, dict) and all(
            isinstance(n, str) and _RESOURCE.fullmatch(n) and number(a) for n, a in value.items()
        )
    if not text(value):
        return False
    if kind == "size":
        return bool(_SIZE.fullmatch(value.strip()))
    if kind == "walltime":
        return bool(_WALLTIME.fullmatch(value.strip()))
    return True


def slurm_table(spec: str) -> dict[str, Any]:
    """The table `slurm:KEY=VALUE,...` stands for, as `cluster = {slurm = {...}}` would give it.

    A list's items are separated by `;` (`directives=--gres=gpu:1;--exclusive`), a table's are NAME=AMOUNT
    (`resources=GPU=1`); a piece that does not start with `key=` goes on the value before it
    (`partition=debug,gpu`). A ValueError says what is wrong, naming the key.
    """
    body = spec.removeprefix("slurm:")
    pairs: list[list[str]] = []
    for piece in body.split(",") if body else ():
        key, sep, value = piece.partition("=")
        if sep and _NAME.fullmatch(key):
            pairs.append([key, value])
        elif pairs:
            pairs[-1][1] += "," + piece
        else:
            raise ValueError(f"slurm: expected KEY=VALUE,...; got {piece!r}")
    table: dict[str, Any] = {}
    for key, text in pairs:
        if key in table:
            raise ValueError(f"slurm.{key} is given twice")
        table[key] = _typed(SLURM_KEYS.get(key), text)
    problems = slurm_problems(table)
    if problems:
        raise ValueError("; ".join(f"slurm{words}" for _, words in problems))
    return table


def _typed(kind: str | None, text: str) -> Any:
    """The value a piece of the one-line form stands for; left as text where it cannot be (slurm_problems says so)."""
    try:
        if kind == "count":
            return int(text)
        if kind == "seconds":
            return float(text)
        if kind == "amounts":
            return {n.strip(): float(a) for n, _, a in (item.partition("=") for item in text.split(";"))}
    except ValueError:
        return text
    if kind == "lines":
        return [item.strip() for item in text.split(";") if item.strip()]
    return text


def slurm_spec(table: dict[str, Any]) -> str:
    """The one-line form of a (checked) Slurm table, its keys in SLURM_KEYS's order: what a run records."""

    def said(kind: str, value: Any) -> str:
        if kind == "lines":
            return ";".join(value)
        if kind == "amounts":
            return ";".join(f"{n}={_number(a)}" for n, a in value.items())
        return _number(value) if kind in ("count", "seconds") else value

    return "slurm:" + ",".join(f"{k}={said(kind, table[k])}" for k, kind in SLURM_KEYS.items() if k in table)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _reads_back(key: str, value: Any) -> bool:
    """Whether the one-line form of `key = value` reads back as the same value."""
    try:
        return slurm_table(slurm_spec({key: value})) == {key: value}
    except ValueError:
        return False
