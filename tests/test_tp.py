"""Tensor parallelism: a shard really splits, its partial outputs add up, and rank processes
(perfkit.engine.serve.workers) give the in-process engine's tokens, fail loudly and leave nothing behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from perfkit.engine import data, load_engine
from perfkit.engine.decode import growth
from perfkit.engine.serve import tp
from perfkit.engine.serve.workers import RankDied, RankError, Workers
from perfkit.engineoptions import EngineOptions
from perfkit.errors import UserError

PROMPTS = [data.encode("def main():\n    return "), data.encode("import os\n")]


def _gone(pid: int) -> bool:
    """Process `pid` no longer exists (or is a zombie nobody will wait for)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _within(seconds: float, fn):
    """fn() in a thread: its result or exception, or a failure when it takes longer (a hang)."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a hang"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _served(preset: str, tp_: int, mode: str, **kwargs) -> tuple[list[list[int]], list, dict]:
    steps: list = []
    with Workers(EngineOptions(tp=tp_, preset=preset, mode=mode, threads=1, **kwargs)) as workers:
        workers.start()
        workers.wait_ready(60)
        summary = workers.generate(PROMPTS, max_new_tokens=24, on_tokens=steps.append)
        pids = workers.pids
    assert all(_gone(pid) for pid in pids)
    return summary["tokens"], steps, summary


@pytest.mark.parametrize(("preset", "mode"), [("shipped", "spec"), ("shipped", "ar"), ("moe-random", "spec")])
def test_ranks_give_the_in_process_tokens(preset, mode):
    expected = load_engine(preset, seed=0).generate(PROMPTS, max_new_tokens=24, mode=mode).tokens
    one, _, _ = _served(preset, 1, mode)
    two, steps, summary = _served(preset, 2, mode)
    assert one == expected
    assert two == expected
    assert summary["prompt_tokens"] == sum(map(len, PROMPTS)) and summary["generated_tokens"] == 48
    # the streamed steps add up to the tokens, the first step carrying the prefill's one token each
    assert steps[0] == [[t[0]] for t in expected]
    assert [sum((s[i] for s in steps), []) for i in range(len(PROMPTS))] == expected
    if preset == "shipped" and mode == "spec":
        assert any(len(s[0]) > 1 for s in steps)  # a speculative step streams several tokens at once


def test_sampled_tokens_and_engine_options_follow_the_engine():
    engine = load_engine("tiny-random", seed=0)
    expected = engine.generate(PROMPTS, max_new_tokens=12, mask="naive", tree="heap", temperature=0.8, seed=3).tokens
    with Workers(EngineOptions(tp=2, preset="tiny-random", threads=1, mask="naive", tree="heap")) as workers:
        workers.start()
        workers.wait_ready(60)
        assert workers.identity["mask"] == "naive" and workers.identity["tree"] == "heap"
        got = workers.generate(PROMPTS, max_new_tokens=12, on_tokens=lambda _: None, temperature=0.8, seed=3)
    assert got["tokens"] == expected


def test_identity_and_bad_options():
    workers = Workers(EngineOptions(tp=2, preset="tiny-random"))
    assert set(workers.identity) == {
        "preset",
        "tp",
        "mode",
        "budget",
        "mask",
        "tree",
        "device",
        "dtype",
        "fill",
        "version",
        "threads",
    }
    assert workers.identity["mask"] == "compact" and workers.identity["tree"] == "vectorized"
    with_omp = dict(os.environ, OMP_NUM_THREADS="6")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", with_omp)
        assert Workers(EngineOptions(tp=2)).identity["threads"] == 3  # the replicate's count, shared by the ranks
        assert Workers(EngineOptions(tp=2, threads=1)).identity["threads"] == 1
    for kwargs in ({"tp": 0}, {"mode": "beam"}, {"mask": "dense"}, {"tree": "greedy"}, {"fill": "x"}, {"budget": 0}):
        with pytest.raises(UserError):
            Workers(EngineOptions(**kwargs))


def test_a_shard_holds_its_share_and_the_partial_sums_add_up():
    full = load_engine("shipped", seed=0)
    c = full.target.config
    shards = [tp.shard(load_engine("shipped", seed=0), rank, 2) for rank in range(2)]
    for shard in shards:
        block = shard.target.blocks[0]
        assert block.attn.wqkv.weight.shape == ((c.n_heads + 2 * c.n_kv_heads) * c.head_dim // 2, c.d_model)
        assert block.attn.wo.weight.shape == (c.d_model, c.n_heads * c.head_dim // 2)
        assert block.ffn.w13.weight.shape == (c.d_ff, c.d_model)  # [2F, D] -> [2F / 2, D]
        assert block.ffn.w2.weight.shape == (c.d_model, c.d_ff // 2)
        assert shard.target.config.n_kv_heads == c.n_kv_heads // 2 and shard.target.config.d_ff == c.d_ff // 2
        assert block.attn.tp is None  # no process group here: partial outputs, added up below
    x = torch.randn(2, 5, c.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ffn = [s.target.blocks[1].ffn(x) for s in shards]
        torch.testing.assert_close(ffn[0] + ffn[1], full.target.blocks[1].ffn(x))
        cos_t, sin_t = full.target.rope(5, "cpu")
        cos, sin = cos_t[None, :5], sin_t[None, :5]
        attn = [s.target.blocks[1].attn.forward_sequence(x, cos, sin) for s in shards]
        torch.testing.assert_close(attn[0] + attn[1], full.target.blocks[1].attn.forward_sequence(x, cos, sin))


def test_moe_experts_split_and_uneven_tp_is_refused():
    moe = tp.shard(load_engine("moe-random", seed=0), 1, 2)
    c = load_engine("moe-random", seed=0).target.config
    assert all(e.w13.weight.shape == (c.d_ff, c.d_model) for e in moe.target.blocks[0].ffn.experts)
    assert moe.target.blocks[0].ffn.router.weight.shape == (c.n_experts, c.d_model)  # replicated
    with pytest.raises(UserError, match="does not split over --tp 3"):
        tp.check(c, 3)
    with Workers(EngineOptions(tp=3, preset="moe-random", threads=1)) as workers:
        workers.start()
        with pytest.raises(UserError, match="n_kv_heads 2 does not split over --tp 3"):
            _within(30, lambda: workers.wait_ready(30))
        pids = workers.pids
    assert all(_gone(pid) for pid in pids)


def test_a_rank_error_before_any_collective_keeps_the_workers():
    with Workers(EngineOptions(tp=2, preset="tiny-random", threads=1)) as workers:
        workers.start()
        workers.wait_ready(60)
        with pytest.raises(UserError, match="prompt tokens must be ints"):
            workers.generate([[300]], max_new_tokens=4, on_tokens=lambda _: None)
        assert workers.dead is None
        assert len(workers.generate([[1, 2]], max_new_tokens=4, on_tokens=lambda _: None)["tokens"][0]) == 4


def test_a_killed_rank_is_named_and_nothing_hangs_or_stays():
    with Workers(EngineOptions(tp=2, preset="shipped", threads=1)) as workers:
        workers.start()
        workers.wait_ready(60)
        pids = workers.pids
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RankDied) as caught:
            _within(20, lambda: workers.generate(PROMPTS, max_new_tokens=8, on_tokens=lambda _: None))
        assert time.monotonic() - start < 10
        assert f"rank 1 (pid {pids[1]})" in str(caught.value) and "SIGKILL" in str(caught.value)
        assert workers.dead == str(caught.value) and not workers.ready
        with pytest.raises(RankDied):  # and again, at once
            workers.generate(PROMPTS, max_new_tokens=8, on_tokens=lambda _: None)
    assert all(_gone(pid) for pid in pids)


def test_a_rank_killed_mid_generation_is_named():
    with Workers(EngineOptions(tp=2, preset="shipped", mode="ar", threads=1)) as workers:
        workers.start()
        workers.wait_ready(60)
        pids = workers.pids

        def kill_once(tokens):
            if not _gone(pids[1]):
                os.kill(pids[1], signal.SIGKILL)

        with pytest.raises(RankDied, match=rf"rank 1 \(pid {pids[1]}\) died: killed by SIGKILL"):
            _within(30, lambda: workers.generate(PROMPTS, max_new_tokens=400, on_tokens=kill_once))
    assert all(_gone(pid) for pid in pids)


def test_close_leaves_no_process_even_while_loading():
    workers = Workers(EngineOptions(tp=2, preset="shipped", threads=1))
    workers.start()
    pids = workers.pids
    _within(15, workers.close)
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(RankError, match="closed"):
        workers.generate(PROMPTS, max_new_tokens=2, on_tokens=lambda _: None)


def test_the_longest_prompt_follows_the_engines_rule():
    with Workers(EngineOptions(tp=1, preset="tiny-random", threads=1)) as workers:
        workers.start()
        workers.wait_ready(60)
        block = workers.limits["block"]
        assert workers.max_prompt_tokens(16) == workers.limits["max_seq_len"] - 1 - growth("spec", 16, 32, block)


def test_the_engine_options_are_declared_once_and_the_engine_runs_what_they_name():
    """EngineOptions' choices are the engine's own; its flags parse back into the same options; a bad
    value names its flag; the server's parser imports no torch (its ranks start before torch loads)."""
    import argparse
    import subprocess
    import sys
    from dataclasses import fields

    from perfkit import engineoptions
    from perfkit.engine import checkpoints
    from perfkit.experiment.records import served
    from perfkit.kernels import tree_build, verify_mask

    assert engineoptions.MASKS == tuple(verify_mask.BUILDERS) and engineoptions.TREES == tuple(tree_build.BUILDERS)
    assert engineoptions.DTYPES == tuple(checkpoints.DTYPES) and checkpoints.PRESETS is engineoptions.PRESETS
    assert set(served.STARTED_WITH) <= {f.name for f in fields(EngineOptions)}
    parser = argparse.ArgumentParser()
    EngineOptions.add_arguments(parser)
    options = EngineOptions(tp=2, preset="tiny-random", mode="ar", mask="naive", tree="heap", threads=3)
    assert EngineOptions.from_args(parser.parse_args(options.argv())) == options
    assert EngineOptions.from_args(parser.parse_args([])) == EngineOptions()
    for bad, flag in (({"tp": 0}, "--tp"), ({"mask": "dense"}, "--mask"), ({"threads": 0}, "--threads")):
        with pytest.raises(UserError, match=flag):
            EngineOptions(**bad).checked()
    code = "import sys\nfrom perfkit.engine import cli\ncli._parser()\nprint('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
