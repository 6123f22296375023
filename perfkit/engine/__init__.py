"""The bundled speculative-decoding engine: the subject the shipped probes investigate.

A probe drives it like this::

    from perfkit.engine import load_engine, data
    from perfkit.spans import capture

    engine = load_engine("shipped", device="cpu", dtype="fp32")   # or "tiny-random", "moe-random"
    prompts = data.sample_prompts(1, 256)                          # held-out stdlib text, bytes
    with capture() as cap:
        result = engine.generate(prompts, max_new_tokens=64, mode="spec", budget=32,
                                 tree="vectorized", mask="compact", context=8192, fill="approx")
    result.decode_tok_s, result.mean_accept_length                # GenerateResult fields
    cap.steps()     # per decode step: {"step": s, "draft": s, ..., "kv_commit": s, "unattributed": s}
    cap.samples("prepare_for_verify")                             # seconds, one per step

Pieces: ``model`` (target, ModelConfig, KVCache), ``drafter`` (block drafter), ``decode`` (Engine,
GenerateResult, the step loop), ``checkpoints`` (weights format, presets, load_engine), ``data``
(stdlib text, byte encode/decode), ``train`` (the training script), ``bench``/``benchmarks``/``cli``
(``perfkit engine bench|benchmarks|train``). Kernels benchmarked in isolation live in
``perfkit.kernels``. Imports are lazy so that ``import perfkit.engine`` does not load torch.
"""

from __future__ import annotations

import importlib

__all__ = ["load_engine", "Engine", "GenerateResult", "ModelConfig", "DrafterConfig"]

_WHERE = {
    "load_engine": "perfkit.engine.checkpoints",
    "Engine": "perfkit.engine.decode",
    "GenerateResult": "perfkit.engine.decode",
    "ModelConfig": "perfkit.engine.model",
    "DrafterConfig": "perfkit.engine.drafter",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'perfkit.engine' has no attribute {name!r}")
