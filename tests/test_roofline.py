"""Roofline arithmetic against figures computed by hand, independently of the module's formulas."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from perfkit.errors import UserError
from perfkit.files import write_json
from perfkit.machine import bandwidth, roofline
from perfkit.machine.roofline import PRESETS, Cost, Hardware, expected_experts_touched, floor, step_cost


@dataclass(frozen=True)
class Config:
    """The fields perfkit.engine.model.ModelConfig has; roofline must accept any such object."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    n_experts: int = 0
    top_k: int = 0
    max_seq_len: int = 131072
    rope_base: float = 500000.0
    norm_eps: float = 1e-5


# Llama-3-8B shapes: 32 layers, d_model 4096, 32 query heads / 8 KV heads of 128, SwiGLU 14336,
# vocabulary 128256, untied output head.
LLAMA_8B = Config(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=14336)


def test_llama_8b_decode_on_h100_sxm_matches_hand_arithmetic():
    # Parameters read, one matrix at a time:
    q_proj = 4096 * 4096  # 16,777,216
    k_proj = v_proj = 4096 * 1024  # 4,194,304 each (8 KV heads x 128)
    o_proj = 4096 * 4096
    gate = up = down = 4096 * 14336  # 58,720,256 each
    norms = 4096 + 4096
    per_layer = q_proj + k_proj + v_proj + o_proj + gate + up + down + norms
    assert per_layer == 218_112_000
    weights = 32 * per_layer + 4096 + 128256 * 4096 + 4096  # final norm, LM head, one embedding row
    assert weights == 7_504_928_768
    kv_read = 8192 * 32 * 2 * 1024 * 2  # context x layers x (K, V) x (8 x 128) x bf16
    assert kv_read == 2**30
    kv_written = 32 * 2 * 1024 * 2
    expected_bytes = weights * 2 + kv_read + kv_written
    assert expected_bytes == 16_083_730_432

    matmul_params = 32 * (q_proj + k_proj + v_proj + o_proj + gate + up + down) + 128256 * 4096
    attention = 32 * 32 * 128 * 2 * 2 * (8192 + 1)  # layers x heads x head_dim x (QK, PV) x 2 FLOP x keys
    expected_flops = 2 * matmul_params + attention
    assert expected_flops == 19_304_808_448

    cost = step_cost(LLAMA_8B, batch=1, context=8192, q_tokens=1, dtype_bytes=2)
    assert cost.bytes == expected_bytes
    assert cost.flops == expected_flops

    f = floor(cost, PRESETS["H100 SXM"])
    assert f.bound == "memory"
    assert f.seconds == pytest.approx(16_083_730_432 / 3.35e12)
    assert f.seconds == pytest.approx(4.801e-3, rel=1e-3)  # ~4.8 ms per token: the known 8B-on-H100 figure
    assert f.compute_seconds == pytest.approx(19_304_808_448 / 989e12)
    assert "memory-bound floor 4.801 ms at 3350 GB/s spec" in f.note()


def test_context_sweep_adds_exactly_the_kv_bytes():
    h100 = PRESETS["H100 SXM"]
    rows = roofline.sweep(LLAMA_8B, h100, contexts=[1024, 2048, 65536], batch=1, q_tokens=1, dtype_bytes=2)
    kv_per_token = 32 * 2 * 1024 * 2  # 131,072 bytes of K and V per cached token
    assert rows[1][1].bytes - rows[0][1].bytes == 1024 * kv_per_token
    assert rows[2][1].bytes - rows[0][1].bytes == (65536 - 1024) * kv_per_token
    assert [ctx for ctx, _ in rows] == [1024, 2048, 65536]
    assert rows[0][1].seconds < rows[1][1].seconds < rows[2][1].seconds


def test_large_batch_tree_verify_becomes_compute_bound():
    # 64 requests x 64 tree nodes = 4096 tokens per step: far right of the H100 ridge (~295 FLOP/B).
    cost = step_cost(LLAMA_8B, batch=64, context=8192, q_tokens=64, dtype_bytes=2)
    f = floor(cost, PRESETS["H100 SXM"])
    assert cost.flops / cost.bytes > 989e12 / 3.35e12
    assert f.bound == "compute"
    assert f.seconds == pytest.approx(cost.flops / 989e12)


MOE = Config(
    vocab_size=1000, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, n_experts=8, top_k=2
)


def test_moe_reads_only_the_experts_touched_and_computes_top_k():
    expert = 3 * 64 * 128  # 24,576 parameters per SwiGLU expert
    router = 64 * 8
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64  # q, k, v (2 KV heads x 16), o
    head = 1000 * 64

    def hand_bytes(touched: int, tokens: int, context: int) -> int:
        weights = 2 * (attn + 2 * 64 + router + touched * expert) + 64 + head + tokens * 64
        kv = 2 * 2 * 32 * (context + tokens)  # layers x (K, V) x 32 per token
        return 4 * (weights + kv)  # fp32

    c3 = step_cost(MOE, batch=1, context=100, q_tokens=4, dtype_bytes=4, experts_touched=3)
    c8 = step_cost(MOE, batch=1, context=100, q_tokens=4, dtype_bytes=4, experts_touched=8)
    assert c3.bytes == hand_bytes(3, 4, 100)
    assert c8.bytes - c3.bytes == 4 * 2 * 5 * expert  # five more experts in each of two layers
    # FLOPs do not depend on how many experts were touched: each token uses top_k of them.
    per_token = 2 * (attn + router + 2 * expert) + head
    attention = 4 * 4 * 16 * (100 + 4) * 4 * 2
    assert c3.flops == c8.flops == 2 * per_token * 4 + attention


def test_moe_default_experts_touched_is_the_uniform_routing_expectation():
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)  # one token touches exactly top_k
    assert expected_experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert expected_experts_touched(8, 2, 1000) == pytest.approx(8.0)
    # verify cost grows with tree size at batch 1 (the case study's MoE observation)
    sizes = [1, 4, 16, 64]
    costs = [step_cost(MOE, batch=1, context=1000, q_tokens=q, dtype_bytes=2).bytes for q in sizes]
    assert costs == sorted(costs) and costs[0] < costs[-1]
    explicit = step_cost(
        MOE, batch=1, context=1000, q_tokens=2, dtype_bytes=2, experts_touched=expected_experts_touched(8, 2, 2)
    )
    assert step_cost(MOE, batch=1, context=1000, q_tokens=2, dtype_bytes=2).bytes == explicit.bytes


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError, match="experts_touched"):
        step_cost(MOE, batch=1, context=10, q_tokens=1, dtype_bytes=2, experts_touched=9)
    with pytest.raises(UserError, match="MoE configs only"):
        step_cost(LLAMA_8B, batch=1, context=10, q_tokens=1, dtype_bytes=2, experts_touched=1)
    with pytest.raises(UserError, match="batch >= 1"):
        step_cost(LLAMA_8B, batch=0, context=10, q_tokens=1, dtype_bytes=2)
    with pytest.raises(UserError, match="lacks"):
        step_cost(object(), batch=1, context=10, q_tokens=1, dtype_bytes=2)
    with pytest.raises(UserError, match="positive"):
        Hardware("broken", 0.0, 1e12)
    with pytest.raises(UserError, match="unknown machine"):
        Hardware.preset("H900")
    assert Hardware.preset("H200 SXM").dram_bytes_per_s == 4.8e12


def test_presets_hold_datasheet_figures():
    assert PRESETS["H100 SXM"].dram_bytes_per_s == 3.35e12
    assert PRESETS["H100 SXM"].peak_flops == 989e12
    assert PRESETS["A100 80GB SXM"].dram_bytes_per_s == 2.039e12
    assert all(h.source == "spec" for h in PRESETS.values())


def test_measured_hardware_reads_the_cached_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path))
    inputs = {"cpu_model": "Test CPU", "logical_cores": 2, "memory_gib": 8, "gpus": []}
    monkeypatch.setattr(bandwidth, "fingerprint_inputs", lambda: inputs)

    def rate(kernel, unit, value):
        return bandwidth.Rate(kernel, "cpu", unit, value, value * 0.9, value * 1.1, value, (value,), 1)

    m = bandwidth.Measurement(
        fingerprint=bandwidth.fingerprint(inputs),
        machine=inputs,
        measured_at="then",
        seconds=1.0,
        rates=(rate("triad", "B/s", 48.2e9), rate("matmul", "FLOP/s", 2e11)),
    )
    stored = {k: v for k, v in m.to_dict().items() if k not in ("cached", "path")}
    write_json(bandwidth.cache_path(), stored, version=bandwidth.FORMAT_VERSION)
    monkeypatch.setattr(bandwidth, "measure", lambda **kw: pytest.fail("must reuse the cache"))

    hardware = Hardware.measured()
    assert hardware.source == "measured"
    assert hardware.dram_bytes_per_s == 48.2e9
    assert hardware.peak_flops == 2e11
    assert "Test CPU" in hardware.name
    f = floor(Cost(bytes=48.2e9, flops=1.0), hardware)
    assert f.seconds == pytest.approx(1.0)
    assert "at 48.2 GB/s measured" in f.note()


def test_main_prints_the_context_sweep(monkeypatch, capsys):
    monkeypatch.setattr(roofline, "_engine_config", lambda preset: LLAMA_8B)
    assert roofline.main(["--machine", "H100 SXM", "--contexts", "8192,65536", "--dtype-bytes", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("H100 SXM: 3350 GB/s, 989 TFLOP/s (spec); batch 1")
    assert out[1].split() == ["context", "MB", "MFLOP", "memory_us", "compute_us", "floor_us", "bound"]
    row = out[2].split()
    assert row[0] == "8192" and row[1] == "1.608e+04" and row[5] == "4801" and row[6] == "memory"
    with pytest.raises(UserError, match="--contexts"):
        roofline.main(["--machine", "H100 SXM", "--contexts", "8k"])


def test_shipped_engine_presets_are_costed():
    """The engine's own config objects are accepted as they are."""
    cfg = roofline._engine_config("moe-random")
    assert cfg.n_experts > 0
    cost = step_cost(cfg, batch=1, context=4096, q_tokens=32, dtype_bytes=4)
    assert cost.bytes > 0 and cost.flops > 0
