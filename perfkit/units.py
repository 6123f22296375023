"""Explicit units: every recorded metric and every expected value names one, and they are checked.

A hypothesis written in ms can be judged against samples recorded in s (same dimension), never
against bytes. Three clocks are three dimensions: wall time (`ms`), the CPU time of the probe's own
process (`cpu_ms`: what another job on the machine does not add to, as long as the probe has a core)
and instructions counted under a CPU simulator (`instr`: what load cannot move at all). A claim in
milliseconds is never judged in CPU time or instructions, nor the other way round. Numbers are
formatted here too, so the ledger, plots and CLI all print them alike.
"""

from __future__ import annotations

import math

from perfkit.errors import UserError

# unit -> (dimension, factor to the dimension's base unit)
_UNITS: dict[str, tuple[str, float]] = {
    "ns": ("time", 1e-9),
    "us": ("time", 1e-6),
    "µs": ("time", 1e-6),
    "ms": ("time", 1e-3),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "cpu_ns": ("cpu_time", 1e-9),
    "cpu_us": ("cpu_time", 1e-6),
    "cpu_ms": ("cpu_time", 1e-3),
    "cpu_s": ("cpu_time", 1.0),
    "instr": ("instructions", 1.0),
    "Kinstr": ("instructions", 1e3),
    "Minstr": ("instructions", 1e6),
    "Ginstr": ("instructions", 1e9),
    "B": ("bytes", 1.0),
    "KB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12),
    "KiB": ("bytes", 2.0**10),
    "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30),
    "B/s": ("bandwidth", 1.0),
    "KB/s": ("bandwidth", 1e3),
    "MB/s": ("bandwidth", 1e6),
    "GB/s": ("bandwidth", 1e9),
    "TB/s": ("bandwidth", 1e12),
    "GiB/s": ("bandwidth", 2.0**30),
    "tok/s": ("token_rate", 1.0),
    "req/s": ("request_rate", 1.0),
    "FLOP": ("flop", 1.0),
    "GFLOP": ("flop", 1e9),
    "TFLOP": ("flop", 1e12),
    "FLOP/s": ("flop_rate", 1.0),
    "GFLOP/s": ("flop_rate", 1e9),
    "TFLOP/s": ("flop_rate", 1e12),
    "fraction": ("fraction", 1.0),
    "%": ("fraction", 0.01),
    "x": ("ratio", 1.0),
    "count": ("count", 1.0),
    "tok": ("count", 1.0),
}

#: Dimensions where a smaller number means faster (a speedup is baseline / candidate).
LOWER_IS_FASTER = frozenset({"time", "cpu_time", "instructions"})
#: Dimensions where a larger number means faster (a speedup is candidate / baseline).
HIGHER_IS_FASTER = frozenset({"token_rate", "request_rate", "bandwidth", "flop_rate"})

KNOWN_UNITS: tuple[str, ...] = tuple(_UNITS)


def is_unit(unit: object) -> bool:
    return isinstance(unit, str) and unit in _UNITS


def dimension(unit: str) -> str:
    """The physical dimension of a unit; unknown units are a user error."""
    try:
        return _UNITS[unit][0]
    except (KeyError, TypeError):
        raise UserError(f"unknown unit {unit!r}; known units: {', '.join(KNOWN_UNITS)}") from None


def factor(from_unit: str, to_unit: str) -> float:
    """Multiply a value in `from_unit` by this to get it in `to_unit`."""
    from_dim, to_dim = dimension(from_unit), dimension(to_unit)
    if from_dim != to_dim:
        raise UserError(f"cannot convert {from_unit} ({from_dim}) to {to_unit} ({to_dim})")
    return _UNITS[from_unit][1] / _UNITS[to_unit][1]


def convert(values: list[float], from_unit: str, to_unit: str) -> list[float]:
    scale = factor(from_unit, to_unit)
    return [v * scale for v in values]


def format_number(value: float | None, digits: int = 3) -> str:
    """`digits` significant digits, thousands separated, trailing zeros dropped: 0.18, 1,100, 46,000."""
    if value is None or math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits - 1}e}")  # round to significant digits first
    magnitude = math.floor(math.log10(abs(rounded)))
    if magnitude >= 15 or magnitude <= -6:
        return f"{rounded:.{digits - 1}e}"
    decimals = max(digits - 1 - magnitude, 0)
    text = f"{rounded:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_quantity(value: float, unit: str | None, digits: int = 3) -> str:
    text = format_number(value, digits)
    if not unit or unit in ("count", "fraction"):
        return text
    if unit in ("x", "%"):
        return f"{text}{unit}"
    return f"{text} {unit}"


def format_factor(ratio: float) -> str:
    """How far apart two positive quantities are, two significant digits: "1,100x", "2.4x"."""
    return f"{format_number(ratio, 2)}x"
