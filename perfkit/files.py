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
    """Write a file so that readers see the old or the new content, never a torn one. Text is written as
    UTF-8; a lone surrogate in it (a server's JSON said "\\udcff", a byte of the environment that was not
    UTF-8) as its escape `\\udcff`, which a JSON reader reads back as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "backslashreplace")
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


def output_file(path: Path, flag: str) -> Path:
    """`path`, named by the user for perfkit to write (`--junit FILE`), when it is a regular file or absent
    in a folder that exists; otherwise a UserError naming the flag. What a rename would replace (a
    symbolic link, a device such as /dev/null, a pipe, a socket) or cannot (a folder) is refused before
    anything runs, never written through."""
    from perfkit.errors import UserError

    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{flag} {path}: a symbolic link is there; name a regular file (it is replaced) or a new one")
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a device, a pipe or a socket)"
        raise UserError(f"{flag} {path}: {kind} is there; name a regular file (it is replaced) or a new one")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {path}: its folder {path.parent} does not exist")
    return path


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

    def number(
        self, key: str, *, optional: bool = False, nan: bool = True, within: tuple[float, float] | None = None
    ) -> float | None:
        """A number (NaN and infinities as stored); `within`: (low, high) its meaning allows, both included
        (a share, a confidence level, seconds), NaN refused with it."""
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
        if within is not None and not within[0] <= number <= within[1]:  # NaN fails both
            low, high = within
            raise RecordError(
                f"expected a number from {low:g} to {high:g}, got {number:g}", path=self.path, field=self.field(key)
            )
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
