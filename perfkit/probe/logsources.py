"""Reading `[perfkit-prof]` lines over time: a log read over a window (the writing side, a live
process's periodic reports, is perfkit/probe/reports.py).

`profile_window(source)` brackets what a probe drives and keeps the profile lines its
source gained meanwhile, with the last line of each process before it as the baseline:

    with perfkit.profile_window(server) as w:
        drive(server.url)
    w.record(["prepare_for_verify"], prefix="server_")  # = perfkit.record_profile_lines(w, ...)

A source is
  - a log file: a path, or any object with a `.log_path` (`perfkit.probe.servers.Server`): the
    window is the bytes appended while it was open (the file stays open, so a log renamed away is
    still read to its end, then the new file from its start; a truncated one from its start, with
    a note); the baseline is the file before;
  - `"journal:UNIT"` or `{"journal": UNIT}`: `journalctl -u UNIT --since @<t> --until @<t> -o json`,
    one entry's MESSAGE a line, its origin `_HOSTNAME SYSLOG_IDENTIFIER[_PID]` (as journalctl prints it);
  - `"docker:NAME"` or `{"docker": NAME}`: `docker logs --timestamps --since .. --until .. NAME`,
    stdout and stderr, the container's name the origin;
  - a list of these: each source's label leads its lines' origin.
The journal and docker are read once the window closes, `lookback` seconds before it opened for the
baseline. A missing `journalctl` or `docker` is a UserError when the window opens, not after the load.

A process reports every PERFKIT_PROFILE_EVERY calls and, with PERFKIT_PROFILE_INTERVAL=S, every S
seconds: a window counts the calls between the last report before it opened and the last report
before it closed. `settle` (seconds, waited at both edges; by default 1.5 S of a server this probe
started) lets a report land there, so both edges fall in the idle moments around the driven load.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import UserError
from perfkit.probe import proflines
from perfkit.probe.proflines import ProfLine
from perfkit.probe.reports import seconds

# json, shutil, subprocess and datetime are imported where used

# --- reading: a window over a log ----------------------------------------------------------------


@dataclass
class Lines:
    """What a source held: profile lines before the window and inside it, and notes on how it was read."""

    before: list[ProfLine] = field(default_factory=list)
    inside: list[ProfLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _complete(data: bytes) -> bytes:
    """Up to the last newline: a line still being written belongs to whoever reads after it."""
    cut = data.rfind(b"\n")
    return data[: cut + 1] if cut >= 0 else b""


def _lines(data: bytes, source: str) -> list[ProfLine]:
    return proflines.parse(data.decode("utf-8", errors="replace"), source)


class FileLog:
    """A log file; the window is the bytes appended while it was open."""

    def __init__(self, path: str | os.PathLike, label: str = "") -> None:
        self.path, self.label = Path(path), label or str(path)
        self._fh = None
        self._offset = 0
        self._before: list[ProfLine] = []

    def begin(self, origin: str) -> None:
        try:
            self._fh = open(self.path, "rb")  # noqa: SIM115 - held open over the window, closed in finish()
        except FileNotFoundError:
            return  # created during the window: all of it is inside
        except OSError as exc:
            raise UserError(f"profile_window: cannot read {self.path}: {exc.strerror}") from None
        head = _complete(self._fh.read())
        self._offset = len(head)
        self._before = _lines(head, origin)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()

    def finish(self, origin: str, start: float, end: float) -> Lines:
        out = Lines(before=self._before)
        if self._fh is None:
            out.notes.append(f"{self.path} did not exist when the window opened: all of it is inside")
            if self.path.exists():
                out.inside = _lines(_complete(self.path.read_bytes()), origin)
            return out
        with self._fh:
            size = os.fstat(self._fh.fileno()).st_size
            if size < self._offset:
                out.notes.append(f"{self.path} was truncated during the window: read from its start")
                self._offset = 0
            self._fh.seek(self._offset)
            out.inside = _lines(_complete(self._fh.read()), origin)
            opened = os.fstat(self._fh.fileno()).st_ino
        try:
            rotated = self.path.stat().st_ino != opened
        except FileNotFoundError:
            rotated = False
        if rotated:
            out.notes.append(
                f"{self.path} was rotated during the window: the old file read to its end, then the new one"
            )
            out.inside += _lines(_complete(self.path.read_bytes()), origin)
        return out


def _run(argv: list[str], what: str) -> tuple[str, str]:
    """The command's stdout and stderr; a UserError naming `what` when it is missing or fails."""
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, timeout=120)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found on PATH: it is needed to read {what}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", errors="replace").strip() or "(nothing on stderr)"
        raise UserError(f"`{' '.join(argv)}` failed with status {done.returncode} reading {what}: {err}")
    return done.stdout.decode("utf-8", errors="replace"), done.stderr.decode("utf-8", errors="replace")


def _need(binary: str, what: str) -> None:
    import shutil

    if shutil.which(binary) is None:
        raise UserError(f"{binary} not found on PATH: it is needed to read {what}")


class _Queried:
    """A log read by a command once the window closes (`finish`); its binary must be there when it opens."""

    KIND = BINARY = ""

    def __init__(self, name: str, lookback: float) -> None:
        self.name, self.lookback = name, lookback
        self.label = f"{self.KIND}:{name}"

    def begin(self, origin: str) -> None:
        _need(self.BINARY, self.label)

    def close(self) -> None:
        pass


class Journal(_Queried):
    """A systemd unit's journal, through `journalctl -o json`."""

    KIND, BINARY = "journal", "journalctl"

    def finish(self, origin: str, start: float, end: float) -> Lines:
        since = start - self.lookback
        argv = ["journalctl", "-u", self.name, "--since", f"@{since:.6f}", "--until", f"@{end:.6f}"]
        text, _ = _run([*argv, "-o", "json", "--no-pager"], self.label)
        out = Lines()
        for raw in text.splitlines():
            entry = _json(raw)
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald stores a message with control characters as bytes
                message = bytes(message).decode("utf-8", errors="replace")
            if not isinstance(message, str):
                continue
            who = f"{entry.get('SYSLOG_IDENTIFIER') or self.name}[{entry.get('_PID', '?')}]:"  # as journalctl prints it
            where = " ".join(p for p in (origin, entry.get("_HOSTNAME", ""), who) if p)
            line = proflines.parse_line(message, where)
            if line is not None:
                when = int(entry.get("__REALTIME_TIMESTAMP", 0)) / 1e6
                (out.before if when < start else out.inside).append(line)
        return out


def _json(raw: str) -> dict:
    import json

    try:
        entry = json.loads(raw)
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


def _rfc3339(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(stamp: str) -> float | None:
    """Seconds since the epoch of docker's RFC 3339 stamp (nanoseconds, Z or an offset)."""
    from datetime import datetime

    head, _, rest = stamp.partition(".")
    frac = "".join(c for c in rest[:9] if c.isdigit()) if rest else ""
    zone = rest[len(frac) :] if rest else head[19:]
    try:
        when = datetime.fromisoformat(head[:19] + (zone.replace("Z", "+00:00") or "+00:00"))
    except ValueError:
        return None
    return when.timestamp() + (float(f"0.{frac}") if frac else 0.0)


class Docker(_Queried):
    """A container's log, through `docker logs --timestamps` (stdout and stderr)."""

    KIND, BINARY = "docker", "docker"

    def finish(self, origin: str, start: float, end: float) -> Lines:
        argv = ["docker", "logs", "--timestamps", "--since", _rfc3339(start - self.lookback)]
        stdout, stderr = _run([*argv, "--until", _rfc3339(end), self.name], self.label)
        where = " ".join(p for p in (origin, self.name) if p)
        stamped = []
        for raw in (stdout + "\n" + stderr).splitlines():
            stamp, _, message = raw.partition(" ")
            when = _epoch(stamp)
            line = proflines.parse_line(message, where) if when is not None else None
            if line is not None:
                stamped.append((when, line))
        stamped.sort(key=lambda pair: pair[0])  # the two streams, merged in time
        out = Lines()
        for when, line in stamped:
            (out.before if when < start else out.inside).append(line)
        return out


def source_of(source: Any, lookback: float = 3600.0):
    """A FileLog, Journal or Docker for what a probe names (see the module's docstring)."""
    if isinstance(source, (FileLog, Journal, Docker)):
        return source
    if isinstance(source, dict) and len(source) == 1:
        ((kind, value),) = source.items()
        source = f"{kind}:{value}" if kind in ("journal", "docker") else value if kind == "file" else source
    if isinstance(source, str) and source.startswith(("journal:", "docker:")):
        kind, _, name = source.partition(":")
        if not name:
            raise UserError(f"profile_window: {source!r} names no {'unit' if kind == 'journal' else 'container'}")
        return Journal(name, lookback) if kind == "journal" else Docker(name, lookback)
    if isinstance(source, (str, os.PathLike)):
        return FileLog(source)
    if hasattr(source, "log_path"):
        if source.log_path is None:
            raise UserError(
                f"profile_window: {source!r} has no log here (a server this probe did not start); "
                "name its log: a path, 'journal:UNIT' or 'docker:CONTAINER'"
            )
        return FileLog(source.log_path)
    raise UserError(
        f"profile_window: cannot read profile lines from {source!r}; give a log path, a server, "
        "'journal:UNIT', 'docker:CONTAINER' or a list of these"
    )


ASKED_S = 0.3  # how long a report asked for with SIGUSR1 takes to land, from an idle server


def _settle(source: Any) -> float:
    """Enough for one report of the server this probe started: ASKED_S when it reports when asked
    (`source.report()`), else 1.5 x its periodic interval, or 0."""
    if callable(getattr(source, "report", None)) and source.report(dry=True):
        return ASKED_S
    env = getattr(source, "env", None)
    try:
        interval = seconds(env.get("PERFKIT_PROFILE_INTERVAL")) if isinstance(env, dict) else None
    except ValueError:
        interval = None
    return 1.5 * interval + 0.1 if interval else 0.0


class ProfileWindow:
    """The profile lines a source gained while the block ran (see `profile_window`)."""

    def __init__(self, source: Any, *, settle: float | None = None, lookback: float = 3600.0) -> None:
        many = isinstance(source, (list, tuple))
        given = list(source) if many else [source]
        self._given = given
        self.sources = [source_of(s, lookback) for s in given]
        self._origins = [s.label if many else "" for s in self.sources]
        self.settle = max(_settle(s) for s in given) if settle is None else settle
        self.start = self.end = math.nan
        self.lines = Lines()

    def _ask(self) -> None:
        """Ask every source that can (a server this probe started) for a report now."""
        for source in self._given:
            if callable(getattr(source, "report", None)):
                source.report()

    def __enter__(self) -> ProfileWindow:
        self._ask()
        time.sleep(self.settle)  # a report of the quiet before the load lands before the window
        for s, origin in zip(self.sources, self._origins, strict=True):
            s.begin(origin)
        self.start = time.time()
        return self

    def __exit__(self, failed: type | None, *exc: object) -> None:
        if failed is not None:  # the load failed: its error, not the log's, is the one to see
            for s in self.sources:
                s.close()
            return
        self._ask()
        time.sleep(self.settle)  # the report of the load's last calls lands inside
        self.end = time.time()
        for s, origin in zip(self.sources, self._origins, strict=True):
            got = s.finish(origin, self.start, self.end)
            self.lines.before += got.before
            self.lines.inside += got.inside
            self.lines.notes += got.notes

    def figures(self) -> dict[str, list[ProfLine]]:
        """Per name, each process's calls in the window (`proflines.difference`)."""
        if math.isnan(self.end):
            raise UserError("profile_window: the window is still open; record after the `with` block")
        return proflines.difference(self.lines.before, self.lines.inside)

    def describe(self) -> str:
        where = ", ".join(s.label for s in self.sources)
        return f"{len(self.lines.inside)} profile lines in a {self.end - self.start:.1f} s window of {where}"

    def record(
        self, names: list[str] | None = None, *, at: dict[str, Any] | None = None, prefix: str = ""
    ) -> list[str]:
        """`perfkit.record_profile_lines(self, names=names, at=at, prefix=prefix)`: the metric names recorded."""
        from perfkit.probe.recording import record_profile_lines

        return record_profile_lines(self, names=names, at=at, prefix=prefix)


def profile_window(source: Any, *, settle: float | None = None, lookback: float = 3600.0) -> ProfileWindow:
    """A window over `source`'s profile lines: `with profile_window(server) as w: ...`, then `w.record(...)`.

    `source`: a log path, a server with `.log_path`, `"journal:UNIT"`, `"docker:CONTAINER"`, a
    `{"journal": UNIT}`-style dict, or a list of these. `settle` seconds are waited before the
    window opens and before it closes, so that a periodic report lands at each edge; by default
    1.5 x the PERFKIT_PROFILE_INTERVAL of a server this probe started (`Server(env=...)`), else 0:
    give a bit more than the server's interval for one started elsewhere. `lookback`: how far
    before the window a journal or a container's log is read for each process's baseline line.
    `w.record(names, prefix=, at=)` (the same as `perfkit.record_profile_lines(w, ...)`) records
    the window's figures.
    """
    return ProfileWindow(source, settle=settle, lookback=lookback)
