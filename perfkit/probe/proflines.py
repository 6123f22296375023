"""The `[perfkit-prof]` line, written and read back: `perfkit prof` and `perfkit.record_profile_lines`.

An engine run with PERFKIT_PROFILE=1 prints `[perfkit-prof pid=12 rank=0] draft: n=50 mean=...`
lines: every worker its own, into a service journal or its own log, interleaved. Each line is a
running aggregate of one name in one process (cumulative: n and total only grow), so the latest
line (the largest n) of each (process, name) stands for it, and the difference of two lines is
what happened between them. This module writes the line (`format_line`, for spans) and reads it
out of any text: a timestamp or a log prefix before it is fine, other lines are skipped, a name
may hold spaces (it ends at the line's last `: n=`). Counts and totals add up exactly across
processes, the merged mean is total / count, and the quantiles, which cannot be merged from
summaries, are shown per process with the worst one named.

What is one process: a pid seen from one origin. The origin of a line is the text before
`[perfkit-prof` on it, less leading timestamps (ISO 8601, syslog's `Dec 01 12:00:00`, a time of
day, epoch seconds, `[  12.345]`) and surrounding blanks: journalctl's `host unit[1234]:`,
`docker compose logs`' `engine-1  |`, a `[rank0]:` that a launcher adds. Given several files, the
file's name comes first in each origin (give the pieces of one rotated log as one stream:
`cat serve.log.1 serve.log | perfkit prof`). So pid 1 in two containers, or pid 12 on two hosts,
stays two processes, while a process's lines with and without `rank=` (an exit summary printed
before its rank was known) are one, its rank taken from whichever line has it. `--by-pid` drops
origins when a log's prefix varies from line to line for one process.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace

from perfkit import units

_rank: int | None = None  # torch.distributed's rank once seen: kept after the process group is destroyed


def rank() -> int | None:
    """This process's rank: torch.distributed's (kept once seen), else $RANK, else None."""
    global _rank
    if _rank is not None:
        return _rank
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            _rank = int(dist.get_rank())
            return _rank
    except Exception:  # a half-initialised process group: fall back to the environment
        pass
    value = os.environ.get("RANK", "").strip()
    return int(value) if value.isdigit() else None


os.register_at_fork(after_in_child=lambda: globals().update(_rank=None))  # a forked child finds its own rank

PREFIX = "[perfkit-prof"
_NUM = r"\d{1,20}(?:\.\d{1,20})?|nan|inf"  # a number as spans print it; 1.2.3 or 5,000 digits is no line
_INT = r"\d{1,18}"
_LINE = re.compile(
    rf"\[perfkit-prof(?: pid=(?P<pid>{_INT}))?(?: rank=(?P<rank>{_INT}))?\] (?P<name>.+): n=(?P<n>{_INT}) "
    rf"mean=(?P<mean>{_NUM})ms p50=(?P<p50>{_NUM})ms p99=(?P<p99>{_NUM})ms last=(?P<last>{_NUM})ms "
    rf"total=(?P<total>{_NUM})ms(?![\d.])"
)
_STAMP = re.compile(
    r"\[?\s*(?:"
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?)?(?:Z|[+-]\d\d(?::?\d\d)?)?"  # ISO 8601
    r"|[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?"  # syslog, journalctl's short format
    r"|\d\d:\d\d:\d\d(?:[.,]\d+)?"  # a time of day
    r"|\d{9,10}\.\d+|\d+\.\d+(?=\])"  # epoch seconds; seconds since boot in brackets
    r")\]?(?:\s+|$)"
)


# --- writing -------------------------------------------------------------------------------------


def printable(name: str) -> str:
    """`name` with control characters escaped (a newline reads `\\n`), so that a line stays one line."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)


def _duration(seconds: float) -> str:
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:.0f}ms"
    if ms >= 1:
        return f"{ms:.2f}ms"
    return f"{ms:.3f}ms"


@dataclass(frozen=True)
class SpanStats:
    """Aggregate of one span name, durations in seconds (p50 and p99 within 1% of the exact ones)."""

    name: str
    n: int
    mean: float
    p50: float
    p99: float
    last: float
    total: float

    def line(self) -> str:
        """`[perfkit-prof pid=12 rank=0] name: n=.. mean=.. p50=.. p99=.. last=.. total=..`."""
        return format_line(os.getpid(), rank(), self)


def format_line(pid: int, rank: int | None, st) -> str:
    """One process's line for one name; `st` has name, n and mean, p50, p99, last, total in seconds.

    The total is printed to the nanosecond whatever its size, so that two lines difference exactly.
    """
    who = f"{PREFIX} pid={pid}" + (f" rank={rank}]" if rank is not None else "]")
    return (
        f"{who} {printable(st.name)}: n={st.n} mean={_duration(st.mean)} p50={_duration(st.p50)} "
        f"p99={_duration(st.p99)} last={_duration(st.last)} total={st.total * 1e3:.6f}ms"
    )


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfLine:
    """One process's running aggregate of one name (or its difference over a window), in milliseconds."""

    pid: int | None
    rank: int | None
    name: str
    n: int
    mean: float
    p50: float
    p99: float
    last: float
    total: float
    origin: str = ""

    @property
    def key(self) -> tuple:
        """What identifies the process: its origin and pid (its rank, for a line without pid)."""
        return (self.origin, self.pid) if self.pid is not None else (self.origin, None, self.rank)

    @property
    def process(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return who + (f" rank {self.rank}" if self.rank is not None else "")


_ANY_STAMP = re.compile(r"(?<![^\s|])" + _STAMP.pattern)  # a timestamp after a blank or a "|", wherever it is


def origin(prefix: str) -> str:
    """The origin named by the text before `[perfkit-prof` on a line: less its timestamps (first, as
    journalctl and docker put them, or after a name, as `docker compose logs -t` and `kubectl logs
    --prefix --timestamps` do), blanks collapsed."""
    while True:
        stripped = _ANY_STAMP.sub(" ", prefix)
        if stripped == prefix:
            return " ".join(prefix.split())
        prefix = stripped


def parse_line(line: str, source: str = "") -> ProfLine | None:
    """The profile line in `line` (one line of a log), or None; `source` (a file's name) leads its origin."""
    if PREFIX not in line:
        return None
    m = _LINE.search(line)
    if m is None:
        return None
    g = m.groupdict()
    where = " ".join(part for part in (source, origin(line[: m.start()])) if part)
    return ProfLine(
        pid=int(g["pid"]) if g["pid"] else None,
        rank=int(g["rank"]) if g["rank"] else None,
        name=g["name"],
        n=int(g["n"]),
        mean=float(g["mean"]),
        p50=float(g["p50"]),
        p99=float(g["p99"]),
        last=float(g["last"]),
        total=float(g["total"]),
        origin=where,
    )


def parse(text: str, source: str = "", *, by_pid: bool = False) -> list[ProfLine]:
    """Every profile line in `text`, in order; `by_pid` ignores origins (one log's prefix that varies)."""
    out = []
    for raw in text.splitlines():
        line = parse_line(raw, source)
        if line is not None:
            out.append(replace(line, origin=source) if by_pid else line)
    return out


def _ranks(lines: Iterable[ProfLine]) -> dict[tuple, int]:
    """Each process's rank, from whichever of its lines carries one."""
    ranks: dict[tuple, int] = {}
    for line in lines:
        if line.rank is not None and line.pid is not None:
            ranks.setdefault(line.key, line.rank)
    return ranks


def _by_name(rows: Iterable[ProfLine]) -> dict[str, list[ProfLine]]:
    out: dict[str, list[ProfLine]] = {}
    for row in rows:
        out.setdefault(row.name, []).append(row)
    order = lambda r: (-r.mean if not math.isnan(r.mean) else 0, r.origin, r.pid or 0)  # noqa: E731
    return {name: sorted(found, key=order) for name, found in sorted(out.items())}


def _greatest(lines: Iterable[ProfLine]) -> dict[tuple, ProfLine]:
    best: dict[tuple, ProfLine] = {}
    for line in lines:
        k = (line.key, line.name)
        if k not in best or line.n >= best[k].n:
            best[k] = line
    return best


def latest(lines: Iterable[ProfLine]) -> dict[str, list[ProfLine]]:
    """Per name, the latest line (largest n) of each process, its rank filled in, slowest mean first."""
    lines = list(lines)
    ranks = _ranks(lines)
    best = _greatest(replace(line, rank=ranks.get(line.key, line.rank)) for line in lines)
    return _by_name(best.values())


def difference(before: Iterable[ProfLine], inside: Iterable[ProfLine]) -> dict[str, list[ProfLine]]:
    """Per name, what each process did in a window: its latest line inside less its latest before.

    n and total difference exactly (to the printed nanosecond) and the mean is total / n; p50, p99
    and last are the inside line's own, cumulative since the process started. A process with no
    line before the window counts from zero; one whose count went down restarted under the same
    pid (pid 1 of a restarted container) and counts from zero too. Processes with no call in the
    window are left out.
    """
    before, inside = list(before), list(inside)
    ranks = _ranks(before + inside)
    start = _greatest(before)
    rows = []
    for k, end in _greatest(inside).items():
        base = start.get(k)
        if base is not None and base.n > end.n:
            base = None
        n = end.n - (base.n if base else 0)
        total = end.total - (base.total if base else 0.0)
        if n > 0:
            rows.append(replace(end, rank=ranks.get(end.key, end.rank), n=n, total=total, mean=total / n))
    return _by_name(rows)


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
    slowest = max(rows, key=lambda r: r.mean)
    return Merged(
        name=rows[0].name,
        processes=len(rows),
        n=n,
        total=total,
        mean=total / n if n else float("nan"),
        worst_p99=max(r.p99 for r in rows),
        slowest=label(slowest, with_origin=len({r.origin for r in rows}) > 1),
    )


def label(row: ProfLine, *, with_origin: bool) -> str:
    """`pid 12 rank 0`, after its origin when origins tell processes apart."""
    return printable(f"{row.origin} {row.process}" if with_origin and row.origin else row.process)


def _shared_pids(by_name: dict[str, list[ProfLine]]) -> list[str]:
    origins: dict[int, set[str]] = {}
    for rows in by_name.values():
        for r in rows:
            if r.pid is not None:
                origins.setdefault(r.pid, set()).add(r.origin)
    return [
        f"note: pid {pid} appears under {len(o)} origins ({', '.join(sorted(o))}), counted as {len(o)} processes "
        "(one per host, container or file); "
        "if they are one process whose log prefix varies, use --by-pid"
        for pid, o in sorted(origins.items())
        if len(o) > 1
    ]


def table(text_or_rows: str | dict[str, list[ProfLine]]) -> str:
    """One table per name: a row per process (the slowest marked), then the merged aggregate."""
    by_name = latest(parse(text_or_rows)) if isinstance(text_or_rows, str) else text_or_rows
    if not by_name:
        return "no [perfkit-prof] lines found\n"
    many = len({r.origin for rows in by_name.values() for r in rows}) > 1
    width = max([20] + [len(label(r, with_origin=many)) for rows in by_name.values() for r in rows])
    out = []
    for name, rows in by_name.items():
        m = merge(rows)
        out.append(f"{printable(name)}  ({m.processes} process{'es' if m.processes != 1 else ''})")  # no raw ESC
        out.append(f"  {'process':<{width}} {'n':>9} {'mean':>11} {'p50':>11} {'p99':>11} {'total':>11}")
        for i, r in enumerate(rows):
            mark = "  <- slowest" if i == 0 and len(rows) > 1 else ""
            figures = f"{_ms(r.mean):>11} {_ms(r.p50):>11} {_ms(r.p99):>11} {_ms(r.total):>11}"
            out.append(f"  {label(r, with_origin=many):<{width}} {r.n:>9} {figures}{mark}")
        out.append(
            f"  {'all (merged)':<{width}} {m.n:>9} {_ms(m.mean):>11} {'':>11} {_ms(m.worst_p99):>11} "
            f"{_ms(m.total):>11}  (p99: the worst process's)"
        )
        out.append("")
    out.extend(_shared_pids(by_name))
    return "\n".join(out) + ("\n" if out[-1] else "")


def _ms(value: float) -> str:
    return units.format_quantity(value, "ms")


def main(argv: list[str]) -> int:
    import argparse
    import os
    import sys

    parser = argparse.ArgumentParser(
        prog="perfkit prof",
        description="merge [perfkit-prof] lines of many processes (files, or stdin); "
        "with several files, each file's name is part of its processes' origin",
    )
    parser.add_argument("files", nargs="*", help="logs to read (default: standard input)")
    parser.add_argument(
        "--by-pid", action="store_true", help="one process per pid (per file), whatever the text before its lines"
    )
    args = parser.parse_args(argv)
    lines: list[ProfLine] = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            print(f"perfkit prof: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 2
        source = os.path.basename(path) if len(args.files) > 1 else ""
        if source and len({os.path.basename(p) for p in args.files}) < len(args.files):
            source = path  # two logs of one name in different folders
        lines += parse(text, source, by_pid=args.by_pid)
    if not args.files:
        lines = parse(sys.stdin.read(), by_pid=args.by_pid)
    sys.stdout.write(table(latest(lines)))
    return 0
