"""instructions(): how many CPU instructions a piece of code executes, counted under valgrind's cachegrind.

A unit load cannot move: another job on the machine changes how long the code takes, never how many
instructions it executes (CodSpeed measures CI benchmarks this way). Many virtual machines offer no
hardware counters, so the count comes from a CPU simulator: the statement runs in a fresh interpreter
under `valgrind --tool=cachegrind`, `number` times and then not at all, with the same hash seed, and the
difference over `number` is one sample, the start-up and the set-up cancelled. Each sample uses another
hash seed (string hashing changes dict layouts and so the count a little). Slow: the simulator runs
Python about 50x slower, and each sample is two interpreters (about 2 x 4 s to start on a small machine),
so it suits small pure-Python or C probes. Record the samples in `instr` (or `Kinstr`, `Minstr`,
`Ginstr`): a unit of its own, never judged against a claim in milliseconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["instructions"]

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")
_SCRIPT = """import sys
{setup}
def _perfkit_statement():
{body}
for _ in range(int(sys.argv[1])):
    _perfkit_statement()
"""


def _indented(code: str) -> str:
    lines = code.strip("\n").splitlines() or ["pass"]
    return "\n".join("    " + line for line in lines)


def _count(script: Path, number: int, seed: int, python: str, cwd: str | None) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("instructions() needs valgrind (Debian/Ubuntu: apt-get install valgrind)")
    command = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               python, str(script), str(number)]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the statement failed under valgrind (exit {done.returncode}):\n{tail}")
    return int(found.group(1).replace(",", ""))


def instructions(
    code: str,
    *,
    setup: str = "",
    number: int = 100,
    samples: int = 3,
    first_seed: int = 0,
    python: str | None = None,
    cwd: str | None = None,
) -> list[float]:
    """Instructions per execution of `code` (statements, as source text), one sample per hash seed.

    `setup` runs once before (imports, data); `number` executions per sample; `python` the interpreter
    (default: this one, so the project's packages import); `cwd` where it runs (default: here).
    """
    if number < 1 or samples < 1:
        raise ValueError("instructions needs number >= 1 and samples >= 1")
    source = _SCRIPT.format(setup=setup, body=_indented(code))
    compile(source, "<perfkit.instructions>", "exec")  # a syntax error here, not as a valgrind failure
    python = python or sys.executable
    out = []
    with tempfile.TemporaryDirectory(prefix="perfkit-instr-") as tmp:
        script = Path(tmp) / "statement.py"
        script.write_text(source, encoding="utf-8")
        for seed in range(first_seed, first_seed + samples):
            counted = _count(script, number, seed, python, cwd) - _count(script, 0, seed, python, cwd)
            out.append(counted / number)
    return out
