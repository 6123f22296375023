"""What every step of a run shares: the project, the options, the run folder, the policy, the output."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.experiment.records.replicates import Policy
from perfkit.experiment.records.results import Execution
from perfkit.experiment.run.options import RunOptions
from perfkit.experiment.run.plan import Plan
from perfkit.experiment.run.priors import FirstRound
from perfkit.experiment.run.rundir import RunDir
from perfkit.experiment.run.why import Now
from perfkit.experiment.run.windows import Windows
from perfkit.machine import fitness
from perfkit.paths import Project


class Printer:
    """Progress lines from several worker threads, one line at a time.

    A reader that went away (`perfkit run ... | head -2`) never stops the measurement: once the pipe
    is closed the lines are dropped and the run goes on to store its results and the ledger.
    """

    def __init__(self, out: Callable[[str], None]):
        self.out = out
        self.lock = threading.Lock()
        self.closed = False

    def __call__(self, text: str) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                self.out(text)
            except (BrokenPipeError, ValueError):  # ValueError: a closed file
                self.closed = True


@dataclass
class RunContext:
    """One run in progress: `plan` grows when a look adds replicates; `done` fills as executions end."""

    project: Project
    options: RunOptions
    run_dir: RunDir
    policy: Policy
    plan: Plan
    say: Printer
    now: Now | None = None  # what the keys are made of, to say what changed since an earlier run
    limits: fitness.Limits = fitness.LIMITS  # when other load makes a replicate unfit ([tool.perfkit] fitness)
    client: Any = None  # the Dask client, when the executions go to a cluster
    shipped: Any = None  # the run's code on the cluster (cluster.ship), sent once
    probes: dict[str, Path] = field(default_factory=dict)  # notebook -> the copy every replicate executes
    done: dict[str, Execution] = field(default_factory=dict)  # execution id -> as it ended (or was reused)
    why: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (why it ran again, the run compared with)
    said: set[str] = field(default_factory=set)  # keys whose reason was printed
    started: float = field(default_factory=time.monotonic)  # when the run began, for --budget
    out_of_time: dict[str, float] = field(default_factory=dict)  # hypothesis id -> seconds its growth needed
    left_out: dict[str, str] = field(default_factory=dict)  # hypothesis id -> why the budget left it unmeasured
    first: FirstRound | None = None  # the first round as planned: what it left out, and its forecast
    looked: dict[str, list[int]] = field(default_factory=dict)  # hypothesis id -> its replicates at each look
    windows: Windows = field(default_factory=Windows)  # replicates on servers the run did not start
