"""Text every machine has: the Python standard library's own source, as bytes.

The corpus is the top-level `*.py` modules of `sysconfig.get_paths()["stdlib"]` (present in
every CPython 3.11 install), in sorted order. A file is held out when the CRC-32 of its name is
divisible by `HELDOUT_EVERY`: the split depends on file names only, so it is the same on every
machine and no held-out byte is ever trained on. The vocabulary is the 256 byte values.
"""

from __future__ import annotations

import functools
import os
import sysconfig
import zlib

from perfkit.errors import UserError

__all__ = ["VOCAB_SIZE", "encode", "decode", "corpus_files", "training_text", "heldout_text", "sample_prompts"]

VOCAB_SIZE = 256
HELDOUT_EVERY = 8


def encode(text: str | bytes) -> list[int]:
    """Byte ids of `text` (UTF-8 for str)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    return list(text)


def decode(tokens: list[int]) -> str:
    """Text of byte ids; invalid UTF-8 (a generation cut mid-character) is replaced, not raised."""
    return bytes(tokens).decode("utf-8", errors="replace")


def corpus_files() -> tuple[list[str], list[str]]:
    """(training, held-out) absolute paths, each sorted by file name."""
    root = sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise UserError(f"the Python standard library source was not found at {root}")
    names = sorted(n for n in os.listdir(root) if n.endswith(".py") and os.path.isfile(os.path.join(root, n)))
    train, held = [], []
    for name in names:
        (held if zlib.crc32(name.encode()) % HELDOUT_EVERY == 0 else train).append(os.path.join(root, name))
    return train, held


def _read(paths: list[str]) -> bytes:
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            parts.append(f.read())
    return b"\n".join(parts)


@functools.lru_cache(maxsize=1)
def training_text() -> bytes:
    """The training corpus, files joined by a newline."""
    return _read(corpus_files()[0])


@functools.lru_cache(maxsize=1)
def heldout_text() -> bytes:
    """Bytes never used in training (the held-out files), for prompts and accuracy."""
    return _read(corpus_files()[1])


def sample_prompts(n: int, length: int, *, source: bytes | None = None, seed: int = 0) -> list[list[int]]:
    """`n` deterministic prompts of `length` bytes cut from `source` (held-out text by default).

    Prompts start at the beginning of a line so they look like what a user would feed a model.
    """
    text = heldout_text() if source is None else source
    if len(text) < length + 1:
        raise UserError(f"source text has {len(text)} bytes, fewer than a {length}-byte prompt")
    prompts = []
    span = len(text) - length
    for i in range(n):
        # A fixed stride through the text (golden-ratio spacing), moved to the next line start.
        start = int(((seed + i + 1) * 0.6180339887498949 % 1.0) * span)
        newline = text.find(b"\n", start, start + 512)
        if newline != -1 and newline + 1 <= span:
            start = newline + 1
        prompts.append(list(text[start : start + length]))
    return prompts
