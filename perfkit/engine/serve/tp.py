"""Tensor parallelism: one rank's shard of the target, Megatron style.

Every rank loads the same weights (`load_engine(preset, seed=0)`), then `shard` keeps its slice:

    attention   wqkv rows [q heads | k heads | v heads] -> this rank's kv heads and the query heads
                of their groups (query head h belongs to kv head h // (H / G), so a rank's query
                heads are contiguous too); wo keeps the matching input columns
    SwiGLU      w13 rows [gate | up] -> d_ff / world of each half; w2 the matching input columns
    MoE         every expert split like a SwiGLU; the router replicated
    the rest    embeddings, norms, the head and the drafter replicated

wo and w2 (the MoE's combined output) then produce partial sums, and their `tp` hook (see
perfkit.engine.model) adds them up over the ranks: two all-reduces per layer. Every rank ends a
layer with the same hidden states, so every rank computes the same tokens. The shard's config is
the local one (H / world query heads, G / world kv heads, d_ff / world), so the KV cache an Engine
builds from it holds only this rank's kv heads.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn

from perfkit.errors import UserError

__all__ = ["AllReduce", "check", "shard", "local_device", "init_group"]


class AllReduce:
    """The `tp` hook: sums a partial output over the group, in place. `calls` counts the
    collectives entered, so a rank can tell that a failure came before any of them (its peers are
    then not waiting on it)."""

    def __init__(self, group=None):
        self.group = group
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        dist.all_reduce(x, group=self.group)
        return x


def check(config, world: int) -> None:
    """UserError unless `world` ranks can split the config's kv heads and d_ff evenly."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise UserError(f"--tp must be a positive int, got {world!r}")
    for name in ("n_kv_heads", "d_ff"):
        value = getattr(config, name)
        if value % world:
            raise UserError(f"{name} {value} does not split over --tp {world}")


def shard(engine, rank: int, world: int, *, reduce=None):
    """Turn `engine` (full weights) into rank `rank`'s shard of `world`, in place; returns it.

    `reduce` becomes every attention's and feed-forward's `tp` hook (default: an AllReduce over
    the default process group; None with world 1). Passing reduce=None with world > 1 is only
    useful to inspect a shard's partial outputs."""
    config = engine.target.config
    check(config, world)
    if not 0 <= rank < world:
        raise UserError(f"rank {rank} is outside --tp {world}")
    if world == 1:
        return engine
    local = dataclasses.replace(
        config, n_heads=config.n_heads // world, n_kv_heads=config.n_kv_heads // world, d_ff=config.d_ff // world
    )
    for block in engine.target.blocks:
        _shard_attention(block.attn, config, local, rank)
        block.attn.tp = reduce
        ffn = block.ffn
        for mlp in ffn.experts if config.is_moe else [ffn]:
            _shard_swiglu(mlp, config.d_ff, local.d_ff, rank)
        ffn.tp = reduce
    engine.target.config = local
    return engine


def _shard_attention(attn, full, local, rank: int) -> None:
    e = full.head_dim
    h, g = local.n_heads, local.n_kv_heads  # this rank's heads
    q_rows = torch.arange(rank * h * e, (rank + 1) * h * e)
    kv = torch.arange(rank * g * e, (rank + 1) * g * e)
    rows = torch.cat([q_rows, full.n_heads * e + kv, (full.n_heads + full.n_kv_heads) * e + kv])  # [(h + 2g) * E]
    _keep(attn.wqkv, rows=rows)  # [(H + 2G) * E, D] -> [(h + 2g) * E, D]
    _keep(attn.wo, cols=q_rows)  # [D, H * E] -> [D, h * E]
    attn.config = local


def _shard_swiglu(mlp, d_ff: int, local_ff: int, rank: int) -> None:
    mine = torch.arange(rank * local_ff, (rank + 1) * local_ff)
    _keep(mlp.w13, rows=torch.cat([mine, d_ff + mine]))  # [2F, D] -> [2f, D]: gate half, up half
    _keep(mlp.w2, cols=mine)  # [D, F] -> [D, f]


def _keep(linear: nn.Linear, *, rows=None, cols=None) -> None:
    w = linear.weight.data
    if rows is not None:
        w = w[rows.to(w.device)]
    if cols is not None:
        w = w[:, cols.to(w.device)]
    linear.weight = nn.Parameter(w.contiguous(), requires_grad=False)
    linear.out_features, linear.in_features = w.shape


def local_device(device: str, world: int) -> torch.device:
    """The device this rank computes on: cuda:LOCAL_RANK under CUDA (one GPU per rank), else `device`."""
    dev = torch.device(device)
    if dev.type != "cuda" or world == 1:
        return dev
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world > torch.cuda.device_count():
        raise UserError(f"--tp {world} needs {world} CUDA devices, this machine has {torch.cuda.device_count()}")
    return torch.device("cuda", local)


def init_group(rank: int, world: int, device: torch.device, *, timeout_s: float) -> None:
    """Join the process group (MASTER_ADDR and MASTER_PORT from the environment): gloo on a CPU,
    nccl on CUDA. A collective waits at most `timeout_s` for a peer."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
