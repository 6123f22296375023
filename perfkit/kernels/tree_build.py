"""Best-first draft tree (DDTree) from the drafter's per-position distributions.

    build_tree_heap(logprobs, budget) -> DraftTree        # reference: per-request heapq on the CPU
    build_tree_vectorized(logprobs, budget) -> DraftTree  # batched torch, no per-node Python loop

    logprobs: [B, K, R] float, the drafter's top-R log-probabilities at each of K depths, sorted
              non-increasing along R (as `torch.topk(..., sorted=True)` returns them), no NaN.
              Node = a path of ranks (r_1, ..., r_d); its token at depth i is the rank-r_i token of
              depth i; its score is the cumulative log-prob l_1[r_1] + ... + l_d[r_d].
    budget:   N, nodes per request (root excluded); needs N <= R + R^2 + ... + R^K.
    DraftTree fields, each [B, N], nodes in pop order (a parent always precedes its children):
        ranks   int64  rank of the node's token within its depth's top-R
        parents int64  index of the parent node, -1 for children of the root
        depths  int64  1..K
        scores  int64  cumulative log-prob in fixed point (units of 2**-20 nats)

Scores are fixed point: each log-prob is clamped at -1024 and rounded to a multiple of 2**-20 nats
(`fixed_point`), then summed exactly in integers. Both builders, on any device, therefore see the
same scores, whatever the summation order.

The heap pops the best node, adds it to the tree, and pushes its next sibling (next rank, same
depth) and its first child (rank 0, next depth), until N nodes are popped. Ties (equal scores) are
broken by the heap key (-score, depth, parent index, rank), a total order in which a parent precedes
its children and a sibling its next sibling, so the tree is exactly the first N nodes of that order.

The vectorized builder computes the same order with a handful of batched selections:

- Keys. Within a depth the heap's order is (-score, position of the parent in its depth, rank), so
  child r of the parent at position i of depth d - 1 gets the int64 key
  `(score << 24) - ((d << 18) + (i << b) + r)` with 2**b >= R: larger is earlier, no two nodes
  share a key, and the key alone gives back score, depth, parent position and rank (bit
  operations). The tree is the N largest keys, in descending order.
- Candidates. A node can only be in the tree if the tree has room for what must precede it: child
  (i, r) comes after every (i', r') with i' <= i, r' <= r, their i + 1 parents and d - 2 more
  ancestors, so it needs (i+1)(r+2) + d - 2 <= N (about N ln N candidates per depth, not N * R).
- Lists. Depth d + 1 only has parents among the first L_d = (N - d + 1) // 2 nodes of depth d: the
  node at position j has a child only if the j + 1 nodes up to it each have one, and with their
  d - 1 ancestors that is 2 (j + 1) + d - 1 nodes. Each depth's list (those L_d in order, and the
  best node left out) is one sorted `topk` over its candidates with (i+1)(r+1) <= L_d + 1, the
  only ones that can be that far up; depth 1 is in order already, the last depth needs no list.
- Final selection. Two depths cannot both hold more tree nodes than their lists (that would take
  more than N nodes), and if one does, it is the depth whose best left-out node is best. So the
  tree is the N best of every list, every candidate of that one depth and every candidate of the
  last depth: 625 keys at N = 64, K = 8, R = 64 instead of all 1,477 candidates. One sorted
  `topk` of those is the pop order.

CPU selections are branchy (about 10 ns per element on unseen data), so the design minimises the
elements that go through them, not the number of tensor operations; on the CPU the scratch buffers
are kept per thread, because fresh ones of this size page-fault on every call. Nothing reads a value
back to the host, so on CUDA the build never synchronises.
"""

from __future__ import annotations

import functools
import heapq
import threading
from dataclasses import dataclass

import torch

from perfkit.errors import UserError

__all__ = ["DraftTree", "build_tree_heap", "build_tree_vectorized", "node_tokens", "BUILDERS"]


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, N nodes per request in pop order; all fields [B, N]."""

    ranks: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor

    @property
    def budget(self) -> int:
        return self.ranks.shape[1]


def _check(logprobs: torch.Tensor, budget: int) -> tuple[int, int, int]:
    if logprobs.dim() != 3:
        raise UserError(f"logprobs must be [batch, depth, rank], got shape {tuple(logprobs.shape)}")
    b, k, r = logprobs.shape
    if budget < 1:
        raise UserError(f"tree budget must be >= 1, got {budget}")
    reachable, layer = 0, 1
    for _ in range(k):
        layer *= r
        reachable += layer
        if reachable >= budget:
            break
    if reachable < budget:
        raise UserError(f"budget {budget} exceeds the {reachable} nodes a depth-{k}, top-{r} tree can hold")
    if (budget // 2 + 1) << _rank_bits(r) >= 1 << _DEPTH_SHIFT or k >= 1 << (_TIE_BITS - _DEPTH_SHIFT):
        raise UserError(f"budget {budget} at depth {k}, top-{r} is too large for the tie-break bits of the tree keys")
    return b, k, r


FIXED_POINT_BITS = 20  # log-probs in units of 2**-20 nats
LOGPROB_FLOOR = -1024.0  # -inf and anything below is clamped here
_TIE_BITS = 24  # a selection key is score << 24 minus a tie-break (depth << 18) + (i << b) + r
_DEPTH_SHIFT = 18


def _rank_bits(ranks: int) -> int:
    """b with 2**b >= R: a parent position i is shifted by b in the tie-break, so both decode with bit operations."""
    return max(1, (ranks - 1).bit_length())


def fixed_point(logprobs: torch.Tensor, *, scratch: tuple | None = None) -> torch.Tensor:
    """int64 log-probs in units of 2**-20 nats; the one rounding both builders share.

    Scaling by a power of two is exact in any float format, so rounding float32 (or float64)
    inputs gives the same integers on every device. `scratch`: a (float32, int64) pair of
    buffers shaped like `logprobs` to compute into instead of allocating.
    """
    values = logprobs.detach().float()
    if scratch is None:
        return values.clamp(min=LOGPROB_FLOOR).mul_(float(1 << FIXED_POINT_BITS)).round_().long()
    work, out = scratch
    torch.clamp(values, min=LOGPROB_FLOOR, out=work)
    return out.copy_(work.mul_(float(1 << FIXED_POINT_BITS)).round_())


def node_tokens(tree: DraftTree, top_tokens: torch.Tensor) -> torch.Tensor:
    """Token ids [B, N] of the tree's nodes, given the top-R token ids [B, K, R] behind logprobs."""
    b, k, r = top_tokens.shape
    flat = (tree.depths - 1) * r + tree.ranks  # [B, N] index into [B, K * R]
    return top_tokens.reshape(b, k * r).gather(1, flat)


# --- reference: heapq per request -----------------------------------------------------------------


def build_tree_heap(logprobs: torch.Tensor, budget: int) -> DraftTree:
    """Per-request Python heap on the CPU, as the real systems do (includes the copy to the host)."""
    b, k, r = _check(logprobs, budget)
    rows_all = fixed_point(logprobs).cpu().tolist()  # [B][K][R] Python ints
    ranks, parents, depths, scores = [], [], [], []
    for rows in rows_all:
        # entry: (-score, depth, parent index, rank, parent score); the first four are unique.
        heap = [(-rows[0][0], 1, -1, 0, 0)]
        t_rank, t_parent, t_depth, t_score = [], [], [], []
        while len(t_rank) < budget:
            neg, depth, parent, rank, parent_score = heapq.heappop(heap)
            index = len(t_rank)
            score = -neg
            t_rank.append(rank)
            t_parent.append(parent)
            t_depth.append(depth)
            t_score.append(score)
            if rank + 1 < r:
                heapq.heappush(
                    heap, (-(parent_score + rows[depth - 1][rank + 1]), depth, parent, rank + 1, parent_score)
                )
            if depth < k:
                heapq.heappush(heap, (-(score + rows[depth][0]), depth + 1, index, 0, score))
        ranks.append(t_rank)
        parents.append(t_parent)
        depths.append(t_depth)
        scores.append(t_score)
    dev = logprobs.device
    return DraftTree(
        ranks=torch.tensor(ranks, dtype=torch.int64, device=dev),
        parents=torch.tensor(parents, dtype=torch.int64, device=dev),
        depths=torch.tensor(depths, dtype=torch.int64, device=dev),
        scores=torch.tensor(scores, dtype=torch.int64, device=dev),
    )


# --- fast: lists per depth, one final selection ----------------------------------------------------


@functools.lru_cache(maxsize=64)
def _levels(budget: int, depth: int, ranks: int) -> tuple:
    """Per depth (plain Python, from the shapes only): its candidates (parent position i, rank r),
    ordered so that those that can be among its first `listed + 1` nodes come first; how many
    those are; `listed` = L_d, 0 for the last depth."""
    out, parents = [], 1
    for d in range(1, depth + 1):
        room = budget - d + 2
        cands = [(i, r) for i in range(parents) for r in range(min(ranks, room // (i + 1) - 1))]
        listed = min(len(cands), (budget - d + 1) // 2) if d < depth else 0
        near = [c for c in cands if (c[0] + 1) * (c[1] + 1) <= listed + 1]
        far = [c for c in cands if (c[0] + 1) * (c[1] + 1) > listed + 1]
        out.append((tuple(near + far), len(near), listed))
        parents = listed
        if not parents:
            break
    return tuple(out)


class _Plan:
    """`_levels` as device tensors, built once per (budget, depth, ranks, device).

    The pool, the keys that the final selection looks at, has one section per listed depth (its
    list and one slot for its best node left out), then the spill (every candidate of one depth,
    padded to the widest), then the last depth's candidates. `shifted` holds, per list entry,
    its (score - 1) << 24 minus its tie-break as a parent, i << b; column 0 is 0 for depth 1.
    A candidate's key is its rank term (`terms`) plus its parent's `shifted` entry.
    """

    def __init__(self, budget: int, depth: int, ranks: int, device):
        t = functools.partial(torch.tensor, dtype=torch.int64, device=device)
        levels = _levels(budget, depth, ranks)
        # Rank term of depth d (0-based), rank r: l << 24 minus (d + 1) << 18 and r; below depth 1
        # it adds back the 1 << 24 lost by clearing the parent key's tie-break (see `shifted`).
        self.rank_tie = t(
            [
                [((d + 1) << _DEPTH_SHIFT) + r - ((1 << _TIE_BITS) if d else 0) for r in range(ranks)]
                for d in range(depth)
            ]
        ).view(-1)
        starts, depth_of_column, near_ranks = [0], [], []
        # per listed depth: (parent columns in shifted or None, span of its near keys, L_d, topk size,
        # first column of its section)
        self.lists = []
        self.empty_slots = []  # the extra slot of a depth that has no node left out
        for d, (cands, near, listed) in enumerate(levels):
            ref = t([1 + starts[d - 1] + i for i, _ in cands]) if d else None
            if not listed:
                self.last = (ref, t([d * ranks + r for _, r in cands]))
                break
            take = min(listed + 1, len(cands))
            span = (len(near_ranks), len(near_ranks) + near)
            near_ranks += [d * ranks + r for _, r in cands[:near]] if d else []
            self.lists.append((None if ref is None else ref[:near], span, listed, take, starts[-1]))
            if take == listed:
                self.empty_slots.append(starts[-1] + listed)
            starts.append(starts[-1] + listed + 1)
            depth_of_column += [d] * (listed + 1)
        self.near_ranks = t(near_ranks)  # rank columns of every listed depth's near candidates but depth 1's
        self.section = starts[-1]  # columns of the list sections
        # depth (1-based) -> first column of the list one depth up (depth 1: any valid column)
        self.parent_list_start = t([0, 0] + starts[: len(levels) - 1])
        self.depth_of_column = t(depth_of_column)
        self.leftover_column = t([s - 1 for s in starts[1:]])
        self.rank_bits = _rank_bits(ranks)
        self.parent_tie = t([i << self.rank_bits for a, z in zip(starts, starts[1:]) for i in range(z - a)])
        listed_levels = levels[: len(self.lists)]
        self.widest = w = max((len(c) for c, _, _ in listed_levels), default=0)
        pad = [[0] * (w - len(c)) for c, _, _ in listed_levels]
        self.spill_ref = t(
            [[1 + starts[d - 1] + i if d else 0 for i, _ in c] + pad[d] for d, (c, _, _) in enumerate(listed_levels)]
        )
        self.spill_rank = t([[d * ranks + r for _, r in c] + pad[d] for d, (c, _, _) in enumerate(listed_levels)])
        self.spill_pad = torch.tensor(
            [[False] * len(c) + [True] * len(pad[d]) for d, (c, _, _) in enumerate(listed_levels)], device=device
        )
        self.width = self.section + w + self.last[1].shape[0]
        self.nodes = torch.arange(budget, device=device)


_plans: dict = {}


def _plan_on(budget: int, depth: int, ranks: int, device) -> _Plan:
    key = (budget, depth, ranks, str(device))
    got = _plans.get(key)
    if got is None:
        if len(_plans) > 64:
            _plans.clear()
        got = _plans[key] = _Plan(budget, depth, ranks, device)
    return got


_per_thread = threading.local()
_MIN = torch.iinfo(torch.int64).min  # below every key: an empty slot
_TIE_MASK = (1 << _DEPTH_SHIFT) - 1


class _Workspace:
    """The buffers of one build and the views of them each step works on.

    pool: the keys of the final selection; tree_index: pool column -> tree index; candidate: list
    entry -> its candidate index in its depth; shifted: per list entry, its parent part (column 0
    is 0 for depth 1); near: every listed depth's near candidates' rank terms (its keys once the
    parent parts are added); fixed: scratch for the fixed-point log-probs (CPU only).
    """

    def __init__(self, plan: _Plan, b: int, k: int, r: int, device):
        new = functools.partial(torch.empty, dtype=torch.int64, device=device)
        self.pool, self.tree_index = new(b, plan.width), new(b, plan.width)
        self.candidate, self.shifted = new(b, plan.section), new(b, 1 + plan.section)
        self.near = new(b, plan.near_ranks.numel())
        self.fixed = (torch.empty(b, k * r), new(b, k * r)) if device.type == "cpu" else None
        self.shifted[:, 0] = 0
        self.near_index = plan.near_ranks.expand(b, -1)
        self.levels = []  # per listed depth: parent columns, near keys, list values and candidates, parent part
        for ref, (lo, hi), listed, take, a in plan.lists:
            if ref is None:  # depth 1: its list is its first ranks, in order
                self.candidate[:, :take] = torch.arange(take, device=device)
            self.levels.append(
                (
                    None if ref is None else ref.expand(b, -1),
                    self.near[:, lo:hi],
                    self.pool[:, a : a + take],
                    self.candidate[:, a : a + take],
                    self.pool[:, a : a + listed],
                    self.shifted[:, 1 + a : 1 + a + listed],
                    plan.parent_tie[a : a + listed],
                )
            )
        ref, rank_index = plan.last
        self.last = (
            None if ref is None else ref.expand(b, -1),
            rank_index.expand(b, -1),
            self.pool[:, plan.width - rank_index.shape[0] :],
        )
        self.lists = self.pool[:, : plan.section]
        self.spill = self.pool[:, plan.section : plan.section + plan.widest]
        self.nodes = plan.nodes.expand(b, -1)


def _workspace(plan: _Plan, b: int, k: int, r: int, device) -> _Workspace:
    """Kept per thread (for one plan and batch size) on the CPU, where fresh buffers of this size
    page-fault on every call; new on other devices."""
    if device.type != "cpu":
        return _Workspace(plan, b, k, r, device)
    kept = getattr(_per_thread, "workspace", None)
    if kept is None or kept[0] is not plan or kept[1] != b:  # holding the plan keeps its identity
        kept = _per_thread.workspace = (plan, b, _Workspace(plan, b, k, r, device))
    return kept[2]


def build_tree_vectorized(logprobs: torch.Tensor, budget: int) -> DraftTree:
    """Same trees as `build_tree_heap`: a sorted top-k per depth for its list, then one over
    the lists, one spilled depth and the last depth, on the logprobs' device. No host
    synchronisation."""
    b, k, r = _check(logprobs, budget)
    dev = logprobs.device
    plan = _plan_on(budget, k, r, dev)
    ws = _workspace(plan, b, k, r, dev)
    terms = fixed_point(logprobs.reshape(b, k * r), scratch=ws.fixed)
    terms.bitwise_left_shift_(_TIE_BITS).sub_(plan.rank_tie)  # a candidate's key less its parent's part
    torch.gather(terms, 1, ws.near_index, out=ws.near)
    for ref, keys, values, candidates, entries, part, parent_tie in ws.levels:
        if ref is None:  # depth 1
            values.copy_(terms[:, : values.shape[1]])
        else:
            keys.add_(ws.shifted.gather(1, ref))
            torch.topk(keys, values.shape[1], dim=1, out=(values, candidates))
        # a key is (score << 24) - tie with 0 < tie < 2**24: clearing the tie leaves (score - 1) << 24
        torch.bitwise_and(entries, -(1 << _TIE_BITS), out=part).sub_(parent_tie)
    pool = ws.pool
    for column in plan.empty_slots:
        pool[:, column] = _MIN
    ref, rank_index, last = ws.last
    torch.gather(terms, 1, rank_index, out=last)
    if ref is not None:
        last.add_(ws.shifted.gather(1, ref))
    if plan.section:
        # The one depth that may hold more tree nodes than its list: its best left-out node is best.
        over = pool.index_select(1, plan.leftover_column).argmax(1)  # [B]
        torch.add(
            terms.gather(1, plan.spill_rank.index_select(0, over)),
            ws.shifted.gather(1, plan.spill_ref.index_select(0, over)),
            out=ws.spill,
        )
        ws.spill.masked_fill_(plan.spill_pad.index_select(0, over), _MIN)
        spilled = plan.depth_of_column == over[:, None]  # [B, section]
        ws.lists.masked_fill_(spilled, _MIN)  # the spill has them
    top, column = torch.topk(pool, budget, dim=1, sorted=False)  # the tree's keys
    top, order = torch.sort(top, dim=1, descending=True)  # in pop order (cheaper than a sorted topk here)
    column = column.gather(1, order)
    tie = top.neg().bitwise_and_((1 << _TIE_BITS) - 1)  # (depth << 18) + (i << b) + rank
    score = (top >> _TIE_BITS).add_(1)
    depths = tie >> _DEPTH_SHIFT
    spot = tie.bitwise_and_(_TIE_MASK)
    position = spot >> plan.rank_bits  # of the parent, in the depth above
    if plan.section:
        # The parent is entry `position` of the list one depth up, or that entry's spill column.
        entry = plan.parent_list_start.take(depths).add_(position)
        parent_column = torch.where(spilled.gather(1, entry), ws.candidate.gather(1, entry).add_(plan.section), entry)
        ws.tree_index.scatter_(1, column, ws.nodes)
        parents = ws.tree_index.gather(1, parent_column).masked_fill_(depths == 1, -1)
    else:
        parents = torch.full_like(top, -1)
    return DraftTree(ranks=spot.bitwise_and_((1 << plan.rank_bits) - 1), parents=parents, depths=depths, scores=score)


BUILDERS = {"heap": build_tree_heap, "vectorized": build_tree_vectorized}
