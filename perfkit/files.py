"""Every file perfkit writes: atomically, as stable text, and for JSON with a `format_version`.

One writer (temporary file + rename) so that readers see the old or the new content, never a torn
one; one JSON spelling (sorted keys, one-space indent, a newline at the end, no NaN) so that the
same data gives the same bytes; one version key, `format_version`, read back by `read_versioned`,
which upgrades older files step by step and refuses newer ones with a message.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfkit.errors import RecordError

VERSION_KEY = "format_version"
#: JSON has no NaN or infinity; they are stored as these strings.
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode_number(value: float) -> float | str:
    """A float as JSON can hold it: NaN and infinities become "nan", "inf", "-inf"."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def decode_number(value: float | int | str) -> float:
    """The inverse of `encode_number`; any other string is a ValueError."""
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a number: {value!r}")
        return _NON_FINITE[value]
    return float(value)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a write to a full disk names no file: name it
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def dumps(data: Any) -> str:
    """Stable JSON text: sorted keys, fixed indentation, newline at the end, no NaN."""
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: Path, data: dict[str, Any], *, version: int) -> None:
    """`data` with its `format_version`, written atomically as stable JSON."""
    write_atomic(path, dumps({**data, VERSION_KEY: version}))


def read_json(path: Path, shown: str | None = None) -> Any:
    """Parsed JSON, or a RecordError naming the file (and line) when it cannot be read."""
    shown = shown or str(path)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read: {exc}", path=shown) from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc.msg}", path=shown, line=exc.lineno) from None
    except RecursionError:
        raise RecordError("nested too deep to read; no perfkit file is", path=shown) from None
    except ValueError as exc:  # an integer of over 4,300 digits
        why = "an integer of over 4,300 digits" if "digits" in str(exc) else str(exc)[:120]
        raise RecordError(f"not readable JSON: {why}", path=shown) from None


def upgrade(
    data: Any, shown: str, *, current: int, upgrades: dict[int, Callable[[dict], dict]] | None = None
) -> dict[str, Any]:
    """A parsed versioned file brought to `current`: upgraded by `upgrades[n]` (n -> n + 1), or refused."""
    if not isinstance(data, dict):
        raise RecordError("expected a JSON object", path=shown)
    version = data.get(VERSION_KEY)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"missing or invalid {VERSION_KEY}: {version!r}", path=shown, field=VERSION_KEY)
    if version > current:
        raise RecordError(
            f"{VERSION_KEY} {version} is newer than this perfkit understands ({current}); upgrade perfkit",
            path=shown,
            field=VERSION_KEY,
        )
    while version < current:
        step = (upgrades or {}).get(version)
        if step is None:
            raise RecordError(f"no upgrade from {VERSION_KEY} {version}", path=shown, field=VERSION_KEY)
        try:
            data = step(data)
        except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:  # not shaped as that format
            raise RecordError(
                f"not a {VERSION_KEY} {version} file to upgrade ({type(exc).__name__}: {str(exc)[:80]})", path=shown
            ) from None
        version += 1
        data[VERSION_KEY] = version
    return data


def read_versioned(
    path: Path, shown: str | None = None, *, current: int, upgrades: dict[int, Callable[[dict], dict]] | None = None
) -> dict[str, Any]:
    """`read_json` then `upgrade`."""
    shown = shown or str(path)
    return upgrade(read_json(path, shown), shown, current=current, upgrades=upgrades)


class Reader:
    """Typed access to a parsed JSON object that names the file and field on any mismatch."""

    def __init__(self, data: Any, path: str, where: str = ""):
        if not isinstance(data, dict):
            raise RecordError(f"expected an object, got {type(data).__name__}", path=path, field=where or None)
        self.data, self.path, self.where = data, path, where

    def field(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, types: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise RecordError("missing", path=self.path, field=self.field(key))
        value = self.data[key]
        if value is None and optional:
            return None
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise RecordError(f"expected {types}, got a boolean", path=self.path, field=self.field(key))
        if not isinstance(value, types):
            raise RecordError(f"expected {types}, got {type(value).__name__}", path=self.path, field=self.field(key))
        return value

    def number(self, key: str, *, optional: bool = False, nan: bool = True) -> float | None:
        value = self.get(key, (int, float, str), optional=optional)
        if value is None:
            return None
        try:
            number = decode_number(value)
        except (ValueError, OverflowError):  # OverflowError: an integer no float can hold
            shown = repr(value)[:40]
            raise RecordError(f"expected a number, got {shown}", path=self.path, field=self.field(key)) from None
        if not nan and math.isnan(number):
            raise RecordError("expected a number, got NaN", path=self.path, field=self.field(key))
        return number

    def unit(self, key: str, *, optional: bool = False) -> str | None:
        """A unit perfkit knows (a hand-edited `furlongs` is refused on read)."""
        from perfkit import units

        value = self.get(key, str, optional=optional)
        if value is not None and not units.is_unit(value):
            raise RecordError(f"unknown unit {value!r}", path=self.path, field=self.field(key))
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.get(key, str)
        if value not in choices:
            raise RecordError(
                f"expected one of {', '.join(choices)}, got {value!r}", path=self.path, field=self.field(key)
            )
        return value

    def child(self, key: str, *, optional: bool = False) -> Reader | None:
        value = self.get(key, dict, optional=optional)
        return None if value is None else Reader(value, self.path, self.field(key))

    def children(self, key: str) -> list[Reader]:
        return [Reader(item, self.path, f"{self.field(key)}[{i}]") for i, item in enumerate(self.get(key, list))]
