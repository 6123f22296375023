"""What an executed probe notebook says: the records it displayed, when each cell ran, where it stopped.

Read from papermill's output (its per-cell metadata) and perfkit's own display payloads, for a run's
replicate (execute.py), a heartbeat of one still running (schedule.py) and `perfkit judge` of a
notebook executed by hand (manual.py).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from perfkit.errors import RecordError
from perfkit.files import VERSION_KEY, Reader
from perfkit.samples import FORMAT_VERSION as SAMPLES_VERSION
from perfkit.samples import MIMETYPE, MetricRecord


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            text = line.strip()
            return text if len(text) <= 60 else text[:57] + "..."
    return ""


def cell_words(index: int, source: str) -> str:
    line = _first_line(source)
    return f"cell {index} (`{line}`)" if line else f"cell {index}"


def read_notebook(path: Path):
    """The executed notebook, or None when there is none (or it was torn by a kill)."""
    import nbformat

    try:
        return nbformat.read(str(path), as_version=4)
    except (OSError, ValueError, json.JSONDecodeError):
        return None


def records_in(nb, shown: str = "executed notebook") -> list[MetricRecord]:
    """Every perfkit record displayed in an executed notebook, in order."""
    out = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") not in ("display_data", "execute_result"):
                continue
            payload = output.get("data", {}).get(MIMETYPE)
            if payload is None:
                continue
            where = f"cells[{index}]"
            records = payload.get("records") if isinstance(payload, dict) else None
            version = payload.get(VERSION_KEY) if isinstance(payload, dict) else None
            if not isinstance(records, list):
                raise RecordError("a perfkit output without a list of records", path=shown, field=where)
            if version not in range(1, SAMPLES_VERSION + 1) or isinstance(version, bool):  # a newer perfkit's?
                raise RecordError(
                    f"records of format {version!r}; this perfkit reads 1 to {SAMPLES_VERSION}", path=shown
                )
            for i, item in enumerate(records):
                out.append(MetricRecord.from_json(Reader(item, shown, f"{where}.records[{i}]")))
    return out


def cell_times(nb) -> list[tuple[str, float, float]]:
    """(label, start, end) per executed cell, from papermill's metadata; a running cell ends now."""
    out = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("papermill", {})
        start = _epoch(meta.get("start_time"))
        if start is None:
            continue
        end = _epoch(meta.get("end_time")) or time.time()
        out.append((f"cell {index}", start, end))
    return out


def setup_seconds(nb, launched_at: float) -> float | None:
    """What a replicate cost before its first measuring cell (the first that displayed a perfkit record):
    the process and kernel starting, the imports, building the engine or starting a server."""
    for cell in nb.cells:
        shown = any(MIMETYPE in o.get("data", {}) for o in cell.get("outputs", []))
        start = _epoch(cell.get("metadata", {}).get("papermill", {}).get("start_time"))
        if shown and start is not None:
            return round(max(0.0, start - launched_at), 3)
    return None


def last_started_cell(nb) -> tuple[int, str] | None:
    """The last cell papermill started: the one running when a kernel died or time ran out."""
    found = None
    for index, cell in enumerate(nb.cells):
        if cell.get("metadata", {}).get("papermill", {}).get("start_time"):
            found = (index, cell.get("source", ""))
    return found
