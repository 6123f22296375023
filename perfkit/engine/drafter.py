"""The block drafter: one forward proposes token distributions for the next ``block`` positions.

DFlash/Medusa style. It is conditioned on the target's final hidden state at the last committed
position (the one that predicted the root token) and on the root token itself, and fills
``block`` learned slot embeddings through a few small bidirectional transformer layers. Slot k
predicts the token k positions after the root. No autoregression inside the drafter, so its cost
is one small forward per decode step, a small fraction of verifying the tree with the target.

Shapes: B batch, K block (draft depth), D drafter width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from perfkit.engine.model import RMSNorm, SwiGLU
from perfkit.errors import UserError

__all__ = ["DrafterConfig", "BlockDrafter"]


@dataclass(frozen=True)
class DrafterConfig:
    """Sizes of the block drafter."""

    vocab_size: int = 256
    target_d_model: int = 256
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    block: int = 8  # positions proposed per forward = maximum tree depth
    norm_eps: float = 1e-5

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            ok = value > 0 if f.name == "norm_eps" else isinstance(value, int) and not isinstance(value, bool) and value >= 1
            if not ok:
                raise UserError(f"DrafterConfig.{f.name} must be positive, got {value!r}")
        if self.d_model % self.n_heads:
            raise UserError(f"drafter d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DrafterConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown DrafterConfig fields: {', '.join(unknown)}")
        return cls(**data)


class SlotLayer(nn.Module):
    """Pre-norm transformer layer over the K slots, full (bidirectional) attention."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.wqkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x):
        b, k, d = x.shape
        q, kk, v = self.wqkv(self.attn_norm(x)).view(b, k, 3, self.n_heads, d // self.n_heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2))  # [B, h, K, d/h]
        x = x + self.wo(out.transpose(1, 2).reshape(b, k, d))
        return x + self.ffn(self.ffn_norm(x))


class BlockDrafter(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        self.from_target = nn.Linear(config.target_d_model, config.d_model, bias=False)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.slots = nn.Parameter(torch.zeros(config.block, config.d_model))
        self.layers = nn.ModuleList(SlotLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, hidden, root):
        """Logits [B, K, V] for the K positions after ``root`` [B], given target hidden [B, D_target]."""
        x = self.from_target(hidden) + self.embed(root)  # [B, D]
        x = x[:, None, :] + self.slots[None]  # [B, K, D]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
