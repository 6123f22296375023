"""prepare_for_verify: the attention mask of the tree-verify forward, two ways.

    prepare_for_verify_naive(seq_lens, tree, max_depth) -> VerifyMask    # O(B * Q * context)
    prepare_for_verify_compact(seq_lens, tree, max_depth) -> VerifyMask  # O(B * Q^2)

    seq_lens:  [B] int64, committed cache length of each request (the tree's K/V go after it)
    tree:      the tree's ancestor information, either
               [B, N] int64 parents: parent node index of each node, -1 for children of the root,
                   parents before children (a DraftTree's `parents`), or
               [B, Q, Q] bool: the tree's visibility block, `ancestors(parents, max_depth)`,
                   which the engine computes once per step with the tree (tree_build phase)
    max_depth: int, the deepest a node can be (the drafter's block size); bounds the walk in
               `ancestors` when parents are given
    The verify block is Q = N + 1 tokens: the root (the last committed-but-uncached token) at
    index 0, then node j at index j + 1. Query i may see every prefix slot, and block entry j when
    j is i or an ancestor of i.

The naive builder is the one in SGLang's DFlash/DDTree path: a Python loop over requests with
`seq_lens.tolist()`, `torch.arange` over each prefix, a Q x (prefix + Q) block per request,
flattened row-major and concatenated: sum_b Q * (L_b + Q) booleans, growing with context.
The compact builder keeps only the Q x Q block (the tree bias vLLM passes); the prefix stays
implicit in seq_lens. `perfkit.kernels.verify_attention` consumes either and gives identical
attention outputs. Given the block, what the two builders add is exactly the context-sized part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "VerifyMask",
    "ancestors",
    "causal_mask",
    "prepare_for_verify_naive",
    "prepare_for_verify_compact",
    "BUILDERS",
]


@dataclass(frozen=True)
class VerifyMask:
    """A verify mask in one of two layouts.

    kind "compact": `data` [B, Q, Q] bool, block visibility; prefix implicit.
    kind "naive": `data` [sum_b Q * (L_b + Q)] bool, per request Q rows of (L_b + Q) columns,
    row-major, requests concatenated.
    """

    kind: str
    seq_lens: torch.Tensor  # [B] int64
    q_len: int
    data: torch.Tensor
    block: torch.Tensor  # [B, Q, Q] bool, the visibility block either way (acceptance walks it)


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[B, Q, Q] bool: block entry j visible to query i (j == i or j an ancestor of i), Q = N + 1.

    Walks every node up one level per iteration, all nodes at once, at most `max_depth` - 1
    iterations (the root is visible to every entry from the start); on the CPU the walk stops as
    soon as every node has reached the root (on a GPU that check would be a sync, so it runs all).
    """
    b, n = parents.shape
    q = n + 1
    dev = parents.device
    up = torch.cat([torch.zeros(b, 1, dtype=torch.int64, device=dev), parents + 1], dim=1)  # [B, Q] parent index
    visible = torch.eye(q, dtype=torch.bool, device=dev).repeat(b, 1, 1)  # [B, Q, Q]
    visible[:, :, 0] = True
    cur = up
    for _ in range(max_depth - 1):
        if dev.type == "cpu" and not bool(cur.any()):
            break
        visible.scatter_(2, cur[:, :, None], True)
        cur = up.gather(1, cur)
    return visible


def causal_mask(seq_lens: torch.Tensor, q_len: int) -> VerifyMask:
    """Compact mask of a plain causal block (prefill chunks, autoregressive steps)."""
    b = seq_lens.shape[0]
    block = torch.ones(q_len, q_len, dtype=torch.bool, device=seq_lens.device).tril_().expand(b, q_len, q_len)
    return VerifyMask(kind="compact", seq_lens=seq_lens, q_len=q_len, data=block, block=block)


def _block(tree: torch.Tensor, max_depth: int) -> torch.Tensor:
    """The [B, Q, Q] visibility block from either form of ancestor information."""
    if tree.dtype == torch.bool:
        if tree.dim() != 3 or tree.shape[1] != tree.shape[2]:
            raise ValueError(f"a visibility block must be [B, Q, Q], got {tuple(tree.shape)}")
        return tree
    return ancestors(tree, max_depth)


def prepare_for_verify_compact(seq_lens: torch.Tensor, tree: torch.Tensor, max_depth: int) -> VerifyMask:
    """The Q x Q block only; no work proportional to the context."""
    block = _block(tree, max_depth)
    return VerifyMask(kind="compact", seq_lens=seq_lens, q_len=block.shape[1], data=block, block=block)


def prepare_for_verify_naive(seq_lens: torch.Tensor, tree: torch.Tensor, max_depth: int) -> VerifyMask:
    """Per request, a full Q x (prefix + Q) mask, flattened and concatenated (SGLang style)."""
    block = _block(tree, max_depth)
    q = block.shape[1]
    dev = seq_lens.device
    pieces = []
    for i, prefix_len in enumerate(seq_lens.tolist()):
        prefix = torch.arange(prefix_len, device=dev) < prefix_len  # [L] every prefix slot visible
        rows = torch.cat([prefix[None, :].expand(q, prefix_len), block[i]], dim=1)  # [Q, L + Q]
        pieces.append(rows.flatten())
    return VerifyMask(kind="naive", seq_lens=seq_lens, q_len=q, data=torch.cat(pieces), block=block)


BUILDERS = {"naive": prepare_for_verify_naive, "compact": prepare_for_verify_compact}
