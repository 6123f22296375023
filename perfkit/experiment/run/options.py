"""A run's options, declared once: `perfkit run`'s flags, `runner.run()` and the manifest all derive from here.

Each field of `RunOptions` that the command line sets carries its flag and help in the field's
metadata; `add_arguments` builds the parser from them, `from_args` reads them back, and `recorded`
is what the run's manifest says about them. Adding an option is one field here.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

from perfkit.errors import UserError, in_range
from perfkit.experiment.records.probe import MAX_REPLICATES
from perfkit.experiment.records.replicates import DEFAULT_REPLICATES, GROWTH, QUICK_BUDGET_S
from perfkit.experiment.run import profiling
from perfkit.machine import devices

DEFAULT_TIMEOUT_S = 600.0
MAX_SECONDS = 30 * 24 * 3600.0  # a run's --budget or a probe's --timeout beyond 30 days is a typo, not a plan
BISECT_REPLICATES = 3  # a bisect's processes per commit to start with
BISECT_GROWTH = 4  # a bisect's --max-replicates by default: this many times the first count
#: `perfkit run`'s flags a bisect takes, and what those that mean something else there say
BISECT_FLAGS = {
    "quick": None,
    "replicates": f"processes per commit to start with (default {BISECT_REPLICATES})",
    "max_replicates": f"the most per commit while two cannot be told apart (default {BISECT_GROWTH}x --replicates)",
    "jobs": "replicates of a commit at once here; with --cluster, commits at once",
    "cluster": None,
}


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`K=V` strings to parameters; V is read as YAML so 4096 is an int and 0.5 a float."""
    out = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param expects NAME=VALUE, got {pair!r}")
        try:
            out[name.strip()] = yaml.safe_load(text) if text.strip() else ""
        except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: an integer of over 4,300 digits
            raise UserError(
                f"--param {name}: cannot read value {text[:80]!r}{'...' if len(text) > 80 else ''}"
            ) from None
    return out


_ADDRESS = re.compile(r"^(?:(?P<scheme>[a-z]+)://)?(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


@dataclass(frozen=True)
class Simulated:
    """`local:MxN[:slowdown=F1,...,FM]`: M simulated machines of N workers on this host."""

    machines: int
    per_machine: int
    slowdown: tuple[float, ...]  # one factor per machine (1: as fast as this host)

    @classmethod
    def parse(cls, spec: str) -> Simulated:
        """From `local:N` (one machine) or `local:MxN[:slowdown=...]`; a UserError says what is wrong."""
        usage = "--cluster local:N or local:MxN[:slowdown=F1,...,FM] (M machines of N workers each)"
        body, _, options = spec.removeprefix("local:").partition(":")
        try:
            machines, per = (int(x) for x in body.split("x")) if "x" in body else (1, int(body))
        except ValueError:
            raise UserError(f"{usage}; got {spec!r}") from None
        if machines < 1 or per < 1:
            raise UserError(f"{usage}, each at least 1; got {spec!r}")
        slowdown = (1.0,) * machines
        if options:
            key, _, given = options.partition("=")
            try:
                slowdown = tuple(float(x) for x in given.split(","))
            except ValueError:
                slowdown = ()
            if key != "slowdown" or len(slowdown) != machines or not all(0 < f < 1000 for f in slowdown):
                raise UserError(f"{usage}: slowdown needs one positive factor per machine ({machines}); got {spec!r}")
        return cls(machines, per, slowdown)


def check_cluster(spec: str) -> None:
    """`--cluster`: local:N (or local:MxN) with N (M x N) from 1 to this machine's cores, or a scheduler's
    [scheme://]host:port; one line naming what is wrong otherwise, before anything starts."""
    if spec.startswith("slurm:"):  # its keys: perfkit/experiment/run/slurm.py
        from perfkit.experiment.run import slurm

        slurm.parse(spec)
        return
    if spec.startswith("local:"):
        cores = len(os.sched_getaffinity(0))
        pool = Simulated.parse(spec[:80])
        if pool.machines * pool.per_machine > cores:
            raise UserError(
                f"--cluster {spec[:40]}: local:N (local:MxN) takes N (M x N) from 1 to {cores}, this machine's "
                "cores (each worker measures on CPUs of its own)"
            )
        return
    found = _ADDRESS.match(spec)
    if found is None or not 0 < int(found["port"]) < 65536:
        raise UserError(
            f"--cluster {spec[:80]!r}: expected local:N, local:MxN, slurm:[KEY=VALUE,...] or a scheduler address "
            "like tcp://host:8786"
        )
    scheme = found["scheme"] or "tcp"
    if scheme not in _SCHEMES:
        raise UserError(f"--cluster {spec[:80]}: unknown scheme {scheme}://; expected one of {', '.join(_SCHEMES)}")
    if scheme == "tls":
        import dask

        if not dask.config.get("distributed.comm.tls.ca-file", None):
            raise UserError(
                f"--cluster {spec[:80]}: tls:// needs Dask's TLS settings (distributed.comm.tls.ca-file, "
                "client.cert and client.key in its configuration)"
            )


AUTO_JOBS = 0  # `--jobs auto`: as many executions at once as cores are free when the run starts


def _flag(default: Any, flag: str, help: str, **argparse_options: Any) -> Any:
    """A field set by `perfkit run FLAG`; `parse` in argparse_options turns the parsed value into the field's."""
    metadata = {"flag": flag, "help": help, "argparse": argparse_options}
    if isinstance(default, dict | tuple | list):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class RunOptions:
    """Which hypotheses a run judges and how it measures them."""

    ids: tuple[str, ...] = _flag((), "ids", "hypotheses to run", nargs="*", metavar="ID")
    all: bool = _flag(False, "--all", "run every hypothesis", action="store_true")
    quick: bool = _flag(False, "--quick", "use each probe's quick parameters", action="store_true")
    jobs: int = _flag(
        1,
        "--jobs",
        "probe executions at a time (default 1); auto: one per core free when the run starts (decided once, "
        "each on a core of its own)",
        type=lambda text: AUTO_JOBS if text == "auto" else int(text),
        metavar="N|auto",
    )
    overrides: dict[str, Any] = _flag(
        {},
        "--param",
        "override a probe parameter; V is read as YAML (8192, 0.5, true, [1, 2], text)",
        action="append",
        metavar="K=V",
        parse=parse_overrides,
    )
    timeout_s: float = _flag(
        DEFAULT_TIMEOUT_S,
        "--timeout",
        f"wall-clock limit per probe execution (default {DEFAULT_TIMEOUT_S:g} s)",
        type=float,
        metavar="S",
    )
    force: bool = _flag(False, "--force", "re-execute probes even when a cached execution exists", action="store_true")
    cluster: str | None = _flag(
        None,
        "--cluster",
        "run the probe executions on a Dask cluster: a scheduler address, local:N for N local workers, "
        "local:MxN[:slowdown=F1,...] for M simulated machines of N workers, or slurm:KEY=VALUE,... for workers "
        "in Slurm jobs (default: [tool.perfkit] cluster in pyproject.toml, else this machine)",
        metavar="ADDRESS",
    )
    profile: str | None = _flag(
        None,
        "--profile",
        "torch: a torch.profiler trace of each probe execution; nsys: run each under Nsight Systems",
        choices=list(profiling.PROFILERS),
    )
    replicates: int | None = _flag(
        None,
        "--replicates",
        f"independent kernel processes per probe execution (default {DEFAULT_REPLICATES['quick']} with --quick, "
        f"else {DEFAULT_REPLICATES['full']}; a record's probe.replicates can ask for more)",
        type=int,
        metavar="R",
    )
    max_replicates: int | None = _flag(
        None,
        "--max-replicates",
        f"add replicates, up to R, to verdicts more replicates would likely decide (default {GROWTH}x "
        "--replicates; with --quick only within --budget); each look's level is the share of the 5%% it spends",
        type=int,
        metavar="R",
    )
    budget_s: float | None = _flag(
        None,
        "--budget",
        "wall-clock seconds the whole run's measuring may take, the first round included: it measures what "
        f"decides most verdicts per second and says what did not fit (default {QUICK_BUDGET_S:g} with --quick, "
        "none otherwise; 0: the first round as planned, and no replicates added)",
        type=float,
        metavar="SECONDS",
    )
    threads: int | None = _flag(
        None,
        "--threads",
        "CPU threads of every probe execution, the same for each replicate (default: a record's probe.threads, "
        "else OMP_NUM_THREADS when set, else one on a shared machine, or the machine's cores shared by --jobs "
        'with fitness = "strict")',
        type=int,
        metavar="N",
    )
    fresh_processes: bool = _flag(
        False,
        "--fresh-processes",
        "start every replicate as two fresh interpreters (executor and kernel) instead of forking it from its "
        "round's warm template, which has imported what the probes import",
        action="store_true",
    )
    per_machine: bool = _flag(
        False,
        "--per-machine",
        "over several machines, judge every claim as one that must hold on every machine (the worst machine "
        "decides), as a record's `machines: every` does; default: each record's own (the pool)",
        action="store_true",
    )
    command: str = ""  # the command line, as recorded in the results
    retry_unfit: bool = True  # re-run, once, a replicate measured while the machine was busy
    ledger: bool = True  # commit the verdicts to hypotheses/ledger/ (perfkit check measures, never commits)

    def check(self) -> None:
        if bool(self.ids) == bool(self.all):
            raise UserError("name the hypotheses to run, or pass --all (not both)")
        for flag, value in (("--replicates", self.replicates), ("--max-replicates", self.max_replicates)):
            if value is not None and not 1 <= value <= MAX_REPLICATES:
                raise UserError(f"{flag} must be from 1 to {MAX_REPLICATES}, got {value}")
        if self.replicates and self.max_replicates and self.max_replicates < self.replicates:
            raise UserError(
                f"--max-replicates {self.max_replicates} is fewer than --replicates {self.replicates}: "
                "the most a run may grow to cannot be below where it starts"
            )
        if self.jobs < 1 and self.jobs != AUTO_JOBS:
            raise UserError(f"--jobs must be at least 1, or auto, got {self.jobs}")
        if self.threads is not None and not 1 <= self.threads <= 1024:
            raise UserError(f"--threads must be from 1 to 1024, got {self.threads}")
        if self.budget_s is not None:
            in_range("--budget (seconds)", self.budget_s, 0, MAX_SECONDS)
        in_range("--timeout (seconds)", self.timeout_s, 0, MAX_SECONDS, above_low=True)
        devices.machine_id()  # $PERFKIT_MACHINE_ID refused here, before anything is created, not mid-run
        if self.cluster and self.profile:
            raise UserError("--profile with --cluster is not supported yet: profile a probe on this machine")
        if self.cluster:
            check_cluster(self.cluster)
        profiling.check(self.profile)

    def at_once(self) -> int:
        """How many executions share this machine at a time: `--jobs`, or N workers of `--cluster local:N`."""
        if self.cluster and self.cluster.startswith("local:") and self.cluster[6:].isdigit():
            return max(1, int(self.cluster[6:]))
        return max(1, self.jobs)

    def recorded(self) -> dict[str, Any]:
        """What the manifest says about the options (the command-line ones, by field name)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if "flag" in f.metadata}


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    only: tuple[str, ...] | None = None,
    leave_out: tuple[str, ...] = (),
    helps: dict[str, str] | None = None,
) -> None:
    """`perfkit run`'s flags, from the fields of RunOptions: all of them, or the fields named in `only`,
    less those in `leave_out`. Another command measuring the same way (`check`, `bisect`) declares its
    flags from these; `helps` says what one of them means there, where that differs."""
    for f in fields(RunOptions):
        if "flag" not in f.metadata or (only is not None and f.name not in only) or f.name in leave_out:
            continue
        given = {k: v for k, v in f.metadata["argparse"].items() if k != "parse"}
        shown = (helps or {}).get(f.name, f.metadata["help"])
        if f.metadata["flag"].startswith("--"):
            parser.add_argument(f.metadata["flag"], dest=f.name, default=None, help=shown, **given)
        else:
            parser.add_argument(f.name, help=shown, **given)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The RunOptions fields `add_arguments` parsed and the command line set, read back into field values."""
    out: dict[str, Any] = {}
    for f in fields(RunOptions):
        if "flag" not in f.metadata or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if value is None or value is False:
            continue
        parse = f.metadata["argparse"].get("parse")
        out[f.name] = parse(value) if parse else tuple(value) if isinstance(value, list) else value
    return out


def from_args(args: argparse.Namespace, *, command: str, **fixed: Any) -> RunOptions:
    """The options `add_arguments` parsed (a flag not given keeps the field's default); `fixed`: fields the
    command sets itself (`check`'s one hypothesis, no ledger)."""
    return RunOptions(**{**given(args), **fixed, "command": command})
