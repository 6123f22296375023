"""Every file perfkit writes: atomically, as stable text, and for JSON with a `format_version`.

One writer (temporary file + rename) so that readers see the old or the new content, never a torn
one; one JSON spelling (sorted keys, one-space indent, a newline at the end, no NaN) so that the
same data gives the same bytes; one version key, `format_version`, read back by `read_versioned`,
which upgrades older files step by step and refuses newer ones with a message.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from perfkit.errors import RecordError

VERSION_KEY = "format_version"


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
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
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
        data = step(data)
        version += 1
        data[VERSION_KEY] = version
    return data


def read_versioned(
    path: Path, shown: str | None = None, *, current: int, upgrades: dict[int, Callable[[dict], dict]] | None = None
) -> dict[str, Any]:
    """`read_json` then `upgrade`."""
    shown = shown or str(path)
    return upgrade(read_json(path, shown), shown, current=current, upgrades=upgrades)
