"""One exception hierarchy.

`UserError` and its subclasses are mistakes in what the user wrote or asked for (a malformed
hypothesis, an unknown probe, a bad parameter): the CLI prints them without a traceback and exits
with status 2. Anything else that escapes is a bug and keeps its traceback.
"""


class PerfkitError(Exception):
    """Base class of every error perfkit raises on purpose."""


class UserError(PerfkitError):
    """Something the user wrote or asked for is wrong; printed without a traceback, exit 2."""


class RecordError(UserError):
    """A hypothesis record is malformed. Carries where: file, line and field."""

    def __init__(self, message: str, *, path: str, line: int | None = None, field: str | None = None):
        self.path = path
        self.line = line
        self.field = field
        self.message = message
        where = path if line is None else f"{path}:{line}"
        what = f"{field}: " if field else ""
        super().__init__(f"{where}: {what}{message}")

    def __reduce__(self):
        return (_rebuild_record_error, (self.message, self.path, self.line, self.field))


def _rebuild_record_error(message, path, line, field):
    return RecordError(message, path=path, line=line, field=field)


def in_range(name: str, value: float, low: float, high: float, *, above_low: bool = False) -> float:
    """`value` when it is a finite number from `low` to `high` (above `low` with `above_low`); otherwise a
    UserError naming `name` (a flag, a setting). NaN, infinities and a number too large to mean anything
    (`1e400` reads as infinity) are refused here, before they reach a plan, a sleep or a file name."""
    import math

    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if above_low else value >= low) and value <= high
    if not ok:
        first = f"above {low:g}" if above_low else f"from {low:g}"
        raise UserError(f"{name} must be a number {first} to {high:g}, got {value!r}")
    return value
