"""The block drafter: one forward proposes token distributions for the next `block` positions.

DFlash/Medusa style. It is conditioned on the root token and on a short window of recent context:
the last `window` committed tokens with the target's final hidden state at each, the newest of
which is the state that predicted the root (the window is what lets it continue a pattern it has
just seen, such as an identifier or an indentation run). `block`
learned slot embeddings go through a few small transformer layers whose attention sees the window
and the other slots; slot k predicts the token k positions after the root. No autoregression
inside the drafter: one small forward per decode step, a fraction of the target's verify forward.

Shapes: B batch, K block (draft depth), W window, D drafter width, T target width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from perfkit.engine.model import RMSNorm, SwiGLU, config_from_dict
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
    window: int = 32  # recent committed positions the drafter attends to
    norm_eps: float = 1e-5

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            ok = (
                value > 0
                if f.name == "norm_eps"
                else isinstance(value, int) and not isinstance(value, bool) and value >= 1
            )
            if not ok:
                raise UserError(f"DrafterConfig.{f.name} must be positive, got {value!r}")
        if self.d_model % self.n_heads:
            raise UserError(f"drafter d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterConfig:
        return config_from_dict(cls, data)


class SlotLayer(nn.Module):
    """Pre-norm transformer layer over the K slots; its attention also sees the window's entries."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.wqkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x, memory_k, memory_v):
        """x: [B, K, D] slots; memory_k, memory_v: [B, W, h, D/h], the window's keys and values."""
        b, k, d = x.shape
        h = self.n_heads
        q, kk, v = self.wqkv(self.attn_norm(x)).view(b, k, 3, h, d // h).unbind(2)  # each [B, K, h, D/h]
        keys = torch.cat([memory_k, kk], 1).transpose(1, 2)  # [B, h, W + K, D/h]
        values = torch.cat([memory_v, v], 1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values)  # [B, h, K, D/h]
        x = x + self.wo(out.transpose(1, 2).reshape(b, k, d))
        return x + self.ffn(self.ffn_norm(x))


class BlockDrafter(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        self.from_target = nn.Linear(config.target_d_model, config.d_model, bias=False)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.slots = nn.Parameter(torch.zeros(config.block, config.d_model))
        self.window_pos = nn.Parameter(torch.zeros(config.window, config.d_model))
        self.memory_norm = RMSNorm(config.d_model, config.norm_eps)
        # The window's keys and values for every layer in one projection (the window is the same
        # input to each layer).
        self.memory_kv = nn.Linear(config.d_model, config.n_layers * 2 * config.d_model, bias=False)
        self.layers = nn.ModuleList(SlotLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, root, window_tokens, window_hidden):
        """Logits [B, K, V] for the K positions after `root` [B].

        window_tokens [B, W] and window_hidden [B, W, T]: the last W committed tokens, oldest
        first, and the target's final hidden state at each (zeros where the context is shorter
        than W). The last entry's hidden state is the one that predicted the root.
        """
        b, w = window_tokens.shape
        c = self.config
        proj = self.from_target(window_hidden)  # [B, W, D]
        x = (proj[:, -1] + self.embed(root))[:, None, :] + self.slots[None]  # [B, K, D]
        memory = self.memory_norm(proj + self.embed(window_tokens) + self.window_pos[None])  # [B, W, D]
        kv = self.memory_kv(memory).view(b, w, c.n_layers, 2, c.n_heads, c.d_model // c.n_heads)
        for i, layer in enumerate(self.layers):
            x = layer(x, kv[:, :, i, 0], kv[:, :, i, 1])
        return self.head(self.norm(x))
