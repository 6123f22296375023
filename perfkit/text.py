"""Text from outside perfkit (a probe's error, a server's model name, the environment, a stored file) as
it may be shown: every character that could steer a terminal or make a file binary is written out.

One rule for the terminal, LEDGER.md and every other view: C0 control characters other than tab and
newline, DEL and the C1 controls show as `\\xNN`; bytes that were not UTF-8 (decoded with
surrogateescape) as the `\\xNN` of the byte; other lone surrogates (no file or terminal can encode
them) and the bidirectional overrides that reorder what a reader sees as `\\uNNNN`. Everything else,
in any script, is kept as written.
"""

from __future__ import annotations

import re

_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown(match: re.Match) -> str:
    c = ord(match.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte surrogateescape kept from text that was not UTF-8
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def printable(text: str) -> str:
    """`text` with what could steer a terminal or a viewer written out (see the module's rule)."""
    return _HIDDEN.sub(_shown, text)


def one_line(text: str) -> str:
    """`printable(text)` where a line break would forge a line of its own (a table row, a log line)."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


class Shown:
    """A text stream whose writes pass `printable`: what perfkit's commands print reaches the terminal
    as text, whatever a probe, a server or the environment put into it. Everything else is the stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
