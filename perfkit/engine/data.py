"""Text every machine has, in two kinds, as bytes: the Python standard library's code and prose.

- `code`: the top-level `*.py` modules of `sysconfig.get_paths()["stdlib"]` (present in every
  CPython 3.11 install), in sorted order. A file is held out when the CRC-32 of its name is
  divisible by `HELDOUT_EVERY`.
- `prose`: the language reference and library documentation that `pydoc` shows offline, the
  string values of `pydoc_data/topics.py`, cut into sections at their reST headings. A topic
  repeats sections of others (`compound` holds `for`, `try`, ...), so the unit is the section
  title: every version of one title goes to the same side, exact repeats once, and a section is
  held out when the CRC-32 of its title is divisible by `HELDOUT_EVERY` (about 55 kB of 370 kB).
  The sections keep the reference's indented grammar and code examples, as a chat answer would.

Either split depends on names only, so it is the same on every machine and no held-out byte is
ever trained on. The vocabulary is the 256 byte values.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
import zlib

from perfkit.errors import UserError

__all__ = [
    "VOCAB_SIZE",
    "KINDS",
    "encode",
    "decode",
    "corpus_files",
    "prose_sections",
    "training_text",
    "heldout_text",
    "sample_prompts",
]

VOCAB_SIZE = 256
HELDOUT_EVERY = 8
KINDS = ("code", "prose")

# A reST heading: a line, then a line of one underline character as long as it (checked in code).
_HEADING = re.compile(r"^(\S[^\n]*)\n([*=\-])\2{2,}\n", re.M)


def encode(text: str | bytes) -> list[int]:
    """Byte ids of `text` (UTF-8 for str)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    return list(text)


def decode(tokens: list[int]) -> str:
    """Text of byte ids; invalid UTF-8 (a generation cut mid-character) is replaced, not raised."""
    return bytes(tokens).decode("utf-8", errors="replace")


def _held(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELDOUT_EVERY == 0


def _stdlib() -> str:
    root = sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise UserError(f"the Python standard library source was not found at {root}")
    return root


def corpus_files() -> tuple[list[str], list[str]]:
    """The code kind's (training, held-out) absolute paths, each sorted by file name."""
    root = _stdlib()
    names = sorted(n for n in os.listdir(root) if n.endswith(".py") and os.path.isfile(os.path.join(root, n)))
    train, held = [], []
    for name in names:
        (held if _held(name) else train).append(os.path.join(root, name))
    return train, held


@functools.lru_cache(maxsize=1)
def prose_sections() -> tuple[dict[str, str], dict[str, str]]:
    """The prose kind's (training, held-out) sections, each {title: text} in first-seen order
    (topics sorted by name, sections in reading order)."""
    path = os.path.join(_stdlib(), "pydoc_data", "topics.py")
    try:
        with open(path, "rb") as f:
            module = ast.parse(f.read())
        topics = next(ast.literal_eval(n.value) for n in module.body if isinstance(n, ast.Assign))
    except (OSError, SyntaxError, ValueError, StopIteration) as exc:
        raise UserError(f"the standard library's pydoc topics (prose) could not be read from {path}: {exc}") from exc
    versions: dict[str, list[str]] = {}
    for topic in sorted(topics):
        body = topics[topic]
        heads = [m for m in _HEADING.finditer(body) if len(m.group(0)) == 2 * len(m.group(1)) + 2]
        starts = [m.start() for m in heads]
        titles = [m.group(1) for m in heads]
        if not starts or starts[0] != 0:  # text before the first heading: titled by its topic
            starts, titles = [0, *starts], [topic, *titles]
        for i, (start, title) in enumerate(zip(starts, titles)):
            text = body[start : starts[i + 1] if i + 1 < len(starts) else len(body)]
            seen = versions.setdefault(title, [])
            if text not in seen:
                seen.append(text)
    train, held = {}, {}
    for title, texts in versions.items():
        (held if _held(title) else train)[title] = "\n".join(texts)
    return train, held


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UserError(f"text kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _read(paths: list[str]) -> bytes:
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            parts.append(f.read())
    return b"\n".join(parts)


@functools.cache
def training_text(kind: str = "code") -> bytes:
    """The training corpus of one kind, files (sections) joined by a newline."""
    _check_kind(kind)
    if kind == "code":
        return _read(corpus_files()[0])
    return "\n".join(prose_sections()[0].values()).encode("utf-8")


@functools.cache
def heldout_text(kind: str = "code") -> bytes:
    """Bytes of one kind never used in training (the held-out files or sections), for prompts
    and accuracy."""
    _check_kind(kind)
    if kind == "code":
        return _read(corpus_files()[1])
    return "\n".join(prose_sections()[1].values()).encode("utf-8")


def sample_prompts(
    n: int, length: int, *, source: bytes | None = None, seed: int = 0, kind: str = "code"
) -> list[list[int]]:
    """`n` deterministic prompts of `length` bytes cut from `source` (by default the held-out
    text of `kind`); another `seed` gives other prompts.

    Prompts start at the beginning of a line so they look like what a user would feed a model.
    """
    text = heldout_text(kind) if source is None else source
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
