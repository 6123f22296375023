"""Roofline floors for a decode or verify step: the fastest the machine could possibly run it.

A step must at least read the weights it uses and the KV cache it attends to, and write the new
KV entries; it must at least do its FLOPs. Divided by the machine's DRAM bandwidth and peak FLOP/s,
these give two floors; the larger one is the step's floor and says which resource bounds it. The
case study's wrong story began with a floor computed by hand ("attention traffic explains 30% of
the step"); here it is computed once, from the model configuration, and recorded next to the
measurement, so a hypothesis can say "verify runs within 2x of its memory-bound floor".

What is counted (activations and the attention mask are ignored: small at decode):
  bytes = weights read + KV read + KV written
    weights read: per layer q/k/v/o projections, norms, the feed-forward (dense: all of it; MoE:
    router + only the experts touched), plus the final norm, the LM head and the embedding rows of
    the step's tokens;
    KV read: batch x context x layers x 2 x kv_heads x head_dim x dtype_bytes;
    KV written: the same with q_tokens in place of context.
  flops = 2 x (parameters each token uses) x tokens + attention, with tokens = batch x q_tokens and
    attention = 4 x heads x head_dim x (context + q_tokens) x tokens x layers (QK^T and PV, every
    key position including the step's own tokens). An MoE token uses top_k experts.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from perfkit.errors import UserError

__all__ = [
    "Hardware",
    "PRESETS",
    "Cost",
    "StepFloor",
    "step_cost",
    "floor",
    "sweep",
    "expected_experts_touched",
    "main",
]


BEST_OF = 5  # calls in a row per value of a sampled floor's rates: the fastest is the value


@dataclass(frozen=True)
class Hardware:
    """What bounds a step: DRAM bytes/s and peak FLOP/s (dense, at the step's dtype)."""

    name: str
    dram_bytes_per_s: float
    peak_flops: float
    source: str = "spec"  # "spec" (a datasheet) or "measured" (perfkit.machine.bandwidth on this machine)

    def __post_init__(self):
        for fld in ("dram_bytes_per_s", "peak_flops"):
            v = getattr(self, fld)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise UserError(f"machine {self.name!r}: {fld} must be a positive number, got {v!r}")

    @classmethod
    def preset(cls, name: str) -> Hardware:
        try:
            return PRESETS[name]
        except KeyError:
            raise UserError(f"unknown machine {name!r}; known: {', '.join(PRESETS)} or 'measured'") from None

    @classmethod
    def measured(cls, *, device: str | None = None, refresh: bool = False) -> Hardware:
        """This machine from perfkit.machine.bandwidth: triad bandwidth and matmul FLOP/s, both measured.

        `device`: "cpu" or "cuda:N" (default: the first GPU when there is one, else the CPU).
        """
        from perfkit.machine import bandwidth

        m = bandwidth.measured(refresh=refresh)
        dev = device or m.main_device()
        triad = m.rate("triad", dev)
        matmul = m.rate("matmul", dev)
        if dev.startswith("cuda"):
            gpus = m.machine.get("gpus") or []
            index = int(dev.split(":")[1])
            label = gpus[index] if index < len(gpus) else dev
        else:
            label = m.machine.get("cpu_model", dev)
        return cls(
            name=f"measured {dev} ({label})",
            dram_bytes_per_s=triad.mean,
            peak_flops=matmul.mean,
            source="measured",
        )

    @classmethod
    def sampled(cls, *, device: str = "cpu", repeat: int = 5) -> list[Hardware]:
        """This machine as this process sees it now, `repeat` times: triad bandwidth and matmul FLOP/s
        measured here, with this process's threads and the machine's present state (never cached).

        A floor computed from each is a sample of the floor: a probe that records them in every replicate
        lets the verdict carry the floor's own noise (perfkit/experiment/records/kinds/value.py). Only the two
        kernels a floor reads are run, each `repeat` times (on a GPU, where they are cheap, more triads):
        a replicate on the CPU spends most of this in first touching the three arrays the triad needs.

        Each value is the fastest of `BEST_OF` calls in a row, as STREAM reports its best rate: a floor is
        what the hardware can reach, and on a shared or throttling host a single 10 ms matmul caught in a
        slow moment (seen here: 1024^2 fp32 matmuls of one process at 99-199 GFLOP/s within 25 calls,
        process medians 85-197) would put the floor at the moment, not at the machine.
        """
        from perfkit.machine import bandwidth

        paired = repeat if device == "cpu" else None  # a GPU's default: more matmuls, as cheap as they are there
        found = bandwidth.rates_on(
            device, repeat=repeat, kernels=("triad", "matmul"), matmul_repeat=paired, best_of=BEST_OF
        )
        rates = {r.kernel: r for r in found}
        name = f"measured {device} in-process"
        pairs = zip(rates["triad"].samples, rates["matmul"].samples)  # as many as the fewer of the two
        return [cls(name=name, dram_bytes_per_s=b, peak_flops=f, source="measured") for b, f in pairs]


# Datasheet figures: DRAM bandwidth and dense (no sparsity) bf16 tensor-core FLOP/s.
PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware("H100 SXM", 3.35e12, 989e12),
        Hardware("H100 PCIe", 2.0e12, 756e12),
        Hardware("H200 SXM", 4.8e12, 989e12),
        Hardware("A100 80GB SXM", 2.039e12, 312e12),
        Hardware("A100 40GB", 1.555e12, 312e12),
        Hardware("L40S", 864e9, 362e12),
        Hardware("B200", 8.0e12, 2250e12),
    )
}


@dataclass(frozen=True)
class Cost:
    """Bytes a step moves to or from DRAM and FLOPs it does (see the module docstring)."""

    bytes: float
    flops: float


@dataclass(frozen=True)
class StepFloor:
    """The lower bound on a step's time on some hardware and which resource sets it."""

    seconds: float
    bound: str  # "memory" | "compute"
    bytes: float
    flops: float
    hardware: Hardware
    memory_seconds: float = 0.0
    compute_seconds: float = 0.0

    def note(self) -> str:
        """One line for a recorded floor metric or the ledger, e.g. '...memory-bound floor at 48.2 GB/s'."""
        rate = (
            f"{self.hardware.dram_bytes_per_s / 1e9:.4g} GB/s"
            if self.bound == "memory"
            else f"{self.hardware.peak_flops / 1e12:.4g} TFLOP/s"
        )
        return (
            f"{self.bound}-bound floor {self.seconds * 1e3:.4g} ms at {rate} {self.hardware.source} "
            f"({self.hardware.name}; {self.bytes / 1e9:.4g} GB, {self.flops / 1e9:.4g} GFLOP)"
        )


_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "n_experts", "top_k")


def _check_config(config) -> None:
    missing = [f for f in _FIELDS if not hasattr(config, f)]
    if missing:
        raise UserError(f"model config {type(config).__name__} lacks {', '.join(missing)}")


def expected_experts_touched(n_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts a layer touches when `tokens` tokens each pick `top_k` of `n_experts`
    uniformly at random: n x (1 - (1 - k/n)^tokens). Real routers are skewed (fewer touched);
    measure and pass `experts_touched` when you can."""
    if n_experts <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def step_cost(
    config, *, batch: int, context: int, q_tokens: int, dtype_bytes: float, experts_touched: float | None = None
) -> Cost:
    """Bytes and FLOPs of one forward step of `q_tokens` new tokens per request over `context`
    cached tokens, for `batch` requests (decode: q_tokens=1; tree verify: q_tokens=nodes).

    `experts_touched`: distinct experts per layer in this step (MoE only); default: the
    uniform-routing expectation of `expected_experts_touched`.
    """
    _check_config(config)
    if batch < 1 or q_tokens < 1 or context < 0 or dtype_bytes <= 0:
        raise UserError(
            f"step_cost needs batch >= 1, q_tokens >= 1, context >= 0, dtype_bytes > 0; got "
            f"batch={batch}, q_tokens={q_tokens}, context={context}, dtype_bytes={dtype_bytes}"
        )
    c = config
    d, hd, L = c.d_model, c.head_dim, c.n_layers
    tokens = batch * q_tokens
    attn_params = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d
    norm_params = 2 * d
    expert_params = 3 * d * c.d_ff  # SwiGLU: gate, up, down
    if c.n_experts:
        if experts_touched is None:
            experts_touched = expected_experts_touched(c.n_experts, c.top_k, tokens)
        if not 0 < experts_touched <= c.n_experts:
            raise UserError(f"experts_touched must be in (0, {c.n_experts}], got {experts_touched}")
        router = d * c.n_experts
        ffn_read = router + experts_touched * expert_params
        ffn_per_token = router + c.top_k * expert_params
    else:
        if experts_touched is not None:
            raise UserError("experts_touched applies to MoE configs only (n_experts > 0)")
        ffn_read = ffn_per_token = expert_params
    head = c.vocab_size * d
    weights_read = L * (attn_params + norm_params + ffn_read) + d + head + tokens * d  # + embedding rows
    kv_per_token = L * 2 * c.n_kv_heads * hd
    kv_read = batch * context * kv_per_token
    kv_written = tokens * kv_per_token
    nbytes = (weights_read + kv_read + kv_written) * dtype_bytes
    params_per_token = L * (attn_params + ffn_per_token) + head
    attention = 4 * c.n_heads * hd * (context + q_tokens) * tokens * L
    flops = 2 * params_per_token * tokens + attention
    return Cost(bytes=float(nbytes), flops=float(flops))


def floor(cost: Cost, hardware: Hardware) -> StepFloor:
    """The larger of the memory and compute floors of `cost` on `hardware`."""
    mem = cost.bytes / hardware.dram_bytes_per_s
    comp = cost.flops / hardware.peak_flops
    return StepFloor(
        seconds=max(mem, comp),
        bound="memory" if mem >= comp else "compute",
        bytes=cost.bytes,
        flops=cost.flops,
        hardware=hardware,
        memory_seconds=mem,
        compute_seconds=comp,
    )


def sweep(
    config,
    hardware: Hardware,
    *,
    contexts: list[int],
    batch: int,
    q_tokens: int,
    dtype_bytes: float,
    experts_touched: float | None = None,
) -> list[tuple[int, StepFloor]]:
    """The floor at each context length, e.g. for a context-sweep hypothesis or the report table."""
    return [
        (
            ctx,
            floor(
                step_cost(
                    config,
                    batch=batch,
                    context=ctx,
                    q_tokens=q_tokens,
                    dtype_bytes=dtype_bytes,
                    experts_touched=experts_touched,
                ),
                hardware,
            ),
        )
        for ctx in contexts
    ]


def format_sweep(rows: list[tuple[int, StepFloor]]) -> str:
    lines = [
        f"{'context':>8} {'MB':>10} {'MFLOP':>10} {'memory_us':>10} {'compute_us':>10} {'floor_us':>10} {'bound':>8}"
    ]
    for ctx, f in rows:
        lines.append(
            f"{ctx:>8} {f.bytes / 1e6:>10.4g} {f.flops / 1e6:>10.4g} {f.memory_seconds * 1e6:>10.4g} "
            f"{f.compute_seconds * 1e6:>10.4g} {f.seconds * 1e6:>10.4g} {f.bound:>8}"
        )
    return "\n".join(lines)


def _engine_config(preset: str):
    """The target configuration of a bundled engine preset (shipped, tiny-random, moe-random)."""
    from perfkit.engine import load_engine

    return load_engine(preset, device="cpu").target_config


def main(argv: list[str]) -> int:
    """`perfkit roofline`: the floor of an engine step over a context sweep."""
    p = argparse.ArgumentParser(prog="perfkit roofline", description=main.__doc__)
    p.add_argument("--preset", default="shipped", help="engine preset whose target is costed (default: shipped)")
    p.add_argument("--machine", default="measured", help=f"'measured' or one of: {', '.join(PRESETS)}")
    p.add_argument(
        "--contexts",
        default="1024,4096,16384,32768,65536",
        help="cached context lengths to cost, comma-separated (default: 1024,4096,16384,32768,65536)",
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--q-tokens", type=int, default=1, help="tokens per request per step (tree nodes)")
    p.add_argument("--dtype-bytes", type=float, default=4.0)
    p.add_argument("--experts-touched", type=float, default=None)
    a = p.parse_args(argv)
    hardware = Hardware.measured() if a.machine == "measured" else Hardware.preset(a.machine)
    try:
        contexts = [int(x) for x in a.contexts.split(",") if x]
    except ValueError:
        raise UserError(f"--contexts takes comma-separated integers, got {a.contexts!r}") from None
    rows = sweep(
        _engine_config(a.preset),
        hardware,
        contexts=contexts,
        batch=a.batch,
        q_tokens=a.q_tokens,
        dtype_bytes=a.dtype_bytes,
        experts_touched=a.experts_touched,
    )
    print(
        f"{hardware.name}: {hardware.dram_bytes_per_s / 1e9:.4g} GB/s, {hardware.peak_flops / 1e12:.4g} TFLOP/s "
        f"({hardware.source}); batch {a.batch}, {a.q_tokens} token(s)/request, {a.dtype_bytes:g} B/element"
    )
    print(format_sweep(rows))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
