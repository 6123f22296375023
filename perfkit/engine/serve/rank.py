"""Inside a rank process of `perfkit engine serve` (started by perfkit.engine.serve.workers): load the
engine, take this rank's tensor-parallel shard, join the group, say `Ready`, then run each `Job` the
parent sends, rank 0 sending each step's tokens. The process exits when its pipe closes, on SIGTERM,
or when the parent dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing import connection

from perfkit.engine.serve.messages import Done, Failed, Ready, Step
from perfkit.engineoptions import EngineOptions
from perfkit.errors import UserError
from perfkit.probe import spans

__all__ = ["main", "COLLECTIVE_TIMEOUT_S"]

COLLECTIVE_TIMEOUT_S = 120.0  # a rank gives up on a peer that has not joined a collective after this


def main() -> None:
    """A rank's life: load, shard, join the group, say ready, then run jobs until told to stop."""
    config = json.loads(sys.argv[1])
    options = EngineOptions(**config["options"])
    conn = connection.Connection(config["fd"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exit normally: profile summaries print
    _watch_parent(config["parent"])
    try:
        engine, reduce = _load(options, config["rank"])
    except Exception as exc:
        conn.send(_failed(exc, usable=True))
        sys.exit(1)
    target, drafter = engine.target.config, engine.drafter.config
    conn.send(Ready(os.getpid(), str(engine.device), target.max_seq_len, drafter.block))
    _serve(conn, engine, reduce, options, first=config["rank"] == 0)


def _load(options: EngineOptions, rank: int):
    import torch

    from perfkit.engine.checkpoints import load_engine
    from perfkit.engine.serve import tp

    torch.set_num_threads(options.threads)
    world = options.tp
    device = tp.local_device(options.device, world)
    engine = load_engine(options.preset, device=device, dtype=options.dtype, seed=0)
    reduce = tp.AllReduce() if world > 1 else None
    tp.shard(engine, rank, world, reduce=reduce)
    if world > 1:
        tp.init_group(rank, world, device, timeout_s=COLLECTIVE_TIMEOUT_S)
        reduce(torch.zeros(1, device=device))  # the group works both ways before anyone says ready
    return engine, reduce


def _serve(conn, engine, reduce, options: EngineOptions, *, first: bool) -> None:
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        entered = reduce.calls if reduce is not None else 0
        profiling = spans.enabled()  # each step's phases for GET /metrics, only when the server profiles
        try:
            with spans.capture() if profiling else contextlib.nullcontext() as profiled:
                result = engine.generate(
                    job.prompts,
                    max_new_tokens=job.max_new_tokens,
                    mode=options.mode,
                    budget=options.budget,
                    tree=options.tree,
                    mask=options.mask,
                    fill=job.fill,
                    temperature=job.temperature,
                    seed=job.seed,
                    on_step=(lambda tokens: conn.send(Step(tokens))) if first else None,
                )
        except Exception as exc:
            usable = reduce is None or reduce.calls == entered  # no peer waits on us in a collective
            conn.send(_failed(exc, usable=usable))
            if not usable:
                sys.exit(1)
            continue
        steps = profiled.steps() if profiled is not None else None
        conn.send(Done(_summary(result) if first else None, steps))


def _failed(exc: Exception, *, usable: bool) -> Failed:
    """An exception, for the parent: a UserError's message alone, anything else with its traceback."""
    if isinstance(exc, UserError):
        return Failed(True, str(exc), "", usable)
    return Failed(False, f"{type(exc).__name__}: {exc}", traceback.format_exc(), usable)


def _summary(result) -> dict:
    keys = ("tokens", "steps", "accept_lengths", "prefill_s", "ttft_s", "decode_s", "decode_tok_s", "fill")
    summary = {key: getattr(result, key) for key in keys}
    summary.update(
        prompt_tokens=result.prompt_tokens,
        generated_tokens=result.generated_tokens,
        experts_touched=result.experts_touched,
    )
    return summary


def _watch_parent(parent: int) -> None:
    """Exit when the parent process is gone (this process is then re-parented)."""

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="perfkit-parent-watch", daemon=True).start()
