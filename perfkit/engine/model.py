"""The target model: a small decoder-only transformer, readable top to bottom.

RMSNorm, rotary positions (RoPE), grouped-query attention and a SwiGLU feed-forward, or a top-k
routed mixture of SwiGLU experts (MoE) when `n_experts > 0`. Inference goes through one
preallocated KV cache written at explicit slots, so prefill chunks, autoregressive steps and tree
verification are the same forward with different (tokens, positions, slots, mask). Training uses
`forward_sequence` (plain causal attention, no cache).

Shapes: B batch, Q new tokens per forward, S attended cache length, D d_model, H query heads,
G kv heads, E head_dim.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from perfkit.errors import UserError
from perfkit.kernels.verify_attention import attend, mask_bias
from perfkit.kernels.verify_mask import VerifyMask

__all__ = ["ModelConfig", "KVCache", "Transformer"]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the target model. The roofline module reads these to count bytes and FLOPs."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 512
    n_experts: int = 0  # 0 = dense feed-forward
    top_k: int = 0  # experts per token; 0 = dense
    max_seq_len: int = 131072  # longest position the rotary table may be built for
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("rope_base", "norm_eps"):
                if not isinstance(value, (int, float)) or value <= 0:
                    raise UserError(f"ModelConfig.{f.name} must be a positive number, got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"ModelConfig.{f.name} must be a non-negative int, got {value!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
            if getattr(self, name) < 1:
                raise UserError(f"ModelConfig.{name} must be >= 1")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise UserError(f"head_dim must be even for rotary positions, got {self.head_dim}")
        if (self.n_experts == 0) != (self.top_k == 0) or self.top_k > self.n_experts:
            raise UserError(
                "MoE needs 0 < top_k <= n_experts (or both 0 for dense), "
                f"got n_experts={self.n_experts} top_k={self.top_k}"
            )

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        return config_from_dict(cls, data)


def config_from_dict(cls, data: dict):
    """A config dataclass from stored JSON; an unknown field is an error, not a silent default."""
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise UserError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    return cls(**data)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_table(n: int, head_dim: int, base: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation tables for positions [0, n), each [n, head_dim], fp32: (cos, cos) and (-sin, sin)
    side by side, so that rotating the two halves of a head is two multiplies and an add."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)


def apply_rope(x, cos, sin):
    """x: [B, Q, heads, E]; cos, sin: [B, Q, E] from `rope_table`. Rotates the two halves of each
    head: (x1 cos - x2 sin, x2 cos + x1 sin), computed in fp32."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    swapped = torch.cat([x32[..., half:], x32[..., :half]], dim=-1)  # (x2, x1)
    return (x32 * cos[:, :, None, :] + swapped * sin[:, :, None, :]).type_as(x)


class KVCache:
    """Keys and values of every layer in one preallocated tensor, written at explicit slots.

    `kv`: [n_layers, 2, B, G, capacity, E]. Slot s of request b holds the token at cache
    position s; what lies beyond a request's committed length is scratch (tree nodes under
    verification) and is never attended unless the mask allows it.
    """

    def __init__(self, config: ModelConfig, *, batch: int, capacity: int, device, dtype):
        self.capacity = capacity
        self.kv = torch.zeros(
            config.n_layers, 2, batch, config.n_kv_heads, capacity, config.head_dim, device=device, dtype=dtype
        )

    def write(self, layer: int, k, v, slots, uniform_start: int | None):
        """k, v: [B, G, Q, E] into slots [B, Q]; a contiguous slice when every request starts alike."""
        if uniform_start is not None:
            q = k.shape[2]
            self.kv[layer, 0, :, :, uniform_start : uniform_start + q] = k
            self.kv[layer, 1, :, :, uniform_start : uniform_start + q] = v
            return
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # [B, 1]
        # Advanced indices (rows, slots) around a slice put their [B, Q] dims first: [B, Q, G, E].
        self.kv[layer, 0][rows, :, slots] = k.transpose(1, 2)
        self.kv[layer, 1][rows, :, slots] = v.transpose(1, 2)

    def move(self, src, dst):
        """Copy slots src [B, M] to slots dst [B, M] in every layer (gather first, then scatter)."""
        rows = torch.arange(src.shape[0], device=src.device)[:, None]
        moved = self.kv[:, :, rows, :, src]  # [B, M, n_layers, 2, G, E]
        self.kv[:, :, rows, :, dst] = moved


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        h, g, e, d = config.n_heads, config.n_kv_heads, config.head_dim, config.d_model
        self.wqkv = nn.Linear(d, (h + 2 * g) * e, bias=False)
        self.wo = nn.Linear(h * e, d, bias=False)
        self.tp = None  # tensor parallel: sums wo's partial output over the ranks (perfkit.engine.serve.tp)

    def _project(self, x, cos, sin):
        c = self.config
        b, q, _ = x.shape
        qkv = self.wqkv(x).view(b, q, c.n_heads + 2 * c.n_kv_heads, c.head_dim)  # [B, Q, H + 2G, E]
        qk = apply_rope(qkv[:, :, : c.n_heads + c.n_kv_heads], cos, sin)  # queries and keys rotated together
        xq, xk = qk.split([c.n_heads, c.n_kv_heads], dim=2)
        xv = qkv[:, :, c.n_heads + c.n_kv_heads :]
        return xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)  # [B, H|G, Q, E]

    def forward_cached(self, x, cos, sin, cache: KVCache, layer: int, slots, uniform_start, bias, kv_len: int):
        """x: [B, Q, D]; attends cache slots [0, kv_len) under the additive `bias` [B, 1, Q, kv_len]."""
        b, q, _ = x.shape
        xq, xk, xv = self._project(x, cos, sin)
        cache.write(layer, xk, xv, slots, uniform_start)
        keys = cache.kv[layer, 0, :, :, :kv_len]  # [B, G, S, E]
        values = cache.kv[layer, 1, :, :, :kv_len]
        out = attend(xq, keys, values, bias)  # [B, H, Q, E]
        out = self.wo(out.transpose(1, 2).reshape(b, q, -1))  # [B, Q, D]
        return out if self.tp is None else self.tp(out)

    def forward_sequence(self, x, cos, sin):
        """x: [B, T, D] with plain causal attention (training and drafter data)."""
        b, t, _ = x.shape
        xq, xk, xv = self._project(x, cos, sin)
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=True)
        out = self.wo(out.transpose(1, 2).reshape(b, t, -1))
        return out if self.tp is None else self.tp(out)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w13 = nn.Linear(d_model, 2 * d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.tp = None  # as Attention.tp, for w2's output (unset in MoE experts: the MoE sums once)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        out = self.w2(F.silu(gate) * up)
        return out if self.tp is None else self.tp(out)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts. `touched` holds, after each forward, the number of distinct
    experts the forward's tokens were routed to (a 0-d tensor: reading it is the caller's sync)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(config.d_model, config.d_ff) for _ in range(config.n_experts))
        self.touched = None
        self.tp = None  # as Attention.tp, for the combined output of the experts

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [T, D]
        weights, chosen = self.router(flat).float().softmax(-1).topk(self.top_k, dim=-1)  # [T, k]
        weights = (weights / weights.sum(-1, keepdim=True)).type_as(x)
        counts = torch.bincount(chosen.flatten(), minlength=len(self.experts))  # [n_experts]
        self.touched = (counts > 0).sum()
        out = torch.zeros_like(flat)
        # One pass per expert that received tokens; reading counts is a host sync on CUDA.
        for e in counts.nonzero().flatten().tolist():
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, self.experts[e](flat[token]) * weights[token, slot, None])
        out = out.view(shape)
        return out if self.tp is None else self.tp(out)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = MoE(config) if config.is_moe else SwiGLU(config.d_model, config.d_ff)


class Transformer(nn.Module):
    """Embeddings, blocks, final norm and the output head (untied)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._rope: tuple | None = None
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual output projections scaled down with depth (GPT-2 style) keep the
                # random-init model's activations tame.
                scale = 1.0 / math.sqrt(2 * self.config.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 1.0
                nn.init.normal_(p, mean=0.0, std=std * scale)

    def rope(self, n: int, device):
        """cos, sin tables for positions [0, n), grown on demand and kept."""
        if n > self.config.max_seq_len:
            raise UserError(f"position {n} exceeds the model's max_seq_len {self.config.max_seq_len}")
        if self._rope is None or self._rope[0].shape[0] < n or self._rope[0].device != torch.device(device):
            have = 0 if self._rope is None else self._rope[0].shape[0]
            size = min(self.config.max_seq_len, max(n, 2 * have, 1024))
            self._rope = rope_table(size, self.config.head_dim, self.config.rope_base, device)
        return self._rope

    def forward(
        self,
        tokens,
        cache: KVCache,
        *,
        positions,
        slots,
        mask: VerifyMask,
        kv_len: int,
        uniform_start: int | None = None,
    ):
        """Hidden states after the final norm, [B, Q, D], for new tokens [B, Q].

        positions [B, Q]: rotary positions; slots [B, Q]: where their K/V go in the cache (slot
        L_b + j for block entry j); mask: which cache slots each new token sees; kv_len: slots
        attended, max_b L_b + Q; uniform_start: the common first slot when every request writes
        the same contiguous range (a slice write instead of a scatter).
        """
        cos_t, sin_t = self.rope(int(kv_len), tokens.device)
        cos, sin = cos_t[positions], sin_t[positions]  # [B, Q, E]
        bias = mask_bias(mask, kv_len, self.embed.weight.dtype, uniform_start=uniform_start)  # [B, 1, Q, S], all layers
        x = self.embed(tokens)  # [B, Q, D]
        for i, block in enumerate(self.blocks):
            x = x + block.attn.forward_cached(
                block.attn_norm(x), cos, sin, cache, i, slots, uniform_start, bias, kv_len
            )
            x = x + block.ffn(block.ffn_norm(x))
        return self.norm(x)

    def forward_sequence(self, tokens):
        """Hidden states after the final norm, [B, T, D], with causal attention and no cache."""
        t = tokens.shape[1]
        cos_t, sin_t = self.rope(t, tokens.device)
        cos, sin = cos_t[None, :t], sin_t[None, :t]
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block.attn.forward_sequence(block.attn_norm(x), cos, sin)
            x = x + block.ffn(block.ffn_norm(x))
        return self.norm(x)

    def experts_touched(self) -> torch.Tensor | None:
        """Distinct experts touched by the last forward, summed over layers (None when dense)."""
        if not self.config.is_moe:
            return None
        return torch.stack([block.ffn.touched for block in self.blocks]).sum()
