"""Kernels: the vectorized tree build gives the heap's trees (ties included), and both verify-mask
layouts give the same attention."""

import itertools

import pytest
import torch

from perfkit.errors import UserError
from perfkit.kernels.tree_build import build_tree_heap, build_tree_vectorized, fixed_point, node_tokens
from perfkit.kernels.verify_attention import attention_bias, dense_mask, mask_bias, verify_attention
from perfkit.kernels.verify_mask import ancestors, causal_mask, prepare_for_verify_compact, prepare_for_verify_naive

pytestmark = pytest.mark.usefixtures("one_thread")


FIELDS = ("ranks", "parents", "depths", "scores")


def _logprobs(batch, depth, ranks, *, seed, quant=None, vocab=256):
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.randn(batch, depth, vocab, generator=gen) * 2).log_softmax(-1)
    if quant is not None:  # coarse values: many exact ties, within and across depths
        lp = (lp * quant).round() / quant
    return lp.topk(ranks, dim=-1).values


def _assert_same(a, b):
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize(
    "batch,depth,ranks,budget",
    [(1, 8, 16, 16), (4, 8, 64, 64), (3, 4, 16, 200), (2, 8, 256, 256), (2, 3, 4, 50), (5, 1, 64, 10), (2, 6, 3, 1)],
)
@pytest.mark.parametrize("quant", [None, 2.0, 0.25])
def test_vectorized_tree_equals_heap(batch, depth, ranks, budget, quant):
    lp = _logprobs(batch, depth, ranks, seed=batch * 31 + budget, quant=quant)
    _assert_same(build_tree_heap(lp, budget), build_tree_vectorized(lp, budget))


def test_all_equal_logprobs_and_neg_inf_ties():
    flat = torch.full((2, 4, 8), -2.0)  # every node of a depth ties with its siblings
    _assert_same(build_tree_heap(flat, 40), build_tree_vectorized(flat, 40))
    lp = _logprobs(2, 4, 8, seed=3)
    lp[:, :, 5:] = float("-inf")  # clamped to the same floor: ties at the bottom
    _assert_same(build_tree_heap(lp, 60), build_tree_vectorized(lp, 60))


def _enumerate(lp_row, depth, ranks):
    """Every node (path of ranks) of one request with its fixed-point score."""
    q = fixed_point(lp_row).tolist()
    nodes = {}
    for d in range(1, depth + 1):
        for path in itertools.product(range(ranks), repeat=d):
            nodes[path] = sum(q[i][r] for i, r in enumerate(path))
    return nodes


def test_tree_is_the_best_prefix_closed_set():
    depth, ranks, budget = 3, 3, 12
    lp = _logprobs(3, depth, ranks, seed=11, quant=1.0)
    tree = build_tree_vectorized(lp, budget)
    for b in range(3):
        nodes = _enumerate(lp[b], depth, ranks)
        paths = []
        for j in range(budget):
            parent = tree.parents[b, j].item()
            assert parent < j  # parents precede children
            prefix = () if parent < 0 else paths[parent]
            paths.append(prefix + (tree.ranks[b, j].item(),))
            assert tree.depths[b, j].item() == len(paths[-1])
            assert tree.scores[b, j].item() == nodes[paths[-1]]
        chosen = set(paths)
        assert len(chosen) == budget
        assert all(p[:-1] in chosen or len(p) == 1 for p in chosen)  # prefix-closed
        assert all(p[:-1] + (p[-1] - 1,) in chosen for p in chosen if p[-1] > 0)  # previous sibling in
        worst = min(nodes[p] for p in chosen)
        assert all(nodes[p] <= worst for p in nodes if p not in chosen)  # nothing better was left out
        scores = tree.scores[b].tolist()
        assert scores == sorted(scores, reverse=True)  # pop order is best first


def test_node_tokens_and_budget_check():
    lp = _logprobs(2, 3, 4, seed=5)
    tokens = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    tree = build_tree_heap(lp, 6)
    got = node_tokens(tree, tokens)
    for b in range(2):
        for j in range(6):
            assert got[b, j] == tokens[b, tree.depths[b, j] - 1, tree.ranks[b, j]]
    with pytest.raises(UserError):
        build_tree_vectorized(lp, 4 + 16 + 64 + 1)  # more nodes than a depth-3, top-4 tree has
    with pytest.raises(UserError):
        build_tree_heap(lp[0], 3)


def test_ancestors_match_a_walk_up_the_parents():
    tree = build_tree_vectorized(_logprobs(3, 5, 6, seed=9), 20)
    block = ancestors(tree.parents, 5)
    for b in range(3):
        for i in range(21):
            seen = {i}
            node = i
            while node > 0:
                node = tree.parents[b, node - 1].item() + 1
                seen.add(node)
            assert set(torch.nonzero(block[b, i]).flatten().tolist()) == seen


def test_naive_mask_layout_and_size():
    lens = torch.tensor([5, 0, 9])
    parents = torch.tensor([[-1, 0, 1]] * 3)  # a chain of three nodes
    m = prepare_for_verify_naive(lens, parents, 3)
    q = 4
    assert m.data.numel() == sum(q * (L + q) for L in (5, 0, 9))
    first = m.data[: q * (5 + q)].view(q, 5 + q)
    assert first[:, :5].all()  # the whole prefix is visible
    assert torch.equal(first[:, 5:], torch.ones(q, q, dtype=torch.bool).tril())  # chain = causal


@pytest.mark.parametrize("batch", [1, 3])
def test_naive_and_compact_give_identical_attention(batch):
    gen = torch.Generator().manual_seed(batch)
    nodes, heads, groups, dim = 12, 4, 2, 8
    lens = torch.tensor([7, 20, 3][:batch])
    tree = build_tree_vectorized(_logprobs(batch, 4, 8, seed=batch), nodes)
    q_len = nodes + 1
    kv_len = int(lens.max()) + q_len + 5  # slots past every block must stay invisible
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, groups, kv_len, dim, generator=gen)
    v = torch.randn(batch, groups, kv_len, dim, generator=gen)
    naive = prepare_for_verify_naive(lens, tree.parents, 4)
    compact = prepare_for_verify_compact(lens, tree.parents, 4)
    dn, dc = dense_mask(naive, kv_len), dense_mask(compact, kv_len)
    assert torch.equal(dn, dc)
    out_n = verify_attention(q, k, v, naive)
    out_c = verify_attention(q, k, v, compact)
    assert torch.equal(out_n, out_c)
    # Against attention written out by hand from the tree: prefix, then ancestors only.
    for b in range(batch):
        L = lens[b].item()
        for i in range(q_len):
            allowed = [s for s in range(kv_len) if s < L or (0 <= s - L < q_len and compact.block[b, i, s - L])]
            kk = k[b].repeat_interleave(heads // groups, 0)[:, allowed]
            vv = v[b].repeat_interleave(heads // groups, 0)[:, allowed]
            w = (q[b, :, i : i + 1] @ kk.transpose(1, 2) / dim**0.5).softmax(-1)
            torch.testing.assert_close(out_c[b, :, i], (w @ vv)[:, 0], rtol=1e-5, atol=1e-5)


def test_builders_take_parents_or_the_block():
    tree = build_tree_vectorized(_logprobs(2, 4, 8, seed=8), 9)
    lens = torch.tensor([4, 11])
    block = ancestors(tree.parents, 4)
    for build in (prepare_for_verify_naive, prepare_for_verify_compact):
        a, b = build(lens, tree.parents, 4), build(lens, block, 4)
        assert torch.equal(a.data, b.data) and torch.equal(a.block, block)
    with pytest.raises(ValueError):
        prepare_for_verify_compact(lens, block[:, :, :5], 4)


def test_compact_mask_does_no_context_work():
    parents = torch.tensor([[-1, 0, 0, 1]])
    small = prepare_for_verify_compact(torch.tensor([10]), parents, 4)
    huge = prepare_for_verify_compact(torch.tensor([10_000_000]), parents, 4)
    assert small.data.shape == huge.data.shape == (1, 5, 5)
    assert torch.equal(small.data, huge.data)


def test_causal_mask_and_single_query_shortcut():
    m = causal_mask(torch.tensor([3, 5]), 2)
    d = dense_mask(m, 7)[:, 0]
    assert d[0, 0].tolist() == [True, True, True, True, False, False, False]
    assert d[1, 1].tolist() == [True] * 7
    assert dense_mask(causal_mask(torch.tensor([4]), 1), 5) is None  # one request, one query: no mask


def test_uniform_start_bias_shortcut_matches_the_general_path():
    tree = build_tree_vectorized(_logprobs(2, 4, 8, seed=4), 10)
    lens = torch.tensor([30, 30])
    mask = prepare_for_verify_compact(lens, tree.parents, 4)
    kv_len = 30 + 11
    fast = mask_bias(mask, kv_len, torch.float32, uniform_start=30)
    slow = attention_bias(dense_mask(mask, kv_len), torch.float32)
    assert torch.equal(fast, slow)
    assert (fast[:, :, :, :30] == 0).all() and torch.isinf(fast).any()
    naive = prepare_for_verify_naive(lens, tree.parents, 4)
    assert torch.equal(mask_bias(naive, kv_len, torch.float32, uniform_start=30), slow)  # naive: general path


def test_vectorized_tree_equals_heap_on_random_shapes():
    rng = torch.Generator().manual_seed(123)
    for _ in range(60):
        b, k, v = (int(torch.randint(lo, hi, (1,), generator=rng)) for lo, hi in ((1, 4), (1, 9), (2, 40)))
        r = int(torch.randint(1, v + 1, (1,), generator=rng))
        lp = (torch.randn(b, k, v, generator=rng) * 3).log_softmax(-1)
        if torch.rand(1, generator=rng) < 0.5:
            lp = (lp * 2).round() / 2  # ties
        lp = lp.topk(r, dim=-1).values
        cap = sum(r**d for d in range(1, k + 1))
        n = int(torch.randint(1, min(cap, 120) + 1, (1,), generator=rng))
        _assert_same(build_tree_heap(lp, n), build_tree_vectorized(lp, n))


def _depth_counts(tree, depth):
    return [[int((tree.depths[b] == d).sum()) for d in range(1, depth + 1)] for b in range(tree.depths.shape[0])]


@pytest.mark.parametrize("wide", [1, 2, 4])
def test_vectorized_tree_when_one_depth_holds_more_than_its_list(wide):
    """The final selection keeps every candidate of the one depth that holds more tree nodes than
    its list of (N - d + 1) // 2; make depth `wide` that depth (flat there, peaked elsewhere)."""
    batch, depth, ranks, budget = 3, 5, 32, 40
    lp = _logprobs(batch, depth, ranks, seed=wide, quant=None)
    lp[:, : wide - 1] = torch.linspace(0, -30, ranks)  # one clear path down to depth `wide`
    lp[:, wide - 1] = torch.linspace(-0.01, -0.5, ranks)  # nearly flat: many siblings fit
    lp[:, wide:] = torch.linspace(-3, -40, ranks)  # deeper nodes cost more than a sibling
    heap, vec = build_tree_heap(lp, budget), build_tree_vectorized(lp, budget)
    _assert_same(heap, vec)
    assert all(counts[wide - 1] > (budget - wide + 1) // 2 for counts in _depth_counts(heap, depth))


def test_vectorized_tree_with_ties_across_the_list_boundary():
    """Quantised log-probs put equal scores right where a depth's list ends."""
    for seed in range(6):
        lp = _logprobs(4, 6, 24, seed=seed, quant=1.0)
        lp[:, 0] = (torch.arange(24) // 6).float().neg()  # groups of six equal depth-1 scores
        for budget in (12, 13, 37, 64):
            _assert_same(build_tree_heap(lp, budget), build_tree_vectorized(lp, budget))


def test_vectorized_tree_reused_scratch_does_not_leak_into_results():
    a, b = _logprobs(8, 8, 64, seed=1), _logprobs(8, 8, 64, seed=2)
    first = build_tree_vectorized(a, 64)
    kept = {f: getattr(first, f).clone() for f in FIELDS}
    second = build_tree_vectorized(b, 64)  # same shapes: same per-thread scratch
    assert all(torch.equal(getattr(first, f), kept[f]) for f in FIELDS)
    _assert_same(second, build_tree_heap(b, 64))


def test_vectorized_tree_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor

    inputs = [_logprobs(16, 8, 64, seed=s) for s in range(8)]
    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(lambda lp: build_tree_vectorized(lp, 64), inputs * 3))
    for lp, tree in zip(inputs * 3, trees):
        _assert_same(tree, build_tree_heap(lp, 64))


def test_vectorized_tree_equals_heap_on_large_random_budgets():
    rng = torch.Generator().manual_seed(7)
    for _ in range(40):
        b, k, v = (int(torch.randint(lo, hi, (1,), generator=rng)) for lo, hi in ((1, 5), (2, 9), (16, 300)))
        r = int(torch.randint(8, v + 1, (1,), generator=rng))
        lp = (torch.randn(b, k, v, generator=rng) * float(torch.rand(1, generator=rng) * 4 + 0.5)).log_softmax(-1)
        if torch.rand(1, generator=rng) < 0.5:
            lp = (lp * 4).round() / 4  # ties
        lp = lp.topk(r, dim=-1).values
        n = int(torch.randint(16, min(sum(r**d for d in range(1, k + 1)), 400) + 1, (1,), generator=rng))
        _assert_same(build_tree_heap(lp, n), build_tree_vectorized(lp, n))


def test_vectorized_tree_after_many_plans():
    """More shapes than the plan cache holds: a new plan never inherits another's scratch."""
    lp = _logprobs(2, 4, 40, seed=3)
    for budget in range(1, 80):
        _assert_same(build_tree_heap(lp, budget), build_tree_vectorized(lp, budget))
    for budget in (5, 70, 5):
        _assert_same(build_tree_heap(lp[:1], budget), build_tree_vectorized(lp[:1], budget))
