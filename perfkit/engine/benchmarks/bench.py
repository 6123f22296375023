"""`perfkit engine bench`: one context-decode measurement, like the case study's bench script.

Fills a cache of `--ctx` tokens per request, generates `--gen` tokens, and prints one table row
(ctx_req prompt_tok TTFT_s prefill_tok/s decode_tok/s gen_tok decode_wall accept_len) and the
per-phase breakdown of the decode steps (from perfkit spans, with the unattributed remainder).
A short warm-up generation runs first and is not reported.

Format history (`format_version`) of the record: 1: keys `format` and `version`; 2: `format_version`.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from perfkit.engineoptions import APPROX_FROM
from perfkit.files import VERSION_KEY
from perfkit.phases import BREAKDOWN, STEP

__all__ = ["BenchConfig", "run_bench", "format_bench", "APPROX_FROM", "FORMAT_VERSION"]

FORMAT_VERSION = 2


@dataclass(frozen=True)
class BenchConfig:
    ctx: int
    gen: int
    batch: int = 1
    budget: int = 32
    mode: str = "spec"
    mask: str = "compact"
    tree: str = "vectorized"
    device: str = "cpu"
    dtype: str = "fp32"
    preset: str = "shipped"
    fill: str = "auto"  # auto | prefill | approx
    temperature: float = 0.0  # 0: greedy; above: seeded sampling (spec and AR give the same tokens)
    seed: int = 0
    prompt: int = 256  # prompt bytes before padding to ctx


def run_bench(cfg: BenchConfig, *, engine=None) -> dict:
    """Measure once; returns a versioned, JSON-ready record."""
    import torch

    from perfkit.engine import data
    from perfkit.engine.checkpoints import load_engine
    from perfkit.probe.spans import capture

    if engine is None:
        engine = load_engine(cfg.preset, device=cfg.device, dtype=cfg.dtype)
    fill = cfg.fill if cfg.fill != "auto" else ("approx" if cfg.ctx >= APPROX_FROM else "prefill")
    prompts = data.sample_prompts(cfg.batch, min(cfg.prompt, cfg.ctx))
    options = dict(
        mode=cfg.mode, budget=cfg.budget, tree=cfg.tree, mask=cfg.mask, temperature=cfg.temperature, seed=cfg.seed
    )
    # Warm-up: small context, few tokens; allocator, thread pools and lazy tables get built.
    engine.generate(
        prompts,
        max_new_tokens=min(cfg.gen, 8),
        context=min(cfg.ctx, 512),
        fill=fill if cfg.ctx >= 512 else "prefill",
        **options,
    )
    with capture() as cap:
        result = engine.generate(prompts, max_new_tokens=cfg.gen, context=cfg.ctx, fill=fill, **options)
    steps = cap.steps()
    phases = {}
    for name in (STEP,) + BREAKDOWN:
        values = [s[name] for s in steps if name in s]
        if values:
            phases[name] = {"mean_ms": statistics.fmean(values) * 1e3, "total_s": sum(values), "n": len(values)}
    step_mean = phases.get(STEP, {}).get("mean_ms", float("nan"))
    for row in phases.values():
        row["share"] = row["mean_ms"] / step_mean if step_mean else float("nan")
    return {
        VERSION_KEY: FORMAT_VERSION,
        "config": asdict(cfg) | {"fill": fill},
        "engine": {
            "preset": engine.preset,
            "device": str(engine.device),
            "dtype": str(engine.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
            "target": engine.target_config.to_dict(),
            "drafter": engine.drafter_config.to_dict(),
        },
        "result": {
            "ctx_req": cfg.ctx,
            "prompt_tok": result.prompt_tokens,
            "ttft_s": result.ttft_s,
            "prefill_tok_s": result.prefill_tok_s,
            "decode_tok_s": result.decode_tok_s,
            "gen_tok": result.generated_tokens,
            "decode_wall_s": result.decode_s,
            "accept_len": result.mean_accept_length,
            "steps": result.steps,
            "fill": result.fill,
            "experts_touched_mean": statistics.fmean(result.experts_touched) if result.experts_touched else None,
        },
        "phases": phases,
    }


def format_bench(record: dict) -> str:
    """The human-readable table: one result row, a fill note, then the phase breakdown."""
    r = record["result"]
    c = record["config"]
    e = record["engine"]
    fill_note = (
        "fill=approx (APPROXIMATE: head and tail prefilled, the cache "
        "between filled with copies; attention cost real, contents not)"
        if r["fill"] == "approx"
        else "fill=prefill (the whole prefix went through the target)"
    )
    lines = [
        f"engine {e['preset']} on {e['device']} {e['dtype']} "
        f"({e['threads']} threads): mode={c['mode']} batch={c['batch']}"
        + (f" budget={c['budget']} tree={c['tree']} mask={c['mask']}" if c["mode"] == "spec" else "")
        + (f" temperature={c['temperature']:g} seed={c['seed']}" if c.get("temperature") else " greedy"),
        fill_note,
        f"{'ctx_req':>8} {'prompt_tok':>10} {'TTFT_s':>8} {'prefill_tok/s':>13} "
        f"{'decode_tok/s':>12} {'gen_tok':>7} {'decode_wall':>11} {'accept_len':>10}",
        f"{r['ctx_req']:>8} {r['prompt_tok']:>10} {r['ttft_s']:>8.3f} "
        f"{r['prefill_tok_s']:>13.1f} {r['decode_tok_s']:>12.1f} "
        f"{r['gen_tok']:>7} {r['decode_wall_s']:>11.3f} {r['accept_len']:>10.2f}",
    ]
    if r.get("experts_touched_mean") is not None:
        lines.append(f"experts touched per step (summed over layers): {r['experts_touched_mean']:.1f}")
    phases = record["phases"]
    if phases:
        lines.append("")
        lines.append(f"per decode step ({r['steps']} steps)   {'mean_ms':>9} {'share':>7}")
        for name in (STEP,) + BREAKDOWN:
            if name in phases:
                row = phases[name]
                lines.append(f"  {name:<28} {row['mean_ms']:>9.3f} {row['share'] * 100:>6.1f}%")
    return "\n".join(lines)
