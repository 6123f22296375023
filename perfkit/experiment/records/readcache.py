"""The results files as read before: a cache, so that a ledger of thousands of runs reads one file.

`runs/.cache/results.pickle` holds each results file's parsed and validated `RunResults`, with the
file's size, modification time and inode; a file whose stat differs is read and validated again, and
a file gone is dropped. What comes out is what reading the files would give: the ledger is the same
bytes with or without it (tests/test_changes.py).

A pickle can run code when loaded, so the cache is signed: HMAC-SHA256 with a key of this user's
(`cache.key` in $PERFKIT_CACHE_DIR or ~/.cache/perfkit, made once, mode 0600). A cache the key did not
sign (someone else's, a copied runs/ folder, a torn write) is never unpickled, and one written by
other code of perfkit's (its records modules differ) is rebuilt. Without a key (a home that cannot be
written), nothing is cached and every file is read.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import os
import pickle
import secrets
from pathlib import Path
from typing import Any

from perfkit import paths
from perfkit.files import write_atomic

KEY_BYTES = 32
_CODE: str | None = None


def _code() -> str:
    """What the pickled classes are: a hash of the records modules' source (and so of their fields)."""
    global _CODE
    if _CODE is None:
        digest = hashlib.sha256()
        for path in sorted(Path(__file__).parent.rglob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        _CODE = digest.hexdigest()
    return _CODE


def _key() -> bytes | None:
    """This user's key, made on first use; None when it cannot be read or made."""
    path = paths.cache_dir() / "cache.key"
    try:
        key = path.read_bytes()
        if len(key) == KEY_BYTES and (path.stat().st_mode & 0o077) == 0:
            return key
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".key.tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES))
        os.replace(path.with_suffix(".key.tmp"), path)
        return path.read_bytes()
    except OSError:
        return None


def _stat(path: Path) -> tuple[int, int, int]:
    s = path.stat()
    return s.st_size, s.st_mtime_ns, s.st_ino


class Cache:
    """The parsed results of a project's results files, by file name."""

    def __init__(self, where: Path) -> None:
        self.path = where / ".cache" / "results.pickle"
        self.key = _key()
        self.entries: dict[str, tuple[tuple[int, int, int], Any]] = self._load()
        self.changed = False

    def _load(self) -> dict[str, tuple[tuple[int, int, int], Any]]:
        if self.key is None:
            return {}
        try:
            blob = self.path.read_bytes()
        except OSError:
            return {}
        mac, payload = blob[:32], blob[32:]
        if len(mac) != 32 or not hmac.compare_digest(mac, hmac.new(self.key, payload, hashlib.sha256).digest()):
            return {}  # not signed by this user's key: never unpickled
        collecting = gc.isenabled()
        gc.disable()  # millions of small objects at once: the cyclic collector would walk them again and again
        try:
            code, entries = pickle.loads(payload)
        except Exception:  # signed, yet not readable by this Python: read the files again
            return {}
        finally:
            if collecting:
                gc.enable()
        return entries if code == _code() and isinstance(entries, dict) else {}

    def get(self, path: Path) -> Any | None:
        found = self.entries.get(path.name)
        return found[1] if found is not None and found[0] == _stat(path) else None

    def put(self, path: Path, parsed: Any) -> None:
        self.entries[path.name] = (_stat(path), parsed)
        self.changed = True

    def keep_only(self, names: set[str]) -> None:
        gone = set(self.entries) - names
        for name in gone:
            del self.entries[name]
        self.changed = self.changed or bool(gone)

    def save(self) -> None:
        """Written when something changed, signed; a folder that cannot be written leaves it unwritten."""
        if self.key is None or not self.changed:
            return
        payload = pickle.dumps((_code(), self.entries), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            write_atomic(self.path, hmac.new(self.key, payload, hashlib.sha256).digest() + payload)
        except OSError:
            pass
