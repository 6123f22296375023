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

Scores are fixed point: each log-prob is clamped at -1024 and rounded to a multiple of 2**-20 nats
(``fixed_point``), then summed exactly in integers. Both builders, on any device, therefore see the
same scores, whatever the summation order.

The heap pops the best node, adds it to the tree, and pushes its next sibling (next rank, same
depth) and its first child (rank 0, next depth), until N nodes are popped. Ties (equal scores) are
broken by the heap key (-score, depth, parent index, rank), a total order in which a parent precedes
its children and a sibling its next sibling, so the tree is exactly the first N nodes of that order.

The vectorized builder computes the same order depth by depth, with no per-node loop. Within a
depth the order is (-score, parent position at the depth above, rank), so a node's key
score * 2**24 - ((d << 18) + i * R + r) for child (i, r) of the i-th parent is unique and orders
like the heap: one ``topk`` selects exactly, no stable sort or tie fix-up needed. Only nodes that
can be in the tree are considered, which keeps the positions of those that are exact: a depth
keeps at most N - d + 1 nodes (each has d - 1 ancestors), child (i, r) needs
(i+1)(r+2) + d - 2 <= N (all (i', r') with i' <= i, r' <= r precede it, with their i + 1 parents
and d - 2 more ancestors), so a depth looks at about N ln N candidates, not N * R, and only its
first (N - d + 1) // 2 nodes can be parents, so only those are put in order (a topk per depth).
A final topk over every depth's candidates (keys carry the depth: equal scores go shallower
first) is the pop order; a depth with many more candidates than the N - d + 1 it can hold is cut
to those first. CPU sorts and selections are branchy, so the design minimises how many elements
go through them rather than the number of tensor operations.
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
    if (budget // 2 + 1) * r >= 1 << _DEPTH_SHIFT or k >= 1 << (_TIE_BITS - _DEPTH_SHIFT):
        raise UserError(f"budget {budget} at depth {k}, top-{r} is too large for the tie-break bits of the tree keys")
    return b, k, r


FIXED_POINT_BITS = 20  # log-probs in units of 2**-20 nats
LOGPROB_FLOOR = -1024.0  # -inf and anything below is clamped here
_TIE_BITS = 24  # a selection key is score << 24 minus a tie-break (depth << 18) + i * R + r
_DEPTH_SHIFT = 18


def fixed_point(logprobs: torch.Tensor) -> torch.Tensor:
    """int64 log-probs in units of 2**-20 nats; the one rounding both builders share.

    Scaling by a power of two is exact in any float format, so rounding float32 (or float64)
    inputs gives the same integers on every device.
    """
    scaled = logprobs.detach().float().clamp(min=LOGPROB_FLOOR)
    return scaled.mul_(float(1 << FIXED_POINT_BITS)).round_().long()


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
def _plan(budget: int, depth: int, ranks: int):
    """Per depth d >= 2: candidate (parent position, rank) lists, ordered by (position, rank); how
    many nodes the depth keeps; how many of those, in order, are parents for depth d + 1. Depends
    only on the shapes, so it is computed once.

    Only nodes that can be in the tree matter (their positions stay exact whatever else is cut):
    a depth-d node has an ancestor at each of the d - 1 depths above, so a depth keeps at most
    budget - d + 1; child (i, r) of the i-th parent comes with every (i', r') for i' <= i, r' <= r,
    their i + 1 parents and d - 2 more ancestors, so it needs (i+1)(r+2) + d - 2 <= budget, which
    also means only the first (budget - d + 2) // 2 nodes of depth d - 1 can be parents.
    """
    first = min(budget, ranks)  # depth 1: ranks 0..first-1, already in order
    parents = min(first, budget // 2)
    plan = []
    for d in range(2, depth + 1):
        room = budget - d + 2
        pos, rank = [], []
        for i in range(parents):
            for r in range(min(ranks, room // (i + 1) - 1)):
                pos.append(i)
                rank.append(r)
        if not pos:
            break
        kept = min(budget - d + 1, len(pos))
        plan.append((tuple(pos), tuple(rank), kept, min(kept, (budget - d + 1) // 2)))
        parents = plan[-1][3]
        if not parents:
            break
    return first, min(first, budget // 2), tuple(plan)


_plan_tensors: dict = {}
_LOW = (1 << _TIE_BITS) - 1  # the tie-break bits of a key


_REDUCE = 4  # a depth with more than 4x as many candidates as it can keep is cut to those first


class _Plan:
    """``_plan`` as device tensors, built once per (budget, depth, ranks, device).

    levels: per depth >= 2, (pos [C], kept or None, parents): ``kept`` when the depth's
    candidates are first cut to its best ``kept`` (many more candidates than nodes it can hold),
    else every candidate goes to the final selection; rank_index: where each candidate's rank term
    is in the flattened [K * R] log-probs, depths concatenated; table_pos / table_rank: parent
    position and rank of every candidate of every depth, depth 1 first. Per slot of the final
    selection (a depth's candidates, or its kept ones): its 0-based depth and its depth's offset
    into the tables; per depth, its first slot and the offset of its parent list.
    """

    def __init__(self, budget: int, depth: int, ranks: int, device):
        first, first_parents, plan = _plan(budget, depth, ranks)
        t = functools.partial(torch.tensor, dtype=torch.int64, device=device)
        self.first, self.first_parents = first, first_parents
        self.levels = [(t(p), kept if len(p) > _REDUCE * kept else None, par) for p, _, kept, par in plan]
        # Flat index (d * R + rank) of every candidate's log-prob, all depths >= 2 concatenated.
        self.rank_index = t([d * ranks + x for d, (_, rr, _, _) in enumerate(plan, start=1) for x in rr])
        self.table_pos = t([0] * first + [x for p, _, _, _ in plan for x in p])
        self.table_rank = t(list(range(first)) + [x for _, r, _, _ in plan for x in r])
        sizes = [first] + [len(p) for p, _, _, _ in plan]
        widths = [first] + [kept or len(pos) for pos, kept, _ in self.levels]
        parent_counts = [first_parents] + [par for _, _, _, par in plan]
        slot_depth, table_offset, slot_start, parent_start = [], [], [], []
        slot, cand, par = 0, 0, 0
        for d, (size, width, count) in enumerate(zip(sizes, widths, parent_counts)):
            slot_start.append(slot)
            parent_start.append(par)
            slot_depth += [d] * width
            table_offset += [cand] * width
            slot += width
            cand += size
            par += count
        self.slot_depth = t(slot_depth)
        self.table_offset = t(table_offset)
        self.slot_start = t(slot_start)
        self.parent_start = t(parent_start)
        self.arange = torch.arange(max(sizes + [ranks, budget]), device=device)
        self.parent_tie = self.arange * ranks  # i * R for parent position i
        # (d << 18) + r for depth d = 1..K and rank r: the tie-break part a key's rank half carries.
        self.rank_tie = (torch.arange(1, depth + 1, device=device)[:, None] << _DEPTH_SHIFT) + self.arange[:ranks]


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

    An unsorted topk then a sort of the k winners: on CPUs cheaper than a sorted topk. Keys are
    distinct, so the result is fully determined.
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
    # Key of candidate (i, r) at depth d: (score << 24) - ((d << 18) + i * R + r). Larger is
    # earlier, all keys differ, and the tie-break is the heap's (depth, parent position, rank).
    # It is split into a parent part and a rank part, so a depth's keys are two gathers and an add.
    rank_part = fixed_point(logprobs).bitwise_left_shift_(_TIE_BITS).sub_(plan.rank_tie)  # [B, K, R]
    keys = rank_part[:, 0, : plan.first]  # [B, P] depth 1 (parent part 0), already in order
    slot_keys = [keys]
    slot_cands = [plan.arange[: plan.first].expand(b, plan.first)]  # each slot's candidate, within its depth
    parent_slots = [plan.arange[: plan.first_parents].expand(b, plan.first_parents)]  # in order
    score = (keys[:, : plan.first_parents] + _LOW) & ~_LOW  # parents' shifted scores, in order
    rank_terms = rank_part.view(b, k * r).gather(1, plan.rank_index.expand(b, -1))  # [B, sum C], every depth
    start = 0
    for pos, kept, parents in plan.levels:
        c = pos.shape[0]
        parent_part = score - plan.parent_tie[: score.shape[1]]  # [B, P]: (s_i << 24) - i * R
        keys = parent_part.gather(1, pos.expand(b, c)) + rank_terms[:, start : start + c]  # [B, C]
        start += c
        if kept is None:
            slot_cands.append(plan.arange[:c].expand(b, c))
        else:  # far more candidates than the depth can hold: keep its best, in any order
            keys, picks = torch.topk(keys, kept, dim=1, sorted=False)
            slot_cands.append(picks)
        slot_keys.append(keys)
        if parents:
            # Only the depth's first few, in order, can be parents one depth down.
            ordered, which = torch.topk(keys, parents, dim=1)
            parent_slots.append(which)
            score = (ordered + _LOW) & ~_LOW

    # The tree: the n best slots of all depths. Keys carry the depth, so one selection orders
    # them all (equal scores: shallower first, then parent position, then rank).
    all_keys = torch.cat(slot_keys, 1)  # [B, W]
    top, order = _top(all_keys, n)  # [B, n] slot, in pop order
    depth0 = plan.slot_depth[order]  # [B, n] 0-based depth
    cand = (torch.cat(slot_cands, 1) + plan.table_offset).gather(1, order)  # [B, n] row of the tables
    # The parent is position table_pos of the depth above; that depth's parent list gives its
    # slot, and the selection put the slot at a tree index.
    above = (depth0 - 1).clamp(min=0)
    spare = torch.zeros(b, 1, dtype=torch.int64, device=dev)  # what depth-1 nodes look up (unused)
    parent_in_list = torch.cat(parent_slots + [spare], 1).gather(1, plan.parent_start[above] + plan.table_pos[cand])
    where = torch.empty_like(all_keys)
    where.scatter_(1, order, plan.arange[:n].expand(b, n))
    parents = torch.where(depth0 > 0, where.gather(1, plan.slot_start[above] + parent_in_list), -1)
    return DraftTree(
        ranks=plan.table_rank[cand],
        parents=parents,
        depths=depth0 + 1,
        scores=(top + _LOW) >> _TIE_BITS,  # the tie-break is in [0, 2**24): flooring drops it
    )


BUILDERS = {"heap": build_tree_heap, "vectorized": build_tree_vectorized}
