"""The environment variables perfkit reads, each in its declared form; a value outside it is refused with
one line naming the variable (or, in a process perfkit does not own, such as a profiled server, ignored
with one line), never taken raw.

    PERFKIT_MACHINE_ID          an id: 1-128 letters, digits or . _ : @ + - (it names rows of the ledger)
    PERFKIT_ROOT                a folder: the project (paths.py), refused when it is not a directory
    PERFKIT_CACHE_DIR           a folder: the bandwidth cache (machine/bandwidth.py; ~/.cache/perfkit)
    PERFKIT_CODE_ROOT           a folder: the code a probe's kernel imports (set by `perfkit run`, run/kernel.py)
    PERFKIT_OUTPUT_CAP          a whole number from 1 to 10^12: characters a probe may print (set by `perfkit run`)
    PERFKIT_PROFILE             1, true, yes or on: spans time (probe/spans.py)
    PERFKIT_PROFILE_EVERY       a whole number from 1 to 10^9: a span's line every N calls
    PERFKIT_PROFILE_INTERVAL    seconds, positive and finite (probe/reports.py)
    PERFKIT_SERVE_PARENT        a pid: the served engine stops when that process is gone (set by probe/servers.py)
    PERFKIT_TORCH_PROFILE       set by `perfkit run --profile torch` for its kernels (run/profiling.py)

A folder is a path of at most PATH_MAX characters, without control characters, that is a directory
or absent (a file there is refused: nothing perfkit writes may replace it).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from perfkit.errors import UserError
from perfkit.text import one_line

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
SHOWN = 40  # characters of a refused value shown back


def _shown(value: str) -> str:
    return "'" + one_line(value[:SHOWN]) + ("..." if len(value) > SHOWN else "") + "'"


def identifier(name: str) -> str | None:
    """$name as an id (1-128 letters, digits or . _ : @ + -), None when unset or blank; else a UserError."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not _ID.fullmatch(value):
        raise UserError(
            f"${name}: expected an id of 1 to 128 letters, digits or . _ : @ + - "
            f"({len(value)} characters given), got {_shown(value)}"
        )
    return value


def count_or_default(name: str, default: int, *, high: int = 10**9) -> int:
    """$name as a whole number from 1 to `high`; `default` when unset, and when not (said once, on stderr:
    a process perfkit does not own keeps running)."""
    value = count_or_none(name, high=high)
    return default if value is None else value


def count_or_none(name: str, *, high: int = 10**12) -> int | None:
    """$name as a whole number from 1 to `high`; None when unset, and when not (said once, on stderr)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit() and 1 <= int(value) <= high:
        return int(value)
    print(f"perfkit: ignoring ${name}={_shown(value)}: expected a whole number from 1 to {high}", file=sys.stderr)
    return None


PATH_MAX = 4096


def folder(name: str, *, strict: bool = True) -> Path | None:
    """$name as a folder (a directory, or absent), None when unset or blank. Outside its form: a UserError
    naming the variable, or with strict=False (a process perfkit does not own, such as a kernel in
    JupyterLab) None, said once on stderr."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    why = _not_a_folder(value)
    if why is None:
        return Path(value)
    if strict:
        raise UserError(f"${name}: expected a folder, got {_shown(value)}: {why}")
    print(f"perfkit: ignoring ${name}={_shown(value)}: {why}", file=sys.stderr)
    return None


def _not_a_folder(value: str) -> str | None:
    if len(value) > PATH_MAX:
        return f"{len(value)} characters, more than {PATH_MAX}"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds control characters"
    try:
        value.encode()
    except UnicodeEncodeError:
        return "it is not UTF-8"
    path = Path(value)
    try:
        if path.exists() and not path.is_dir():
            return "it is not a directory"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None
