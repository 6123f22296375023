"""Best-first draft tree (DDTree) from the drafter's per-position distributions.

    build_tree_heap(logprobs, budget) -> DraftTree        # reference: per-request heapq on the CPU
    build_tree_vectorized(logprobs, budget) -> DraftTree  # batched torch, no per-node Python loop

    logprobs: [B, K, R] float, the drafter's top-R log-probabilities at each of K depths, sorted
              non-increasing along R (as ``torch.topk(..., sorted=True)`` returns them), no NaN.
              Node = a path of ranks (r_1, ..., r_d); its token at depth i is the rank-r_i token of
              depth i; its score is the cumulative log-prob l_1[r_1] + ... + l_d[r_d].
    budget:   N, nodes per request (root excluded); needs N <= R + R^2 + ... + R^K.
    DraftTree fields, each [B, N], nodes in pop order (a parent always precedes its children):
        ranks   int64  rank of the node's token within its depth's top-R
        parents int64  index of the parent node, -1 for children of the root
        depths  int64  1..K
        scores  int64  cumulative log-prob in fixed point (units of 2**-20 nats)

Scores are fixed point: each log-prob is clamped at -4096 and rounded to a multiple of 2**-20 nats
(``fixed_point``), then summed exactly in integers. Both builders, on any device, therefore see the
same scores, whatever the summation order.

The heap pops the best node, adds it to the tree, and pushes its next sibling (next rank, same
depth) and its first child (rank 0, next depth), until N nodes are popped. Ties (equal scores) are
broken by the heap key (-score, depth, parent index, rank), a total order in which a parent precedes
its children and a sibling its next sibling, so the tree is exactly the first N nodes of that order.

The vectorized builder computes the same order depth by depth. At depth d the best nodes (by
-score, then parent position at depth d-1, then rank) are children of the best nodes at depth d-1,
and child (i, r) of the i-th parent can only be in the tree when (i+1)(r+2) + d - 2 <= N (every
(i', r') with i' <= i, r' <= r precedes it, with their i + 1 parents and d - 2 further ancestors),
so each depth looks at about N ln N candidates, not N * R; cutting candidates that cannot be in
the tree leaves the positions of those that can exact. Score and tie-break are packed into one unique int64 key, score * 2**20 - (i * R + r),
so ``topk`` selects and orders exactly, with no sort and no tie fix-up. A final topk over all
depths, slots ordered by (depth, position), gives the pop order (ties: shallower first, then
position within the depth, which is the heap's parent index and rank).
"""

from __future__ import annotations

import functools
import heapq
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
    if budget * r >= 1 << _INDEX_BITS or k * budget >= 1 << _INDEX_BITS:
        raise UserError(f"budget {budget} at depth {k}, top-{r} is too large for the tie-break bits of the tree keys")
    return b, k, r


FIXED_POINT_BITS = 20  # log-probs in units of 2**-20 nats
LOGPROB_FLOOR = -4096.0  # -inf and anything below is clamped here
_INDEX_BITS = 20  # candidate index packed under the score in a selection key


def fixed_point(logprobs: torch.Tensor) -> torch.Tensor:
    """int64 log-probs in units of 2**-20 nats; the one rounding both builders share."""
    scaled = logprobs.detach().to(torch.float64).clamp(min=LOGPROB_FLOOR) * float(1 << FIXED_POINT_BITS)
    return scaled.round().to(torch.int64)


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
                heapq.heappush(heap, (-(parent_score + rows[depth - 1][rank + 1]), depth, parent, rank + 1, parent_score))
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


# --- fast: depth by depth, batched ------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _plan(budget: int, depth: int, ranks: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]:
    """Per depth d >= 2: candidate (parent position, rank) lists, ordered by (position, rank), and
    how many nodes the depth keeps. Depends only on the shapes, so it is computed once.

    Only nodes that can be in the tree matter (their positions are exact whatever else is cut):
    a depth-d node has an ancestor at each of the d - 1 depths above, so a depth keeps at most
    budget - d + 1; and child (i, r) of the i-th parent comes with every (i', r') for i' <= i,
    r' <= r, their i + 1 parents and d - 2 more ancestors, so it needs (i+1)(r+2) + d - 2 <= budget.
    """
    plan = []
    kept = min(budget, ranks)  # depth 1 keeps ranks 0..kept-1
    for d in range(2, depth + 1):
        room = budget - d + 2
        pos, rank = [], []
        for i in range(kept):
            for r in range(min(ranks, room // (i + 1) - 1)):
                pos.append(i)
                rank.append(r)
        if not pos:
            break
        kept = min(budget - d + 1, len(pos))
        plan.append((tuple(pos), tuple(rank), kept))
    return tuple(plan)


_plan_tensors: dict = {}
_LOW = (1 << _INDEX_BITS) - 1  # the tie-break bits of a key


class _Plan:
    """``_plan`` as device tensors, built once per (budget, depth, ranks, device).

    levels: per depth >= 2, (pos [C], rank [C], kept); table_pos / table_rank: parent position and
    rank of every candidate of every depth, depth 1 first; widths: nodes kept per depth; sizes:
    candidates per depth; and per flat slot of the merged depths (depth 1 first): -slot (tie-break),
    its depth, its depth's offset into the tables, and per depth the slot offset of the depth above.
    """

    def __init__(self, budget: int, depth: int, ranks: int, device):
        plan = _plan(budget, depth, ranks)
        first = min(budget, ranks)
        t = functools.partial(torch.tensor, dtype=torch.int64, device=device)
        self.levels = [(t(p), t(r), kept) for p, r, kept in plan]
        self.table_pos = t([-1] * first + [x for p, _, _ in plan for x in p])
        self.table_rank = t(list(range(first)) + [x for _, r, _ in plan for x in r])
        self.widths = [first] + [kept for _, _, kept in plan]
        sizes = [first] + [len(p) for p, _, _ in plan]
        slot_depth, table_offset, starts = [], [], []
        slot, cand = 0, 0
        for d, (width, size) in enumerate(zip(self.widths, sizes)):
            starts.append(slot)
            slot_depth += [d] * width
            table_offset += [cand] * width
            slot += width
            cand += size
        self.slot_tie = -torch.arange(slot, device=device)
        self.slot_depth = t(slot_depth)
        self.table_offset = t(table_offset)
        self.above = t([0] + starts[:-1])  # slot offset of the depth above (where parents live)
        self.arange = torch.arange(max(self.widths + [ranks, budget]), device=device)
        self.parent_tie = self.arange * ranks  # i * R for parent position i


def _plan_on(budget: int, depth: int, ranks: int, device) -> _Plan:
    key = (budget, depth, ranks, str(device))
    got = _plan_tensors.get(key)
    if got is None:
        if len(_plan_tensors) > 64:
            _plan_tensors.clear()
        got = _plan_tensors[key] = _Plan(budget, depth, ranks, device)
    return got


def _top(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of distinct ``keys`` [B, C] per row, largest first: (values, column indices).

    An unsorted topk then a sort of the k winners: on CPUs several times cheaper than a sorted
    topk. Keys are distinct, so the result is fully determined.
    """
    values, index = torch.topk(keys, k, dim=1, sorted=False)
    values, order = torch.sort(values, dim=1, descending=True)
    return values, index.gather(1, order)


def build_tree_vectorized(logprobs: torch.Tensor, budget: int) -> DraftTree:
    """Same trees as :func:`build_tree_heap`, as K small batched top-k selections on the logprobs'
    device. No host synchronisation."""
    b, k, r = _check(logprobs, budget)
    dev = logprobs.device
    n = budget
    plan = _plan_on(n, k, r, dev)
    # Keys: score << 20 in the high bits, minus a tie-break in the low bits, so that the larger
    # key is the earlier node and all keys of a depth differ. Candidate (i, r) of parent position
    # i and rank r breaks ties by i * R + r, split into a parent part and a rank part so that a
    # key is one gather from each and an add.
    qs = fixed_point(logprobs) << _INDEX_BITS  # [B, K, R]
    rank_part = qs - plan.arange[:r]  # [B, K, R]: (l_d[r] << 20) - r
    score = qs[:, 0, : plan.widths[0]]  # [B, P] depth-1 scores (shifted), already in order
    level_scores = [score]
    level_picks = [plan.arange[: plan.widths[0]].expand(b, plan.widths[0])]
    for d, (pos, rank, kept) in enumerate(plan.levels, start=1):
        c = pos.shape[0]
        parent_part = score - plan.parent_tie[: score.shape[1]]  # [B, P]: (s_i << 20) - i * R
        key = parent_part.gather(1, pos.expand(b, c)) + rank_part[:, d].gather(1, rank.expand(b, c))  # [B, C]
        top, pick = _top(key, kept)  # [B, kept], best first
        score = (top + _LOW) & ~_LOW  # drop the tie-break bits: the shifted score
        level_scores.append(score)
        level_picks.append(pick)

    # Merge the depths: flat slots ordered by (depth, position), so equal scores go shallow first.
    all_scores = torch.cat(level_scores, 1)  # [B, W], shifted
    w = all_scores.shape[1]
    top, order = _top(all_scores + plan.slot_tie, n)  # [B, n] flat slot, in pop order
    depth0 = plan.slot_depth[order]  # [B, n] 0-based depth
    cand = (torch.cat(level_picks, 1) + plan.table_offset).gather(1, order)  # [B, n] row of the tables
    # Tree index of every flat slot, then look parents up in it.
    where = torch.empty((b, w), dtype=torch.int64, device=dev)
    where.scatter_(1, order, plan.arange[:n].expand(b, n))
    parent_slot = (plan.above[depth0] + plan.table_pos[cand]).clamp(min=0)
    parents = torch.where(depth0 > 0, where.gather(1, parent_slot), -1)
    return DraftTree(
        ranks=plan.table_rank[cand],
        parents=parents,
        depths=depth0 + 1,
        scores=(top + _LOW) >> _INDEX_BITS,
    )


BUILDERS = {"heap": build_tree_heap, "vectorized": build_tree_vectorized}
