"""What the models learn from: windows of text of both kinds, and the drafter's sequences.

The target learns from random windows (`mixed_windows`: each window prose with probability
`share`, else code). The drafter learns from `Sequences` of two sources (`collect`):

- rollouts: the target's greedy continuation of a prompt, the thing acceptance compares against
  (Medusa-2, DFlash and EAGLE-3 train on target-generated responses);
- passages: the real text that followed the prompt, teacher-forced (EAGLE-1 trains on a fixed
  dataset). A tiny target's greedy continuations fall into loops far sooner than a large
  model's; a drafter that learns from them learns to copy the loops and is an oracle on them
  (half rollouts, half passages: 6.2 tokens per step on held-out prose, 6.7 on code; rollouts
  only 6.6 and 7.4), while real text keeps it predicting what text, not the loop, would do next
  (3.8 and 4.4, where published drafters stand on chat text). The shipped drafter uses passages.

Every draw comes from a seeded generator, so the same seed gives the same examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perfkit.engine.model import KVCache, Transformer
from perfkit.kernels.verify_mask import causal_mask

__all__ = ["mixed_windows", "evenly", "Sequences", "rollouts", "collect"]


def mixed_windows(texts: dict, share: float, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows of `length` bytes, [n, length] int64, each from `texts["prose"]` with
    probability `share`, else from `texts["code"]` (share 1.0 or 0.0: one kind only)."""
    prose = (torch.rand(n, generator=gen) < share).tolist()
    where = torch.rand(n, generator=gen, dtype=torch.float64).tolist()
    rows = []
    for is_prose, u in zip(prose, where):
        text = texts["prose" if is_prose else "code"]
        start = int(u * (text.numel() - length))
        rows.append(text[start : start + length])
    return torch.stack(rows).long()


def evenly(text: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """n windows at evenly spaced offsets (deterministic evaluation sets)."""
    step = (text.numel() - length) // n
    return torch.stack([text[i * step : i * step + length] for i in range(n)]).long()


@dataclass(frozen=True)
class Sequences:
    """Sequences the drafter learns from, cut to what its examples need: the last W + 1 prompt
    positions and the G after them (a rollout or a passage). tokens [S, W + 1 + G]; hidden
    [S, W + 1 + G, D], the target's final hidden state at each position (fp16 to halve the
    memory); the G positions start at `start`. `window` W and `block` K are the drafter's."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    start: int
    window: int
    block: int

    @staticmethod
    def joined(parts: list[Sequences]) -> Sequences:
        first = parts[0]
        return Sequences(
            tokens=torch.cat([r.tokens for r in parts]),
            hidden=torch.cat([r.hidden for r in parts]),
            start=first.start,
            window=first.window,
            block=first.block,
        )

    def examples(self, rows: torch.Tensor, roots: torch.Tensor):
        """Drafter inputs and labels for roots at columns `roots` of sequences `rows` (both [M]):
        (root [M], window tokens [M, W], window hidden [M, W, D], labels [M, K])."""
        w, k = self.window, self.block
        win = roots[:, None] - w + torch.arange(w)  # [M, W], ends at the state that predicted the root
        ahead = roots[:, None] + 1 + torch.arange(k)  # [M, K]
        r = rows[:, None]
        return (
            self.tokens[rows, roots],
            self.tokens[r, win],
            self.hidden[r, win].float(),
            self.tokens[r, ahead],
        )

    @property
    def roots(self) -> range:
        """Root columns with a full window before and `block` labels after (the G positions only)."""
        return range(self.start, self.tokens.shape[1] - self.block)


@torch.no_grad()
def rollouts(target: Transformer, prompts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuations of `prompts` [B, P]: tokens [B, P + length] and the final hidden
    state at every position [B, P + length, D] (position t's state predicts token t + 1)."""
    b, p = prompts.shape
    cache = KVCache(target.config, batch=b, capacity=p + length, device="cpu", dtype=torch.float32)
    zeros = torch.zeros(b, dtype=torch.int64)
    positions = torch.arange(p).expand(b, p)
    states = [
        target.forward(
            prompts, cache, positions=positions, slots=positions, mask=causal_mask(zeros, p), kv_len=p, uniform_start=0
        )
    ]
    tokens = [prompts]
    last = states[0][:, -1]  # [B, D] predicts the first generated token
    for j in range(length):
        nxt = target.head(last).argmax(-1)  # [B]
        tokens.append(nxt[:, None])
        pos = torch.full((b, 1), p + j)
        states.append(
            target.forward(
                nxt[:, None],
                cache,
                positions=pos,
                slots=pos,
                mask=causal_mask(zeros + p + j, 1),
                kv_len=p + j + 1,
                uniform_start=p + j,
            )
        )
        last = states[-1][:, -1]
    return torch.cat(tokens, 1), torch.cat(states, 1)


@dataclass(frozen=True)
class Draw:
    """How `collect` draws: `batches` batches of `batch` prompts cut from `texts` (prose with
    probability `share`), prompt lengths cycling through `prompt_lengths` (long prompts put the
    drafter's examples at the positions long contexts reach), `length` positions after each, and
    the drafter's `window` and `block`."""

    share: float
    batches: int
    batch: int
    prompt_lengths: tuple
    length: int
    window: int
    block: int


@torch.no_grad()
def collect(target: Transformer, texts: dict, draw: Draw, seed: int, *, real: bool, log) -> Sequences:
    """Sequences of the target's greedy continuations, or with `real` of the text that follows
    each prompt, teacher-forced (one forward over prompt and passage: no generation)."""
    gen = torch.Generator().manual_seed(seed)
    keep = draw.window + 1  # prompt positions a drafter example can look back to
    tokens, hidden = [], []
    for i in range(draw.batches):
        length = draw.prompt_lengths[i % len(draw.prompt_lengths)]
        if real:
            t = mixed_windows(texts, draw.share, draw.batch, length + draw.length, gen)
            h = torch.cat([target.forward_sequence(chunk) for chunk in t.split(16)])
        else:
            t, h = rollouts(target, mixed_windows(texts, draw.share, draw.batch, length, gen), draw.length)
        tokens.append(t[:, length - keep :])
        hidden.append(h[:, length - keep :].half())
        log(f"{'passages' if real else 'rollouts'} {i + 1}/{draw.batches} (prompts of {length} bytes)")
    return Sequences(torch.cat(tokens), torch.cat(hidden), start=keep, window=draw.window, block=draw.block)
