"""Choosing the next token from the target's logits: greedy, or sampled reproducibly.

    choose(logits, positions, *, temperature, seed) -> tokens

    logits:    [B, ..., V] the target's logits for the token that goes to `positions`
    positions: [B, ...] int64, the absolute position each chosen token will occupy
    temperature 0 is argmax. Above 0 it is a sample from softmax(logits / temperature), drawn as
    argmax(logits / temperature + Gumbel noise) where the noise is a hash of (seed, request,
    position, token): the same request and position always get the same noise.

That is what makes speculative sampling lossless and checkable: the tree only caches target
forwards, and a node is accepted when its token is what the target chooses at its parent, with the
noise of that position. So a speculative run emits exactly the tokens an autoregressive run with
the same seed emits, token for token, whatever the draft tree (tests compare them), and every
token is a sample from the target's distribution given the tokens before it.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["choose", "gumbel_noise"]

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of x in [0, 2**32), in place (xor-shift-multiply rounds; the
    multipliers are below 2**31, so products stay inside int64 on every device)."""
    x.bitwise_xor_(x >> 16).mul_(0x7FEB352D).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15).mul_(0x31848BAB).bitwise_and_(_MASK32)
    return x.bitwise_xor_(x >> 16)


def _mix32_int(x: int) -> int:
    """`_mix32` of one Python int (the request keys are made on the host)."""
    x &= _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x31848BAB) & _MASK32
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=8)
def _token_keys(vocab: int, device: str) -> torch.Tensor:
    return _mix32((torch.arange(vocab, device=device) + 0x9E3779B9) & _MASK32)


@functools.lru_cache(maxsize=32)
def _request_keys(seed: int, batch: int, device: str) -> torch.Tensor:
    return torch.tensor([_mix32_int(_mix32_int(seed) + r) for r in range(batch)], device=device)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 Gumbel(0, 1) noise [*positions.shape, V], a pure function of (seed, request = index
    along dim 0, position, token)."""
    b, dev = positions.shape[0], positions.device
    request = _request_keys(seed, b, str(dev)).view(b, *([1] * (positions.dim() - 1)))
    key = _mix32((positions & _MASK32) ^ request)  # [B, ...]
    bits = _mix32(key.unsqueeze(-1) ^ _token_keys(vocab, str(dev)))  # [B, ..., V]
    # 24 random bits as a float32 uniform in (0, 1), never 0 or 1, so the noise is finite (|g| < 17).
    uniform = bits.bitwise_right_shift_(8).add_(1).float().mul_(1.0 / (2**24 + 1))
    return uniform.log_().neg_().log_().neg_()


def choose(logits: torch.Tensor, positions: torch.Tensor, *, temperature: float, seed: int) -> torch.Tensor:
    """The token for each position: argmax at temperature 0, else a seeded sample (see module)."""
    if temperature == 0:
        return logits.argmax(-1)
    scaled = logits.float() / temperature
    return (scaled + gumbel_noise(seed, positions, logits.shape[-1])).argmax(-1)
