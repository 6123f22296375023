"""`perfkit engine benchmarks`: the engine's headline figures, each ratio measured side by side.

1. Accept length of the shipped weights on held-out prose (greedy and sampled) and code (greedy),
   and spec vs AR decode tok/s at ~1k context of prose, batch 1 (AR and spec runs alternate, median
   of the repeats).
2. Tree build, vectorized vs heapq, over batch x budget: a new draft each time, the two builders
   alternating, the speedup with its interval (the heap timing includes the copy of the log-probs
   to the host, which the heap path needs).
3. Verify mask, compact vs naive, over context x batch at 32 tree nodes (prepare_for_verify only).
Every time is taken by `perfkit.probe.timing.bench`.

Format history (`format_version`) of the record: 1 and 2: keys `format` and `version`; 3: `format_version`;
4: the accept lengths and the 1k-context prompt are of held-out prose, `heldout_accept_len_code` of code.
"""

from __future__ import annotations

import statistics
from functools import partial

from perfkit.files import VERSION_KEY
from perfkit.probe.timing import bench

__all__ = ["run_benchmarks", "format_benchmarks", "tree_build_figures", "mask_figures", "spec_figures", "SECTIONS"]


FORMAT_VERSION = 4


def _median_s(fn, *, quick: bool) -> float:
    samples = bench(fn, warmup=2 if quick else 3, repeat=5 if quick else 15, min_time_s=0.05 if quick else 0.3)
    return statistics.median(samples)


TEMPERATURES = (0.0, 0.5, 1.0)  # accept length greedy and sampled (seed 0)


def spec_figures(*, quick: bool, device: str = "cpu", budget: int = 32, budgets: tuple = (4, 8, 16, 32)) -> dict:
    """Accept length on held-out prompts at `budget`, greedy and sampled; spec vs AR decode speed
    at ~1k context, batch 1, for each of `budgets` (AR and spec runs alternate; medians of the
    repeats)."""
    from perfkit.engine import data
    from perfkit.engine.checkpoints import load_engine

    engine = load_engine("shipped", device=device)
    n_prompts, gen = (4, 64) if quick else (16, 128)
    accept = {t: [] for t in TEMPERATURES}  # on prose: greedy, then seeded sampling
    for p in data.sample_prompts(n_prompts, 256, kind="prose"):
        for t in TEMPERATURES:
            accept[t].extend(
                engine.generate([p], max_new_tokens=gen, mode="spec", budget=budget, temperature=t).accept_lengths
            )
    code = [  # greedy on code, the other held-out kind
        a
        for p in data.sample_prompts(n_prompts, 256, kind="code")
        for a in engine.generate([p], max_new_tokens=gen, mode="spec", budget=budget).accept_lengths
    ]
    ctx_prompt = data.sample_prompts(1, 256, seed=7, kind="prose")
    opts = dict(max_new_tokens=64 if quick else 128, context=1024)
    engine.generate(ctx_prompt, max_new_tokens=8, context=1024, mode="ar")  # warm-up
    rows = {"ar": []} | {b: [] for b in budgets}
    accepts = {b: [] for b in budgets}
    for _ in range(2 if quick else 5):
        rows["ar"].append(engine.generate(ctx_prompt, mode="ar", **opts).decode_tok_s)
        for b in budgets:
            # batch 1: the per-request heap is the cheaper tree builder here (see tree_build figures)
            r = engine.generate(ctx_prompt, mode="spec", budget=b, tree="heap", **opts)
            rows[b].append(r.decode_tok_s)
            accepts[b].append(r.mean_accept_length)
    ar = statistics.median(rows["ar"])
    sweep = [
        {
            "budget": b,
            "spec_decode_tok_s": statistics.median(rows[b]),
            "accept_len": statistics.fmean(accepts[b]),
            "speedup": statistics.median(rows[b]) / ar,
        }
        for b in budgets
    ]
    best = max(sweep, key=lambda r: r["speedup"])
    return {
        "budget": budget,
        "heldout_prompts": n_prompts,
        "heldout_gen": gen,
        "heldout_accept_len": statistics.fmean(accept[0.0]),
        "heldout_accept_len_code": statistics.fmean(code),
        "heldout_accept_len_sampled": [
            {"temperature": t, "accept_len": statistics.fmean(accept[t])} for t in TEMPERATURES[1:]
        ],
        "ctx": 1024,
        "ar_decode_tok_s": ar,
        "sweep": sweep,
        "best": best,
    }


def _draft_like(batch: int, depth: int, ranks: int, seed: int):
    """Top-`ranks` log-probs [B, K, R] shaped like a drafter's: peaked, flatter with depth."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    temps = torch.linspace(4.0, 1.5, depth)[None, :, None]
    logits = torch.randn(batch, depth, 256, generator=gen) * temps
    return logits.log_softmax(-1).topk(ranks, dim=-1).values


def _alternating_times(drafts: list, budget: int, *, pairs: int, sync: str) -> dict[str, list[float]]:
    """Seconds per build of each tree builder, the builders alternating on the same draft, a new
    draft each pair; two more pairs run first, as warm-up."""
    from perfkit.kernels.tree_build import BUILDERS

    times = {name: [] for name in BUILDERS}
    for i in range(pairs + 2):
        for name, build in BUILDERS.items():
            (seconds,) = bench(partial(build, drafts[i % len(drafts)], budget), warmup=0, repeat=1, inner=1, sync=sync)
            if i >= 2:
                times[name].append(seconds)
    return times


def tree_build_figures(*, quick: bool, device: str = "cpu") -> list[dict]:
    """Vectorized vs heapq tree build at batch 1/8/32/128 x budget 16/64/256 (8 depths, top-R =
    budget), trees checked equal on every input.

    Each repetition builds a different draft (a pool of 8), as the decode loop does, so neither
    builder gets to replay one input's branches; heap and vectorized alternate on the same input,
    and the speedup is the ratio of their mean times over those pairs, with a 95% interval. On
    CUDA the heap's time includes the copy of the log-probs to the host that it needs, and both
    are timed up to a synchronisation (`bench(sync="each")`)."""
    import torch

    from perfkit.kernels.tree_build import build_tree_heap, build_tree_vectorized
    from perfkit.stats import ratio_interval

    pairs = 12 if quick else 40
    rows = []
    for budget in (16, 64, 256):
        for batch in (1, 8, 32, 128):
            drafts = [
                _draft_like(batch, 8, min(budget, 256), seed=batch * 1000 + budget + j).to(device) for j in range(8)
            ]
            same = True
            for lp in drafts:
                a, b = build_tree_heap(lp, budget), build_tree_vectorized(lp, budget)
                same &= all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("ranks", "parents", "depths", "scores"))
            times = _alternating_times(drafts, budget, pairs=pairs, sync="each" if device == "cuda" else "none")
            speedup = ratio_interval(times["heap"], times["vectorized"], paired=True)
            rows.append(
                {
                    "batch": batch,
                    "budget": budget,
                    "pairs": pairs,
                    "heap_ms": statistics.median(times["heap"]) * 1e3,
                    "vectorized_ms": statistics.median(times["vectorized"]) * 1e3,
                    "speedup": speedup.value,
                    "speedup_low": speedup.low,
                    "speedup_high": speedup.high,
                    "same_trees": same,
                }
            )
    return rows


def mask_figures(*, quick: bool, device: str = "cpu", nodes: int = 32) -> list[dict]:
    """Compact vs naive prepare_for_verify at context 1k/8k/32k/64k, batch 1 and 8, 32 nodes.

    Both get the tree's visibility block, as in the engine (the tree_build phase computes it), so
    the figures compare what each builder adds to it."""
    import torch

    from perfkit.kernels.tree_build import build_tree_vectorized
    from perfkit.kernels.verify_mask import ancestors, prepare_for_verify_compact, prepare_for_verify_naive

    rows = []
    for batch in (1, 8):
        tree = build_tree_vectorized(_draft_like(batch, 8, nodes, seed=batch).to(device), nodes)
        block = ancestors(tree.parents, 8)
        for ctx in (1024, 8192, 32768, 65536):
            lens = torch.full((batch,), ctx, dtype=torch.int64, device=device)
            naive = _median_s(partial(prepare_for_verify_naive, lens, block, 8), quick=quick)
            compact = _median_s(partial(prepare_for_verify_compact, lens, block, 8), quick=quick)
            rows.append(
                {
                    "batch": batch,
                    "ctx": ctx,
                    "nodes": nodes,
                    "naive_ms": naive * 1e3,
                    "compact_ms": compact * 1e3,
                    "speedup": naive / compact,
                }
            )
    return rows


SECTIONS = {
    "spec": ("spec_vs_ar", spec_figures),
    "tree": ("tree_build", tree_build_figures),
    "mask": ("verify_mask", mask_figures),
}


def run_benchmarks(*, quick: bool = False, device: str = "cpu", only: tuple = tuple(SECTIONS)) -> dict:
    import torch

    record = {VERSION_KEY: FORMAT_VERSION, "quick": quick, "device": device, "threads": torch.get_num_threads()}
    for name in dict.fromkeys(only):
        key, figures = SECTIONS[name]
        record[key] = figures(quick=quick, device=device)
    return record


def format_benchmarks(record: dict) -> str:
    lines = [
        f"perfkit engine benchmarks ({'quick' if record['quick'] else 'full'}; "
        f"{record['device']}, {record['threads']} threads)"
    ]
    if "spec_vs_ar" in record:
        lines += _format_spec(record["spec_vs_ar"])
    if "tree_build" in record:
        lines += _format_tree(record["tree_build"])
    if "verify_mask" in record:
        lines += _format_mask(record["verify_mask"])
    return "\n".join(lines)


def _format_spec(s: dict) -> list[str]:
    lines = [
        "",
        f"Spec decode, shipped weights, budget {s['budget']}",
        f"  accept length on held-out prose ({s['heldout_prompts']} prompts "
        f"x {s['heldout_gen']} tokens): {s['heldout_accept_len']:.2f}"
        + "".join(
            f"; sampled at temperature {r['temperature']:g}: {r['accept_len']:.2f}"
            for r in s.get("heldout_accept_len_sampled", [])
        )
        + (f"; greedy on held-out code: {s['heldout_accept_len_code']:.2f}" if "heldout_accept_len_code" in s else ""),
        f"  ctx {s['ctx']}, batch 1, tree=heap: AR {s['ar_decode_tok_s']:.1f} tok/s",
    ]
    for r in s["sweep"]:
        lines.append(
            f"    spec budget {r['budget']:>3}: {r['spec_decode_tok_s']:>7.1f} "
            f"tok/s  accept {r['accept_len']:.2f}  spec/AR {r['speedup']:.2f}x"
        )
    return lines


def _format_tree(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "Tree build (8 depths, top-R = budget, a new draft each time; "
        f"{rows[0]['pairs']} alternating pairs): heapq vs vectorized",
        "  (median ms per build; speedup = ratio of the mean times, 95% interval)",
        f"  {'batch':>5} {'budget':>6} {'heap_ms':>9} {'vector_ms':>9} {'speedup [95% interval]':>24} same_trees",
    ]
    for r in rows:
        interval = f"{r['speedup']:.2f}x [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"
        lines.append(
            f"  {r['batch']:>5} {r['budget']:>6} {r['heap_ms']:>9.3f} "
            f"{r['vectorized_ms']:>9.3f} {interval:>24} {r['same_trees']}"
        )
    return lines


def _format_mask(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "Verify mask (prepare_for_verify, 32 nodes): naive vs compact",
        f"  {'batch':>5} {'ctx':>6} {'naive_ms':>9} {'compact_ms':>10} {'speedup':>8}",
    ]
    for r in rows:
        lines.append(
            f"  {r['batch']:>5} {r['ctx']:>6} {r['naive_ms']:>9.3f} {r['compact_ms']:>10.4f} {r['speedup']:>7.1f}x"
        )
    return lines
