"""The served engine's options, declared once.

`EngineOptions` is what every rank of `perfkit engine serve` loads and decodes with. Its fields, with
their flag's help and choices in the field's metadata, give `perfkit engine serve`'s flags
(`add_arguments`), the configuration each rank process is started with (`asdict`), the identity a
server reports at `/v1/models` (`Workers.identity`), and the command line a probe's `Server` starts
(`argv`). A new engine option is one field here.

Torch-free, and a leaf: a server's parent process reads it and starts its ranks before it imports
anything heavy (the ranks import torch in parallel), and a probe or the experiment reads it without
the engine. The engine's own tables (the kernels' `BUILDERS`, `checkpoints.DTYPES`) are keyed by these
names, and the engine checks its choices with `check_choices`; a test holds the tables and names equal.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from perfkit.errors import UserError

__all__ = [
    "EngineOptions",
    "MODES",
    "FILLS",
    "APPROX_FROM",
    "MASKS",
    "TREES",
    "PRESETS",
    "DTYPES",
    "DEVICES",
    "check_choices",
]

MODES = ("spec", "ar")  # tree speculation, or one token a step
FILLS = ("prefill", "approx")  # how a prompt's cache is filled (a served engine adds "auto")
APPROX_FROM = 4096  # fill "auto": the approximate fill for prompts of this many tokens or more
MASKS = ("naive", "compact")  # perfkit.kernels.verify_mask.BUILDERS
TREES = ("heap", "vectorized")  # perfkit.kernels.tree_build.BUILDERS
PRESETS = ("shipped", "tiny-random", "moe-random")  # perfkit.engine.checkpoints
DTYPES = ("fp32", "bf16")
DEVICES = ("cpu", "cuda")


def _option(help: str, choices: tuple[str, ...] | None = None, *, positive: bool = False) -> dict[str, Any]:
    return {"help": help, "choices": choices, "positive": positive}


@dataclass(frozen=True)
class EngineOptions:
    """How a served engine runs; `checked()` says what is wrong with a value, naming its flag."""

    tp: int = field(default=1, metadata=_option("tensor-parallel ranks, one process each", positive=True))
    preset: str = field(default="shipped", metadata=_option("engine weights", PRESETS))
    mode: str = field(default="spec", metadata=_option("decode mode: tree speculation or one token a step", MODES))
    budget: int = field(default=32, metadata=_option("draft tree nodes per step", positive=True))
    mask: str = field(default="compact", metadata=_option("how the verify mask is built", MASKS))
    tree: str = field(default="vectorized", metadata=_option("how the draft tree is built", TREES))
    device: str = field(default="cpu", metadata=_option("where the ranks run (cuda: one GPU a rank)", DEVICES))
    dtype: str = field(default="fp32", metadata=_option("weights and activations", DTYPES))
    threads: int | None = field(
        default=None,
        metadata=_option(
            "torch CPU threads per rank (default: OMP_NUM_THREADS, else the CPUs, over tp)", positive=True
        ),
    )
    fill: str = field(
        default="auto",
        metadata=_option(
            f"how a prompt's cache is filled; auto: approx from {APPROX_FROM} prompt tokens", ("auto", *FILLS)
        ),
    )

    def checked(self) -> EngineOptions:
        """These options, or a UserError naming the flag of the first value the engine cannot run with."""
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            flag = "--" + f.name
            if meta["positive"]:
                if value is None and f.default is None:
                    continue
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise UserError(f"{flag} must be a positive integer, got {value!r}")
            elif meta["choices"] is not None and value not in meta["choices"]:
                raise UserError(f"{flag} must be one of {', '.join(meta['choices'])}; got {value!r}")
        return self

    def argv(self) -> list[str]:
        """The flags that start a server with these options (every field, so the command says it all)."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out += ["--" + f.name, str(value)]
        return out

    def asdict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, its help, choices and default from the field."""
        for f in fields(cls):
            meta = f.metadata
            kind = int if f.type in ("int", "int | None") else str
            parser.add_argument("--" + f.name, type=kind, default=f.default, choices=meta["choices"], help=meta["help"])

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineOptions:
        """The options parsed by `add_arguments`, checked."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)}).checked()


def check_choices(*, mode: str, tree: str, mask: str) -> None:
    """UserError unless the decode mode, tree builder and mask builder are ones the engine has."""
    for name, value, known in (("mode", mode, MODES), ("tree", tree, TREES), ("mask", mask, MASKS)):
        if value not in known:
            raise UserError(f"{name} must be one of {known}, got {value!r}")
