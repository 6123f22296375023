"""Train the shipped target and drafter: deterministic, byte-level, on the stdlib's own source.

    python -m perfkit.engine.training.train [--out DIR] [--quick]      (or `perfkit engine train`)

1. Target: next-byte prediction on random windows of `data.training_text()` (AdamW, cosine).
2. Rollouts: the trained target decodes greedily from training-text prompts, keeping every
   position's token and final hidden state. Each generated position is a drafter example: the
   hidden state that predicted the root, the root, the window of the `window` positions before
   it, and the next `block` greedy tokens as labels. The drafter thus learns the target's own
   continuations, the thing acceptance compares against.
3. Drafter: cross-entropy of each slot against those tokens.
Held-out bytes (`data.heldout_text()`) measure the target's loss and accuracy and, through
held-out rollouts, the drafter's per-slot accuracy; all of it goes to `train_log.json`.

Fixed seeds, a seeded generator for every random draw and `torch.use_deterministic_algorithms`:
the same machine and thread count give the same weights.

Format history (`format_version`) of train_log.json: 1: keys `format` and `version`; 2: `format_version`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from perfkit.engine import data
from perfkit.engine.checkpoints import CHECKPOINT_DIR, load_weights, save_weights
from perfkit.engine.drafter import BlockDrafter, DrafterConfig
from perfkit.engine.model import KVCache, ModelConfig, Transformer
from perfkit.errors import UserError
from perfkit.files import read_json, write_json
from perfkit.kernels.verify_mask import causal_mask

__all__ = ["TARGET", "DRAFTER", "Settings", "train", "main", "FORMAT_VERSION"]

FORMAT_VERSION = 2

TARGET = ModelConfig(
    vocab_size=data.VOCAB_SIZE, d_model=192, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=48, d_ff=512
)
DRAFTER = DrafterConfig(
    vocab_size=data.VOCAB_SIZE,
    target_d_model=TARGET.d_model,
    d_model=128,
    n_layers=2,
    n_heads=4,
    d_ff=384,
    block=8,
    window=32,
)


@dataclass(frozen=True)
class Settings:
    """Everything that decides the weights besides the code and the stdlib text."""

    seed: int = 0
    # One thread: on a shared 2-core machine a second intra-op thread stalls whenever the other
    # core is busy (2x slower here); the weights are reproducible for a given thread count.
    threads: int = 1
    seq_len: int = 1536  # ~1k-token contexts plus what is generated after them stay in trained positions
    target_batch: int = 3
    target_steps: int = 1000
    target_lr: float = 3e-3
    warmup: int = 50
    rollout_batch: int = 128
    rollout_prompts: tuple = (64, 320, 704, 1088)  # prompt lengths, cycled over rollout batches
    rollout_len: int = 64
    rollout_batches: int = 32
    drafter_batch: int = 256
    drafter_steps: int = 1200
    drafter_lr: float = 2e-3
    eval_windows: int = 64
    eval_rollouts: int = 256
    log_every: int = 50


QUICK = Settings(
    seq_len=256,
    target_steps=20,
    rollout_batch=32,
    rollout_prompts=(64, 300),
    rollout_batches=2,
    rollout_len=24,
    drafter_steps=20,
    eval_windows=8,
    eval_rollouts=32,
    log_every=10,
)
TINY = Settings(  # for tests: seconds, useless weights
    seq_len=32,
    target_batch=2,
    target_steps=2,
    warmup=1,
    rollout_batch=4,
    rollout_prompts=(40,),
    rollout_batches=1,
    rollout_len=12,
    drafter_batch=8,
    drafter_steps=2,
    eval_windows=2,
    eval_rollouts=4,
    log_every=1,
)


def _update(opt, loss, module) -> None:
    """One optimizer step: gradients of `loss`, clipped to norm 1, applied."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    opt.step()


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _windows(text: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows of `length` bytes, [n, length] int64."""
    starts = torch.randint(0, text.numel() - length, (n,), generator=gen)
    return torch.stack([text[s : s + length] for s in starts.tolist()]).long()


def _evenly(text: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """n windows at evenly spaced offsets (deterministic evaluation sets)."""
    step = (text.numel() - length) // n
    return torch.stack([text[i * step : i * step + length] for i in range(n)]).long()


def _optimizer(model, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95)
    )


@torch.no_grad()
def evaluate_target(target: Transformer, windows: torch.Tensor) -> dict:
    """Mean next-byte loss (nats), bits per byte and top-1 accuracy over `windows`."""
    target.eval()
    losses, hits, count = 0.0, 0, 0
    for chunk in windows.split(16):
        logits = target.head(target.forward_sequence(chunk[:, :-1]))
        labels = chunk[:, 1:]
        losses += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
        hits += (logits.argmax(-1) == labels).sum().item()
        count += labels.numel()
    target.train()
    return {"loss": losses / count, "bits_per_byte": losses / count / math.log(2), "accuracy": hits / count}


def train_target(settings: Settings, text: torch.Tensor, held: torch.Tensor, log) -> tuple[Transformer, list]:
    torch.manual_seed(settings.seed)
    target = Transformer(TARGET)
    opt = _optimizer(target, settings.target_lr)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    curve = []
    t0 = time.perf_counter()
    for step in range(settings.target_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, settings.target_steps, settings.target_lr, settings.warmup)
        batch = _windows(text, settings.target_batch, settings.seq_len + 1, gen)
        logits = target.head(target.forward_sequence(batch[:, :-1]))
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        _update(opt, loss, target)
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.target_steps:
            point = {"step": step + 1, "loss": round(loss.item(), 4), "wall_s": round(time.perf_counter() - t0, 1)}
            if (step + 1) % (settings.log_every * 4) == 0 or step + 1 == settings.target_steps:
                point["heldout"] = {k: round(v, 4) for k, v in evaluate_target(target, held[:16]).items()}
            curve.append(point)
            log(
                f"target step {step + 1}/{settings.target_steps} loss "
                f"{loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}"
            )
    target.eval()
    return target, curve


@dataclass(frozen=True)
class Rollouts:
    """Greedy continuations, cut to what drafter examples need: the last W + 1 prompt positions
    and the generated ones. tokens [S, W + 1 + G]; hidden [S, W + 1 + G, D], the target's final
    hidden state at each position (fp16 to halve the memory); generated tokens start at `start`."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    start: int

    def examples(self, rows: torch.Tensor, roots: torch.Tensor):
        """Drafter inputs and labels for roots at columns `roots` of rollouts `rows` (both [M]):
        (root [M], window tokens [M, W], window hidden [M, W, D], labels [M, K])."""
        w, k = DRAFTER.window, DRAFTER.block
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
        """Root columns with a full window before and `block` labels after (generated text only)."""
        return range(self.start, self.tokens.shape[1] - DRAFTER.block)


@torch.no_grad()
def rollouts(target: Transformer, prompts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuations of `prompts` [B, P]: tokens [B, P + length] and the final hidden
    state at every position [B, P + length, D] (position t's state predicts token t + 1)."""
    b, p = prompts.shape
    cache = KVCache(TARGET, batch=b, capacity=p + length, device="cpu", dtype=torch.float32)
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


def _all_examples(roll: Rollouts, limit: int):
    """A deterministic evaluation set: every root position of the first rollouts, up to `limit`."""
    rows = torch.arange(roll.tokens.shape[0]).repeat_interleave(len(roll.roots))
    roots = torch.tensor(list(roll.roots)).repeat(roll.tokens.shape[0])
    return rows[:limit], roots[:limit]


@torch.no_grad()
def evaluate_drafter(drafter: BlockDrafter, roll: Rollouts, limit: int = 1 << 30) -> dict:
    """Per-slot top-1 accuracy and loss, and the accepted length of the drafter's top-1 chain."""
    drafter.eval()
    rows, roots = _all_examples(roll, limit)
    losses, hits = [], []
    for r, p in zip(rows.split(1024), roots.split(1024)):
        root, win_tok, win_hid, labels = roll.examples(r, p)
        logits = drafter(root, win_tok, win_hid)
        losses.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item())
        hits.append(logits.argmax(-1) == labels)  # [m, K]
    hit = torch.cat(hits)
    chain = hit.long().cumprod(1).sum(1).float().mean().item()  # leading correct slots
    drafter.train()
    return {
        "loss": round(sum(losses) / hit.numel(), 4),
        "slot_accuracy": [round(x, 4) for x in hit.float().mean(0).tolist()],
        "top1_chain_accept_length": round(1 + chain, 4),
    }


def train_drafter(settings: Settings, roll: Rollouts, held: Rollouts, log) -> tuple[BlockDrafter, list]:
    torch.manual_seed(settings.seed + 2)
    drafter = BlockDrafter(DRAFTER)
    opt = _optimizer(drafter, settings.drafter_lr)
    gen = torch.Generator().manual_seed(settings.seed + 3)
    first, stop = roll.roots.start, roll.roots.stop
    curve = []
    t0 = time.perf_counter()
    for step in range(settings.drafter_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, settings.drafter_steps, settings.drafter_lr, settings.warmup)
        rows = torch.randint(0, roll.tokens.shape[0], (settings.drafter_batch,), generator=gen)
        roots = torch.randint(first, stop, (settings.drafter_batch,), generator=gen)
        root, win_tok, win_hid, labels = roll.examples(rows, roots)
        logits = drafter(root, win_tok, win_hid)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        _update(opt, loss, drafter)
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.drafter_steps:
            point = {"step": step + 1, "loss": round(loss.item(), 4), "wall_s": round(time.perf_counter() - t0, 1)}
            if (step + 1) % (settings.log_every * 4) == 0 or step + 1 == settings.drafter_steps:
                point["heldout"] = evaluate_drafter(drafter, held, limit=2048)
            curve.append(point)
            log(
                f"drafter step {step + 1}/{settings.drafter_steps} loss "
                f"{loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}"
            )
    drafter.eval()
    return drafter, curve


def collect_rollouts(
    target: Transformer, text: torch.Tensor, settings: Settings, batches: int, batch: int, seed: int, log
) -> Rollouts:
    """`batches` batches of greedy rollouts, prompt lengths cycling through `rollout_prompts`
    (long prompts put the drafter's examples at the positions long contexts reach)."""
    gen = torch.Generator().manual_seed(seed)
    keep = DRAFTER.window + 1  # prompt positions a drafter example can look back to
    tokens, hidden = [], []
    for i in range(batches):
        length = settings.rollout_prompts[i % len(settings.rollout_prompts)]
        prompts = _windows(text, batch, length, gen)
        t, h = rollouts(target, prompts, settings.rollout_len)
        tokens.append(t[:, length - keep :])
        hidden.append(h[:, length - keep :].half())
        log(f"rollouts {i + 1}/{batches} (prompts of {length} bytes)")
    return Rollouts(tokens=torch.cat(tokens), hidden=torch.cat(hidden), start=keep)


def _record_base(settings: Settings) -> dict:
    train_files, held_files = data.corpus_files()
    return {
        "settings": asdict(settings),
        "target_config": TARGET.to_dict(),
        "drafter_config": DRAFTER.to_dict(),
        "corpus": {
            "training_files": len(train_files),
            "training_bytes": len(data.training_text()),
            "heldout_files": [os.path.basename(f) for f in held_files],
            "heldout_bytes": len(data.heldout_text()),
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": settings.threads},
    }


def _stage_one(settings: Settings, out: Path, text, held, log) -> tuple[Transformer, dict]:
    """Train the target and write it (and a log of this stage) at once, before the drafter."""
    t0 = time.perf_counter()
    target, curve = train_target(settings, text, held, log)
    heldout = evaluate_target(target, held)
    log(f"target held-out: {heldout}")
    section = {
        "parameters": sum(p.numel() for p in target.parameters()),
        "curve": curve,
        "heldout": {k: round(v, 4) for k, v in heldout.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    save_weights(out / "target.safetensors", target.state_dict(), config=TARGET.to_dict())
    write_json(out / "train_log.json", _record_base(settings) | {"target": section}, version=FORMAT_VERSION)
    return target, section


def _reuse_stage_one(settings: Settings, out: Path, log) -> tuple[Transformer, dict]:
    """The target a previous run of this script wrote to `out` with the same settings."""
    weights, config, _ = load_weights(out / "target.safetensors")
    previous = read_json(out / "train_log.json")  # any format version: the fields compared never changed
    same = json.loads(json.dumps(_record_base(settings)))  # tuples become lists, as stored
    for key in ("settings", "target_config", "corpus", "machine"):
        if previous.get(key) != same[key]:
            raise UserError(f"--reuse-target: {out / 'train_log.json'} was written with a different {key}")
    if config != TARGET.to_dict():
        raise UserError("--reuse-target: the stored target has a different configuration")
    target = Transformer(TARGET)
    target.load_state_dict(weights)
    log(f"reusing the target in {out} (stage 1 is deterministic; its log is kept)")
    return target.eval(), previous["target"]


def train(
    settings: Settings = Settings(), *, out_dir: str | Path = CHECKPOINT_DIR, log=print, reuse_target: bool = False
) -> dict:
    """Train both models, write `target.safetensors`, `drafter.safetensors` and `train_log.json`.

    `reuse_target`: skip stage 1 and take the target this script already wrote to `out_dir`
    with identical settings (the drafter stage depends only on that target and the settings).
    """
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    out = Path(out_dir)
    text = torch.frombuffer(bytearray(data.training_text()), dtype=torch.uint8)
    held_text = torch.frombuffer(bytearray(data.heldout_text()), dtype=torch.uint8)
    held = _evenly(held_text, settings.eval_windows, settings.seq_len + 1)
    if reuse_target:
        target, target_section = _reuse_stage_one(settings, out, log)
    else:
        target, target_section = _stage_one(settings, out, text, held, log)

    t1 = time.perf_counter()
    roll = collect_rollouts(
        target, text, settings, settings.rollout_batches, settings.rollout_batch, settings.seed + 4, log
    )
    held_roll = collect_rollouts(target, held_text, settings, 1, settings.eval_rollouts, settings.seed + 5, log)
    rollout_s = time.perf_counter() - t1

    t2 = time.perf_counter()
    drafter, drafter_curve = train_drafter(settings, roll, held_roll, log)
    drafter_s = time.perf_counter() - t2
    drafter_eval = evaluate_drafter(drafter, held_roll)
    log(f"drafter held-out: {drafter_eval}")

    save_weights(out / "drafter.safetensors", drafter.state_dict(), config=DRAFTER.to_dict())
    record = _record_base(settings) | {
        "target": target_section,
        "drafter": {
            "parameters": sum(p.numel() for p in drafter.parameters()),
            "rollouts": int(roll.tokens.shape[0]),
            "examples": roll.tokens.shape[0] * len(roll.roots),
            "curve": drafter_curve,
            "heldout": drafter_eval,
            "wall_s": {"rollouts": round(rollout_s, 1), "training": round(drafter_s, 1)},
        },
    }
    write_json(out / "train_log.json", record, version=FORMAT_VERSION)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="perfkit engine train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(CHECKPOINT_DIR), help="where checkpoints and train_log.json go")
    parser.add_argument("--quick", action="store_true", help="a few steps of each stage (smoke test, useless weights)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 1, see Settings)")
    parser.add_argument(
        "--reuse-target",
        action="store_true",
        help="keep the target a previous run wrote to --out (same settings); train the drafter only",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.threads:
        settings = replace(settings, threads=args.threads)
    train(settings, out_dir=args.out, log=lambda line: print(line, flush=True), reuse_target=args.reuse_target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
