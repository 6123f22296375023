"""Replicates on a server the run did not start: windows of requests on one running process.

A probe given a `server_url` drives a server that outlives its replicates. Each replicate is then a
window of requests on that server's process, not a process of its own, and the run treats it so:

- one window at a time on each server: two at once would each measure the other's load;
- a cool-down (`COOLDOWN_S`) after a window before the next opens on the same server, so the queue,
  the batcher and the server's background work from one window settle before the next; the windows
  of all probes already come in the round's shuffled order;
- the server's process is read at each window's edges (`served.instance`: its model and engine, the
  pid and rank pids `perfkit engine serve` gives, the `process_start_time_seconds` vLLM and
  prometheus_client export) and kept with the replicate (`server_instance`).

Judging reads those readings back (`judged`): windows of one process share its state (its caches,
allocator, compiled graphs, whatever earlier requests left), so their spread is not a process-to-
process spread, and the verdict says so; a restart between or inside windows is named; a server
whose model or engine changed between windows measured two servers, and the verdict is inconclusive.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from perfkit.experiment.records import served
from perfkit.experiment.records.results import Execution

__all__ = ["COOLDOWN_S", "Windows", "judged"]

COOLDOWN_S = 2.0
FAILING_S = 10.0  # seconds of reads at the edges that a server which does not answer may take from a run, in all


def url_of(planned: Execution) -> str | None:
    """The URL of the running server an execution drives, None when it drives none or starts its own."""
    server = planned.server or {}
    return None if server.get("started_by_probe") or not server.get("url") else str(server["url"])


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def local_processes(url: str, reading: dict[str, Any]) -> tuple[int, ...]:
    """The processes of a server on this machine: what listens on the URL's port (when its host is this
    machine's loopback), and the pids it reports itself; () for a server elsewhere. Their load is the
    measurement's own, so the fitness check does not count it as another job's."""
    where = urllib.parse.urlsplit(url)
    if (where.hostname or "") not in LOOPBACK:
        return ()
    import psutil  # not at the top: judging imports this module, and a review job (perfkit[review]) has no psutil

    port = where.port or (443 if where.scheme == "https" else 80)
    found = {reading["pid"]} if isinstance(reading.get("pid"), int) else set()
    found |= {p for p in reading.get("pids") or () if isinstance(p, int)}
    try:
        found |= {
            c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port and c.pid
        }
    except (psutil.AccessDenied, OSError):  # not root on some systems: the reported pids only
        pass
    return tuple(sorted(found))


class Windows:
    """The run's windows on running servers: one at a time per server, cooled down, read at the edges."""

    def __init__(self, cooldown_s: float = COOLDOWN_S, read=served.instance, failing_s: float = FAILING_S) -> None:
        """`read(url, timeout=s)`: a reading of the server (served.instance). A server that does not answer
        (it drips, hangs, floods) takes at most `failing_s` of the run in all, not a deadline per edge:
        its later edges are read within what is left, and not at all once it is spent."""
        self.cooldown_s, self._read, self.failing_s = cooldown_s, read, failing_s
        self._lock = threading.Lock()
        self._servers: dict[str, threading.Lock] = {}
        self._ended: dict[str, float] = {}
        self._failing: dict[str, float] = {}  # seconds spent on reads of the server that got no answer

    def _reading(self, url: str) -> dict[str, Any]:
        left = self.failing_s - self._failing.get(url, 0.0)
        if left <= 0.05:
            return {"unreachable": f"not read: it gave no answer in {self.failing_s:g} s of this run's reads"}
        t0 = time.monotonic()
        got = self._read(url, timeout=min(served.TIMEOUT_S, left))
        if "unreachable" in got:
            self._failing[url] = self._failing.get(url, 0.0) + time.monotonic() - t0
        return {**got, "at": time.time()}

    @contextmanager
    def window(self, planned: Execution, say=None) -> Iterator[dict[str, Any] | None]:
        """Around one replicate: yields the dict its `server_instance` is (filled at both edges), or None
        when it drives no running server."""
        url = url_of(planned)
        if url is None:
            yield None
            return
        with self._lock:
            one_at_a_time = self._servers.setdefault(url, threading.Lock())
        with one_at_a_time:
            rest = self._ended.get(url, -float("inf")) + self.cooldown_s - time.monotonic()
            if rest > 0:
                time.sleep(rest)
            reading = {"before": self._reading(url)}
            try:
                yield reading
            finally:
                reading["after"] = self._reading(url)
                self._ended[url] = time.monotonic()


def _processes(readings: list[dict[str, Any]]) -> list[tuple] | None:
    """What tells one process of a server from another, for every reading alike: the start time when
    every reading has it, else the pids when every one has them; None when the readings cannot tell."""
    if all("start_time" in r for r in readings):
        return [("started", r["start_time"]) for r in readings]
    if all("pid" in r for r in readings):
        return [("pid", r["pid"], tuple(r.get("pids") or ())) for r in readings]
    return None


def _who(reading: dict[str, Any]) -> tuple:
    """What a server is (its model and engine), not which process of it answers."""
    return reading.get("model"), repr(reading.get("engine"))


def _said(process: tuple) -> str:
    if process[0] == "started":
        return f"started at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(process[1]))} UTC"
    return f"pid {process[1]}"


def judged(executions: list[Execution]) -> tuple[str | None, list[str]]:
    """(why the verdict cannot stand, warnings) for replicates that were windows on running servers."""
    by_url: dict[str, list[Execution]] = {}
    for x in executions:
        url = url_of(x)
        if url is not None and x.server_instance:
            by_url.setdefault(url, []).append(x)
    problem, warnings = None, []
    for url, windows in sorted(by_url.items()):
        edges = [(x.replicate, x.server_instance.get(side) or {}) for x in windows for side in ("before", "after")]
        edges.sort(key=lambda edge: edge[1].get("at", 0.0))  # in the order they were read (replicates run shuffled)
        dead = [(r, e["unreachable"]) for r, e in edges if "unreachable" in e]
        seen = [(r, e) for r, e in edges if "unreachable" not in e]
        first = seen[0][1] if seen else {}
        other = next((e for _, e in seen if _who(e) != _who(first)), None)
        if other is not None:
            change = served.change({"url": url, **first}, {"url": url, **other})
            problem = f"the server at {url} changed between its windows ({change}): the replicates measured two servers"
        if dead:
            warnings.append(f"the server at {url} did not answer at the edge of replicate {dead[0][0]}: {dead[0][1]}")
        if not seen:  # it never answered: which of its processes ran the windows is not known
            continue
        told = _processes([e for _, e in seen])
        if told is None:
            warnings.append(
                f"the {len(windows)} replicates are windows of requests on the running server at {url}; it says "
                "neither its start time (process_start_time_seconds in /metrics) nor its pids, so a restart between "
                "windows cannot be told"
            )
            continue
        processes = list(zip([r for r, _ in seen], told))
        distinct = list(dict.fromkeys(told))
        if len(distinct) == 1:
            warnings.append(
                f"the {len(windows)} replicates are windows of requests on one process of the server at {url} "
                f"({_said(distinct[0])}), not processes of their own: they share its state (caches, allocator, "
                "compiled graphs, what earlier requests left), so their spread is not a process-to-process spread"
            )
            continue
        restarts = []
        for (r0, p0), (r1, p1) in zip(processes, processes[1:]):
            if p0 != p1:
                where = f"inside replicate {r1}" if r0 == r1 else f"between replicates {r0} and {r1}"
                restarts.append(f"{where} ({_said(p0)} -> {_said(p1)})")
        warnings.append(f"the server at {url} restarted " + "; ".join(restarts))
    return problem, warnings
