"""The environment variables perfkit reads, each in its declared form; a value outside it is refused with
one line naming the variable (or, in a process perfkit does not own, such as a profiled server, ignored
with one line), never taken raw.

    PERFKIT_MACHINE_ID        an id: 1-128 letters, digits or . _ : @ + - (it names rows of the ledger)
    PERFKIT_ROOT              a folder (paths.py)
    PERFKIT_PROFILE           1, true, yes or on: spans time (probe/spans.py)
    PERFKIT_PROFILE_EVERY     a whole number from 1 to 10^9: a span's line every N calls
    PERFKIT_PROFILE_INTERVAL  seconds, positive and finite (probe/reports.py)
"""

from __future__ import annotations

import os
import re
import sys

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
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value.isascii() and value.isdigit() and 1 <= int(value) <= high:
        return int(value)
    print(f"perfkit: ignoring ${name}={_shown(value)}: expected a whole number from 1 to {high}", file=sys.stderr)
    return default
