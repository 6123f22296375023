"""Profile lines from many processes, read back and merged: `perfkit prof` and `perfkit.record_profile_lines`.

An engine run with PERFKIT_PROFILE=1 prints `[perfkit-prof pid=12 rank=0] draft: n=50 mean=...`
lines: every worker its own, into a service journal or its own log, interleaved. Each line is a
running aggregate of one name in one process, so the latest line (the largest n) of each
(process, name) stands for it. This reads lines out of any text (a timestamp or a journal prefix
before them is fine, other lines are skipped), keeps the latest per process and name, and merges
across processes: counts and totals add up exactly, the merged mean is total / count, and the
quantiles, which cannot be merged from summaries, are shown per process with the worst one named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from perfkit import units

_LINE = re.compile(
    r"\[perfkit-prof(?: pid=(?P<pid>\d+))?(?: rank=(?P<rank>\d+))?\] (?P<name>\S+): n=(?P<n>\d+) "
    r"mean=(?P<mean>[\d.]+)ms p50=(?P<p50>[\d.]+)ms p99=(?P<p99>[\d.]+)ms last=(?P<last>[\d.]+)ms "
    r"total=(?P<total>[\d.]+)ms"
)


@dataclass(frozen=True)
class ProfLine:
    """One process's running aggregate of one name, durations in milliseconds."""

    pid: int | None
    rank: int | None
    name: str
    n: int
    mean: float
    p50: float
    p99: float
    last: float
    total: float

    @property
    def process(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return who + (f" rank {self.rank}" if self.rank is not None else "")


def parse(text: str) -> list[ProfLine]:
    """Every profile line in `text`, in order."""
    out = []
    for m in _LINE.finditer(text):
        g = m.groupdict()
        out.append(
            ProfLine(
                pid=int(g["pid"]) if g["pid"] else None,
                rank=int(g["rank"]) if g["rank"] else None,
                name=g["name"],
                n=int(g["n"]),
                mean=float(g["mean"]),
                p50=float(g["p50"]),
                p99=float(g["p99"]),
                last=float(g["last"]),
                total=float(g["total"]),
            )
        )
    return out


def latest(lines: Iterable[ProfLine]) -> dict[str, list[ProfLine]]:
    """Per name, the latest line (largest n) of each process, slowest mean first."""
    best: dict[tuple, ProfLine] = {}
    for line in lines:
        key = (line.name, line.pid, line.rank)
        if key not in best or line.n >= best[key].n:
            best[key] = line
    out: dict[str, list[ProfLine]] = {}
    for line in best.values():
        out.setdefault(line.name, []).append(line)
    return {name: sorted(rows, key=lambda r: (-r.mean, r.pid or 0)) for name, rows in sorted(out.items())}


@dataclass(frozen=True)
class Merged:
    name: str
    processes: int
    n: int
    total: float  # ms
    mean: float  # ms, total / n
    worst_p99: float  # ms, the largest p99 of any process
    slowest: str  # the process with the largest mean


def merge(rows: list[ProfLine]) -> Merged:
    n = sum(r.n for r in rows)
    total = sum(r.total for r in rows)
    return Merged(
        name=rows[0].name,
        processes=len(rows),
        n=n,
        total=total,
        mean=total / n if n else float("nan"),
        worst_p99=max(r.p99 for r in rows),
        slowest=max(rows, key=lambda r: r.mean).process,
    )


def table(text: str) -> str:
    """One table per name: a row per process (the slowest marked), then the merged aggregate."""
    by_name = latest(parse(text))
    if not by_name:
        return "no [perfkit-prof] lines found\n"
    out = []
    for name, rows in by_name.items():
        m = merge(rows)
        out.append(f"{name}  ({m.processes} process{'es' if m.processes != 1 else ''})")
        out.append(f"  {'process':<20} {'n':>9} {'mean':>11} {'p50':>11} {'p99':>11} {'total':>11}")
        for i, r in enumerate(rows):
            mark = "  <- slowest" if i == 0 and len(rows) > 1 else ""
            figures = f"{_ms(r.mean):>11} {_ms(r.p50):>11} {_ms(r.p99):>11} {_ms(r.total):>11}"
            out.append(f"  {r.process:<20} {r.n:>9} {figures}{mark}")
        out.append(
            f"  {'all (merged)':<20} {m.n:>9} {_ms(m.mean):>11} {'':>11} {_ms(m.worst_p99):>11} {_ms(m.total):>11}"
            f"  (p99: the worst process's)"
        )
        out.append("")
    return "\n".join(out)


def _ms(value: float) -> str:
    return units.format_quantity(value, "ms")


def main(argv: list[str]) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="perfkit prof", description="merge [perfkit-prof] lines of many processes (files, or stdin)"
    )
    parser.add_argument("files", nargs="*", help="logs to read (default: standard input)")
    args = parser.parse_args(argv)
    texts = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        except OSError as exc:
            print(f"perfkit prof: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 2
    if not args.files:
        texts.append(sys.stdin.read())
    sys.stdout.write(table("\n".join(texts)))
    return 0
