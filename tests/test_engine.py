"""The engine: speculative decoding is token-identical to autoregressive decoding (greedy, and
sampled with the same seed), phases are instrumented, MoE expert counting, fills, dtypes and errors."""

import pytest
import torch

from perfkit.engine import decode, load_engine
from perfkit.engine.model import KVCache, ModelConfig
from perfkit.errors import UserError
from perfkit.phases import PHASES, STEP, UNATTRIBUTED
from perfkit.probe.spans import capture

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = [[5, 17, 99, 3, 42, 42, 7, 250, 11, 0, 64], [200, 1, 2], [9, 8, 7, 6, 5, 4, 3]]


@pytest.fixture(scope="module")
def tiny():
    return load_engine("tiny-random", seed=1)


@pytest.fixture(scope="module")
def moe():
    return load_engine("moe-random", seed=2)


@pytest.mark.parametrize("batch", [1, 3])
def test_spec_is_lossless_over_every_option(tiny, batch):
    prompts = PROMPTS[:batch]
    ar = tiny.generate(prompts, max_new_tokens=20, mode="ar")
    assert [len(t) for t in ar.tokens] == [20] * batch
    for budget in (1, 4, 23):
        for tree in ("heap", "vectorized"):
            for mask in ("naive", "compact"):
                spec = tiny.generate(prompts, max_new_tokens=20, mode="spec", budget=budget, tree=tree, mask=mask)
                assert spec.tokens == ar.tokens, (budget, tree, mask)
                assert spec.steps == len(spec.accept_lengths) <= ar.steps


@pytest.mark.parametrize("batch", [1, 3])
def test_sampled_spec_is_lossless_over_every_option(tiny, batch):
    """Sampling at temperature 1 with a seed: spec emits exactly the AR tokens of that seed."""
    prompts = PROMPTS[:batch]
    ar = tiny.generate(prompts, max_new_tokens=20, mode="ar", temperature=1.0, seed=11)
    assert ar.tokens != tiny.generate(prompts, max_new_tokens=20, mode="ar").tokens  # it does sample
    for budget in (1, 4, 23):
        for tree in ("heap", "vectorized"):
            for mask in ("naive", "compact"):
                spec = tiny.generate(
                    prompts,
                    max_new_tokens=20,
                    mode="spec",
                    budget=budget,
                    tree=tree,
                    mask=mask,
                    temperature=1.0,
                    seed=11,
                )
                assert spec.tokens == ar.tokens, (budget, tree, mask)


def test_seeds_and_temperature(tiny):
    run = lambda **kw: tiny.generate(PROMPTS[:2], max_new_tokens=16, mode="ar", **kw)  # noqa: E731
    assert run(temperature=0.7, seed=1).tokens == run(temperature=0.7, seed=1).tokens
    assert run(temperature=0.7, seed=1).tokens != run(temperature=0.7, seed=2).tokens
    assert run(temperature=0.0, seed=1).tokens == run(temperature=0.0, seed=2).tokens == run().tokens
    result = run(temperature=0.7, seed=3)
    assert (result.temperature, result.seed) == (0.7, 3)


def test_moe_spec_is_lossless_and_counts_experts(moe):
    cfg = moe.target_config
    prompts = PROMPTS[:1]
    ar = moe.generate(prompts, max_new_tokens=12, mode="ar")
    # One token per step at batch 1 routes to exactly top_k distinct experts in every layer.
    assert ar.experts_touched == [cfg.n_layers * cfg.top_k] * ar.steps
    spec = moe.generate(prompts, max_new_tokens=12, mode="spec", budget=24)
    assert spec.tokens == ar.tokens
    assert len(spec.experts_touched) == spec.steps
    # 25 verified tokens touch more experts than one, never more than exist.
    assert all(cfg.n_layers * cfg.top_k < t <= cfg.n_layers * cfg.n_experts for t in spec.experts_touched)
    assert tiny_has_no_experts()


def tiny_has_no_experts():
    r = load_engine("tiny-random").generate([[1, 2]], max_new_tokens=3, mode="spec", budget=4)
    return r.experts_touched == []


def test_moe_touched_counts_distinct_routed_experts():
    from perfkit.engine.model import MoE

    cfg = ModelConfig(d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=8, n_experts=4, top_k=1)
    layer = MoE(cfg)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4, 8))  # token feature i picks expert i
    x = torch.zeros(3, 8)
    x[0, 0] = x[1, 2] = x[2, 2] = 1.0
    layer(x)
    assert layer.touched.item() == 2  # experts 0 and 2


def test_kv_commit_moves_accepted_entries(tiny):
    cache = KVCache(tiny.target_config, batch=2, capacity=12, device="cpu", dtype=torch.float32)
    cache.kv.copy_(torch.arange(cache.kv.numel(), dtype=torch.float32).view_as(cache.kv))
    before = cache.kv.clone()
    src = torch.tensor([[3, 5, 8], [2, 2, 9]])
    dst = torch.tensor([[3, 4, 5], [2, 3, 4]])
    cache.move(src, dst)
    for b in range(2):
        for s, d in zip(src[b].tolist(), dst[b].tolist()):
            assert torch.equal(cache.kv[:, :, b, :, d], before[:, :, b, :, s])
        untouched = [i for i in range(12) if i not in dst[b].tolist()]
        assert torch.equal(cache.kv[:, :, b, :, untouched], before[:, :, b, :, untouched])


def test_every_phase_is_a_span(tiny):
    with capture() as cap:
        spec = tiny.generate(PROMPTS[:2], max_new_tokens=10, mode="spec", budget=8)
    steps = cap.steps()
    assert len(steps) == spec.steps > 0
    for row in steps:
        assert set(row) == {STEP, UNATTRIBUTED, *PHASES}
        assert row[STEP] >= sum(row[p] for p in PHASES) >= 0
    assert len(cap.samples("prepare_for_verify")) == spec.steps
    with capture() as cap:
        ar = tiny.generate(PROMPTS[:2], max_new_tokens=6, mode="ar")
    steps = cap.steps()
    assert len(steps) == ar.steps == 5  # the first token comes from the prefill
    assert {"verify_forward", "accept", "kv_commit"} <= set(steps[0])
    assert steps[0]["draft"] == 0.0  # the engine's declared phases are always columns; AR drafts nothing


def test_a_torch_profiler_trace_names_every_phase(tiny, tmp_path):
    import json

    from perfkit.probe import profiler

    trace = tmp_path / "trace.json"
    profiler.start(str(trace))
    try:
        with capture():
            tiny.generate(PROMPTS[:1], max_new_tokens=6, mode="spec", budget=8)
    finally:
        profiler.stop()
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {STEP, *PHASES} <= names  # Perfetto shows each phase by name beside the aten ops


def test_chunked_prefill_matches_one_pass(tiny, monkeypatch):
    monkeypatch.setattr(decode, "PREFILL_CHUNK", 5)
    long, short = list(range(3, 40)), list(range(100, 112))
    w = tiny.drafter_config.window
    with torch.no_grad():
        cache = KVCache(tiny.target_config, batch=2, capacity=64, device="cpu", dtype=torch.float32)
        window = tiny._prefill([long, short], cache)  # [2, W, D], chunks of 5 over right-padded prompts
        whole_long = tiny.target.forward_sequence(torch.tensor([long]))[0]
        whole_short = tiny.target.forward_sequence(torch.tensor([short]))[0]
    assert window.shape == (2, w, tiny.target_config.d_model)
    torch.testing.assert_close(window[0, -min(w, len(long)) :], whole_long[-w:], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(window[1, -len(short) :], whole_short, rtol=1e-4, atol=1e-5)
    assert not window[1, : w - len(short)].any()  # before the prompt's start: zeros
    tokens = tiny._window_tokens([long, short])
    assert tokens[1].tolist() == [0] * (w - len(short)) + short


def test_context_and_fills(tiny):
    exact = tiny.generate([[1, 2, 3]], max_new_tokens=4, mode="ar", context=300)
    assert exact.fill == "prefill" and exact.prompt_tokens == 300
    approx = tiny.generate([[1, 2, 3], [4, 5]], max_new_tokens=6, mode="spec", budget=8, context=700, fill="approx")
    assert approx.fill == "approx" and approx.prompt_tokens == 1400
    assert [len(t) for t in approx.tokens] == [6, 6]
    trimmed = tiny.generate([list(range(50))], max_new_tokens=2, mode="ar", context=10)
    assert trimmed.prompt_tokens == 10
    with pytest.raises(UserError):
        tiny.generate([[1, 2, 3], [4, 5]], max_new_tokens=2, fill="approx")  # unequal prefixes


def test_bf16_runs_on_cpu():
    eng = load_engine("tiny-random", dtype="bf16")
    assert eng.dtype == torch.bfloat16
    for mode in ("ar", "spec"):
        r = eng.generate(PROMPTS[:2], max_new_tokens=8, mode=mode, budget=8)
        assert all(len(t) == 8 and all(0 <= x < 256 for x in t) for t in r.tokens)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "beam"},
        {"tree": "random"},
        {"mask": "dense"},
        {"budget": 0},
        {"max_new_tokens": 0},
        {"fill": "magic"},
        {"context": -1},
        {"temperature": -0.5},
        {"temperature": float("inf")},
        {"seed": "7"},
    ],
)
def test_bad_arguments_are_user_errors(tiny, kwargs):
    args = {"max_new_tokens": 4} | kwargs
    with pytest.raises(UserError):
        tiny.generate([[1, 2]], **args)


def test_bad_prompts_and_presets(tiny):
    with pytest.raises(UserError):
        tiny.generate([], max_new_tokens=2)
    with pytest.raises(UserError):
        tiny.generate([[1, 300]], max_new_tokens=2)
    with pytest.raises(UserError):
        load_engine("huge")
    with pytest.raises(UserError):
        load_engine("tiny-random", dtype="fp8")
    with pytest.raises(UserError):
        ModelConfig(n_heads=3, n_kv_heads=2)


def test_random_presets_are_seeded():
    a = load_engine("tiny-random", seed=5).generate([[1, 2, 3]], max_new_tokens=6, mode="ar")
    b = load_engine("tiny-random", seed=5).generate([[1, 2, 3]], max_new_tokens=6, mode="ar")
    c = load_engine("tiny-random", seed=6).generate([[1, 2, 3]], max_new_tokens=6, mode="ar")
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_shipped_weights_accept_several_tokens_losslessly(kind):
    """Trained weights accept more than one token per step on held-out text of either kind, so
    acceptance walks, bonus tokens and KV compaction of the accepted path are all exercised;
    output still equals greedy AR."""
    from perfkit.engine import data

    engine = load_engine("shipped")
    prompts = [p[: 40 + 23 * i] for i, p in enumerate(data.sample_prompts(2, 100, kind=kind))]  # different lengths
    ar = engine.generate(prompts, max_new_tokens=40, mode="ar")
    for budget in (8, 32):
        for tree in ("heap", "vectorized"):
            for mask in ("naive", "compact"):
                spec = engine.generate(prompts, max_new_tokens=40, mode="spec", budget=budget, tree=tree, mask=mask)
                assert spec.tokens == ar.tokens, (budget, tree, mask)
                assert spec.mean_accept_length > 1.3
                assert max(spec.accept_lengths) > 2


def test_shipped_weights_sample_losslessly():
    """At temperature 0.8 the trained drafter still gets tokens accepted, and spec equals AR."""
    from perfkit.engine import data

    engine = load_engine("shipped")
    prompts = [p[: 60 + 17 * i] for i, p in enumerate(data.sample_prompts(3, 120))]
    ar = engine.generate(prompts, max_new_tokens=32, mode="ar", temperature=0.8, seed=5)
    for tree in ("heap", "vectorized"):
        spec = engine.generate(prompts, max_new_tokens=32, mode="spec", budget=16, tree=tree, temperature=0.8, seed=5)
        assert spec.tokens == ar.tokens, tree
        assert spec.mean_accept_length > 1.3


def test_fast_requests_keep_stepping_within_the_cache():
    """A batch steps until its slowest request has max_new_tokens; a request that accepts whole
    blocks meanwhile commits up to block + 1 tokens a step, and the cache must hold them."""
    from perfkit.engine import data

    engine = load_engine("shipped")
    prompts = data.sample_prompts(8, 256)  # held-out text: some requests run far ahead of others
    ar = engine.generate(prompts, max_new_tokens=8, context=512, mode="ar")
    spec = engine.generate(prompts, max_new_tokens=8, context=512, mode="spec", budget=32)
    assert spec.tokens == ar.tokens
    assert spec.steps > 1
