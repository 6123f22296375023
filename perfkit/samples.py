"""What one `perfkit.record` call carries from a probe notebook to the run that reads it.

The probe side writes records into the executed notebook as display outputs of their own
mimetype; the experiment side reads them back. This module is the contract between the two, so
that neither imports the other.

Format history of the notebook payload (`format_version`): 1: first format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfkit.errors import RecordError
from perfkit.files import Reader, decode_number, encode_number

MIMETYPE = "application/vnd.perfkit.record+json"
FORMAT_VERSION = 1
MAX_SAMPLES = 1_000_000  #: samples one record may carry (a claim cannot ask for more: expect.min_samples)


def encode_samples(samples: list[float]) -> list[float | str]:
    """JSON has no NaN or infinity; they travel as strings so that they reach the verdict."""
    return [encode_number(s) for s in samples]


def decode_samples(samples: list[float | str]) -> list[float]:
    return [decode_number(s) for s in samples]


@dataclass(frozen=True)
class MetricRecord:
    """One `perfkit.record` call: a metric's samples, where it was measured and in which unit."""

    name: str
    unit: str
    samples: tuple[float, ...]
    at: dict[str, Any] | None = None
    note: str | None = None
    breakdown: str | None = None  # the metric whose samples these are paired with, step by step

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "samples": encode_samples(list(self.samples)),
            "at": self.at,
            "note": self.note,
            "breakdown": self.breakdown,
        }

    @classmethod
    def from_json(cls, reader: Reader) -> MetricRecord:
        try:
            decoded = decode_samples(reader.get("samples", list))
        except (ValueError, TypeError) as exc:
            raise RecordError(str(exc), path=reader.path, field=reader.field("samples")) from None
        if len(decoded) > MAX_SAMPLES:
            raise RecordError(
                f"{len(decoded):,} samples; a record carries at most {MAX_SAMPLES:,}",
                path=reader.path,
                field=reader.field("samples"),
            )
        return cls(
            name=reader.get("name", str),
            unit=reader.unit("unit"),
            samples=tuple(decoded),
            at=reader.get("at", dict, optional=True),
            note=reader.get("note", str, optional=True),
            breakdown=reader.get("breakdown", str, optional=True),
        )
