"""A project's perfkit settings: `[tool.perfkit]` in its pyproject.toml, or perfkit.toml when it has none.

Keys:
- `cluster = "ADDRESS"` (or "local:N"): where `perfkit run` sends its executions by default;
- `code = ["src", "ownlib", "numpy", ...]`: what the code under test is, as paths under the project
  root and installed distribution names (default: the whole working tree and every installed
  distribution; perfkit/experiment/records/code.py);
- `fitness = {foreign_share = 0.25, episode_share = 0.5, episodes = 0.25}`: when other processes'
  load makes a replicate unfit, as shares of the machine's cores (perfkit/machine/fitness.py).
An unknown key is refused, naming the file: a typo must not silently change what is measured.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from perfkit.errors import UserError
from perfkit.machine import fitness
from perfkit.paths import Project

KEYS = ("cluster", "code", "fitness", "strip")


@dataclass(frozen=True)
class Settings:
    cluster: str | None = None
    code: tuple[str, ...] | None = None  # None: the default (everything); see perfkit/experiment/records/code.py
    fitness: fitness.Limits = fitness.LIMITS
    source: str | None = None  # the file they came from, as the user sees it
    strip: tuple[str, ...] = ()  # more keys the notebook clean filter drops (perfkit/experiment/repo/strip.py)


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
    if cluster is not None and not isinstance(cluster, str):
        raise UserError(f"{shown}: {label} cluster must be a string, got {cluster!r}")
    code = table.get("code")
    if code is not None and (
        not isinstance(code, list) or not all(isinstance(c, str) and c.strip() for c in code) or not code
    ):
        raise UserError(f"{shown}: {label} code must be a list of paths and package names, got {code!r}")
    limits = table.get("fitness", {})
    if not isinstance(limits, dict):
        raise UserError(f"{shown}: {label} fitness must be a table, got {limits!r}")
    try:
        parsed = fitness.Limits.parse(limits, f"{label} fitness")
    except ValueError as exc:
        raise UserError(f"{shown}: {exc}") from None
    strip = table.get("strip", [])
    if not isinstance(strip, list) or not all(
        isinstance(k, str) and k.startswith(("metadata.", "cell.metadata.")) and "" not in k.split(".") for k in strip
    ):
        raise UserError(
            f'{shown}: {label} strip must be a list of keys like "metadata.jupytext" or "cell.metadata.tags", '
            f"got {strip!r}"
        )
    return Settings(
        cluster=cluster,
        code=None if code is None else tuple(code),
        fitness=parsed,
        source=shown,
        strip=tuple(strip),
    )
