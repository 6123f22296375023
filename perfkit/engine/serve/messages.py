"""What the pipe between the server's parent process and each rank process carries: one small
dataclass per message. `Ready`, `Step`, `Done` and `Failed` come from a rank, `Job` goes to it (a rank
stops when its pipe closes, or on SIGTERM). Both ends import this module, and nothing here imports
torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ready", "Step", "Done", "Failed", "Job"]


@dataclass(frozen=True)
class Ready:
    """A rank has loaded, sharded and joined its group."""

    pid: int
    device: str
    max_seq_len: int
    block: int


@dataclass(frozen=True)
class Step:
    """Rank 0: the tokens each request gained in a decode step (the first token, then each step's)."""

    tokens: list[list[int]]


@dataclass(frozen=True)
class Done:
    """A rank finished its job; rank 0 carries the summary (`_summary`), the others None. `steps`: while
    the rank profiles (PERFKIT_PROFILE), each decode step's phases in seconds (`Capture.steps()`)."""

    summary: dict | None
    steps: list[dict] | None = None


@dataclass(frozen=True)
class Failed:
    """A rank's job or start-up raised. `usable`: it raised before entering any collective, so no
    peer waits on it and the workers may go on; `user`: a UserError (the request's fault)."""

    user: bool
    text: str
    trace: str
    usable: bool


@dataclass(frozen=True)
class Job:
    """One `Engine.generate` for every rank."""

    prompts: list[list[int]]
    max_new_tokens: int
    temperature: float
    seed: int
    fill: str
