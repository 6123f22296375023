"""A user's repository, for the tests that need one: git and commands run in it, perfkit pip-installed
there (conftest's `installed` environment), and the small project the repository tests measure
(`ownlib`, whose work() sleeps, and a probe of it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import nbformat

from perfkit.experiment.run.scaffold import probe_notebook

ROOT = Path(__file__).resolve().parents[1]
RECORD = """id: ownlib-work-under-8ms
claim: ownlib.work() takes under 8 ms a call.
rationale: It sleeps 4 ms and does nothing else.
expect: {kind: at_most, metric: ownlib_work, value: 8, unit: ms}
probe:
  notebook: ownlib_probe.ipynb
  params: {repeat: 12}
"""
PARAMETERS = "repeat: int = 12"
PROBE = """import ownlib
import perfkit

samples = perfkit.bench(ownlib.work, warmup=2, repeat=repeat)
perfkit.record("ownlib_work", [s * 1e3 for s in samples], unit="ms")"""


def sh(cwd: Path, *argv: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


#: a replicate is unfit only when other load exceeds every core: the probes of these repositories sleep,
#: which load cannot move, so a test of them asserts on a loaded machine too (fitness has tests of its own)
PATIENT = "fitness = {foreign_share = 1, episode_share = 1, episodes = 1}"


def own_repository(path: Path, delay_s: float) -> Path:
    (path / "ownlib").mkdir(parents=True)
    (path / "ownlib" / "__init__.py").write_text(f"import time\n\n\ndef work():\n    time.sleep({delay_s})\n")
    (path / "pyproject.toml").write_text(f'[project]\nname = "ownlib"\nversion = "0.1"\n\n[tool.perfkit]\n{PATIENT}\n')
    sh(path, "git", "init", "-q", "-b", "main")
    sh(path, "git", "config", "user.email", "t@example.com")
    sh(path, "git", "config", "user.name", "t")
    sh(path, "git", "add", "-A")
    sh(path, "git", "commit", "-q", "-m", "ownlib")
    return path


def add_probe(repo: Path) -> None:
    (repo / "hypotheses" / "ownlib-work-under-8ms.yaml").write_text(RECORD)
    nbformat.write(probe_notebook(PARAMETERS, PROBE), str(repo / "notebooks" / "ownlib_probe.ipynb"))


def perfkit(repo: Path, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(repo, "perfkit", *args, env={k: v for k, v in env.items() if not k.startswith("_")}, check=check)


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo`; its output (a failure raises, with what git said)."""
    return sh(repo, "git", *args).stdout
