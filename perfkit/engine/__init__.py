"""The bundled speculative-decoding engine: the subject the shipped probes investigate.

A probe drives it like this::

    from perfkit.engine import load_engine, data
    from perfkit.probe.spans import capture

    engine = load_engine("shipped", device="cpu", dtype="fp32")   # or "tiny-random", "moe-random"
    prompts = data.sample_prompts(1, 256)                          # held-out stdlib source, bytes
    with capture() as cap:
        result = engine.generate(prompts, max_new_tokens=64, mode="spec", budget=32,
                                 tree="vectorized", mask="compact", context=8192, fill="approx")
    result.decode_tok_s, result.mean_accept_length, result.accept_lengths   # GenerateResult
    cap.steps()     # one dict per decode step: {"step": s, "draft": s, "tree_build": s,
                    #   "prepare_for_verify": s, "verify_forward": s, "accept": s, "kv_commit": s,
                    #   "unattributed": s}, seconds
    cap.samples("prepare_for_verify")                             # seconds, one per step

`mode="ar"` decodes one token per step with the same model and cache (steps then have
verify_forward, accept and kv_commit). `context=N` makes every cached prefix N tokens long;
`fill="approx"` fills long prefixes in seconds (cache size and attention cost real, contents
approximate; the result says which fill was used). Greedy speculative output is token-identical to
greedy autoregressive output. With `PERFKIT_PROFILE=1` every phase also logs
`[perfkit-prof pid=N] <phase>: n=50 mean=... last=...` lines and a summary at exit.

Pieces: the model at this package's top: `model` (target, ModelConfig, KVCache), `drafter` (block
drafter, DrafterConfig), `decode` (Engine, GenerateResult, the step loop), `sampling`, `checkpoints`
(weights format, presets, `load_engine`), `data` (stdlib text, byte encode/decode, held-out prompts).
Then a room per job built on it: `training` (`perfkit engine train`), `benchmarks` (`bench`, `headline`:
`perfkit engine bench|benchmarks`) and `serve` (`perfkit engine serve`: the OpenAI-compatible server
`app`, the rank processes `workers`/`rank`, their `messages`, a rank's tensor-parallel shard `tp`);
`cli` over them. The kernels probes time in isolation live in
`perfkit.kernels`. Imports are lazy: `import perfkit.engine` does not load torch.
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
