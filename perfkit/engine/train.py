"""Train the shipped target and drafter: deterministic, byte-level, on the stdlib's own source.

    python -m perfkit.engine.train [--out DIR] [--quick]      (or ``perfkit engine train``)

1. Target: next-byte prediction on random windows of ``data.training_text()`` (AdamW, cosine).
2. Rollouts: the trained target decodes greedily from training-text prompts; every generated
   position gives a drafter example (target hidden state that predicted the root, the root, the
   next ``block`` greedy tokens). The drafter thus learns the target's own continuations, the
   thing acceptance compares against.
3. Drafter: cross-entropy of each slot against those tokens.
Held-out bytes (``data.heldout_text()``) measure the target's loss and accuracy and, through
held-out rollouts, the drafter's per-slot accuracy; all of it goes to ``train_log.json``.

Fixed seeds, a seeded generator for every random draw and ``torch.use_deterministic_algorithms``:
the same machine and thread count give the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from perfkit.engine import data
from perfkit.engine.checkpoints import CHECKPOINT_DIR, save_weights
from perfkit.engine.drafter import BlockDrafter, DrafterConfig
from perfkit.engine.model import KVCache, ModelConfig, Transformer
from perfkit.kernels.verify_mask import causal_mask

__all__ = ["TARGET", "DRAFTER", "Settings", "train", "main"]

TARGET = ModelConfig(
    vocab_size=data.VOCAB_SIZE, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512
)
DRAFTER = DrafterConfig(
    vocab_size=data.VOCAB_SIZE, target_d_model=TARGET.d_model, d_model=256, n_layers=2, n_heads=4, d_ff=512, block=8
)


@dataclass(frozen=True)
class Settings:
    """Everything that decides the weights besides the code and the stdlib text."""

    seed: int = 0
    threads: int = 2
    seq_len: int = 256
    target_batch: int = 16
    target_steps: int = 1000
    target_lr: float = 3e-3
    warmup: int = 50
    rollout_batch: int = 256
    rollout_prompt: int = 64
    rollout_len: int = 64
    rollout_batches: int = 24
    drafter_batch: int = 256
    drafter_steps: int = 1200
    drafter_lr: float = 2e-3
    eval_windows: int = 64
    eval_rollouts: int = 256
    log_every: int = 50


QUICK = Settings(
    target_steps=20, rollout_batch=32, rollout_batches=2, rollout_len=24, drafter_steps=20, eval_windows=8, eval_rollouts=32, log_every=10
)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _windows(text: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows of ``length`` bytes, [n, length] int64."""
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
    """Mean next-byte loss (nats), bits per byte and top-1 accuracy over ``windows``."""
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
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.target_steps:
            point = {"step": step + 1, "loss": round(loss.item(), 4), "wall_s": round(time.perf_counter() - t0, 1)}
            if (step + 1) % (settings.log_every * 4) == 0 or step + 1 == settings.target_steps:
                point["heldout"] = {k: round(v, 4) for k, v in evaluate_target(target, held[:16]).items()}
            curve.append(point)
            log(f"target step {step + 1}/{settings.target_steps} loss {loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}")
    target.eval()
    return target, curve


@torch.no_grad()
def rollouts(target: Transformer, prompts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuations of ``prompts`` [B, P]: tokens [B, length] and, for each, the target's
    final hidden state [B, length, D] at the position that predicted it."""
    b, p = prompts.shape
    cache = KVCache(TARGET, batch=b, capacity=p + length, device="cpu", dtype=torch.float32)
    zeros = torch.zeros(b, dtype=torch.int64)
    positions = torch.arange(p).expand(b, p)
    hidden = target.forward(
        prompts, cache, positions=positions, slots=positions, mask=causal_mask(zeros, p), kv_len=p, uniform_start=0
    )
    last = hidden[:, -1]  # [B, D] predicts the first generated token
    tokens, states = [], []
    for j in range(length):
        nxt = target.head(last).argmax(-1)  # [B]
        tokens.append(nxt)
        states.append(last)
        pos = torch.full((b, 1), p + j)
        last = target.forward(
            nxt[:, None], cache, positions=pos, slots=pos, mask=causal_mask(zeros + p + j, 1), kv_len=p + j + 1, uniform_start=p + j
        )[:, -1]
    return torch.stack(tokens, 1), torch.stack(states, 1)


def drafter_examples(tokens: torch.Tensor, states: torch.Tensor, block: int):
    """(hidden [M, D], root [M], labels [M, block]) from rollouts: root = token j, labels = j+1..j+block."""
    b, length = tokens.shape
    usable = length - block
    hidden = states[:, :usable].reshape(b * usable, -1)
    root = tokens[:, :usable].reshape(-1)
    labels = torch.stack([tokens[:, j + 1 : j + 1 + block] for j in range(usable)], 1).reshape(b * usable, block)
    return hidden, root, labels


@torch.no_grad()
def evaluate_drafter(drafter: BlockDrafter, hidden, root, labels) -> dict:
    """Per-slot top-1 accuracy and loss, and the expected accepted length of a greedy chain."""
    drafter.eval()
    logits = torch.cat([drafter(h.float(), r) for h, r in zip(hidden.split(1024), root.split(1024))])
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    hit = logits.argmax(-1) == labels  # [M, K]
    chain = hit.long().cumprod(1).sum(1).float().mean().item()  # leading correct slots of the top-1 chain
    drafter.train()
    return {
        "loss": round(loss, 4),
        "slot_accuracy": [round(x, 4) for x in hit.float().mean(0).tolist()],
        "top1_chain_accept_length": round(1 + chain, 4),
    }


def train_drafter(settings: Settings, examples, held_examples, log) -> tuple[BlockDrafter, list]:
    torch.manual_seed(settings.seed + 2)
    drafter = BlockDrafter(DRAFTER)
    opt = _optimizer(drafter, settings.drafter_lr)
    gen = torch.Generator().manual_seed(settings.seed + 3)
    hidden, root, labels = examples
    curve = []
    t0 = time.perf_counter()
    for step in range(settings.drafter_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, settings.drafter_steps, settings.drafter_lr, settings.warmup)
        pick = torch.randint(0, root.numel(), (settings.drafter_batch,), generator=gen)
        logits = drafter(hidden[pick].float(), root[pick])
        loss = F.cross_entropy(logits.flatten(0, 1), labels[pick].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.drafter_steps:
            point = {"step": step + 1, "loss": round(loss.item(), 4), "wall_s": round(time.perf_counter() - t0, 1)}
            if (step + 1) % (settings.log_every * 4) == 0 or step + 1 == settings.drafter_steps:
                point["heldout"] = evaluate_drafter(drafter, *(x[:2048] for x in held_examples))
            curve.append(point)
            log(f"drafter step {step + 1}/{settings.drafter_steps} loss {loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}")
    drafter.eval()
    return drafter, curve


def _collect(target: Transformer, text: torch.Tensor, settings: Settings, batches: int, batch: int, seed: int, log):
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for i in range(batches):
        prompts = _windows(text, batch, settings.rollout_prompt, gen)
        tokens, states = rollouts(target, prompts, settings.rollout_len)
        hidden, root, labels = drafter_examples(tokens, states, DRAFTER.block)
        parts.append((hidden.half(), root, labels))
        log(f"rollouts {i + 1}/{batches}")
    return tuple(torch.cat([p[k] for p in parts]) for k in range(3))


def train(settings: Settings = Settings(), *, out_dir: str | Path = CHECKPOINT_DIR, log=print) -> dict:
    """Train both models, write ``target.safetensors``, ``drafter.safetensors`` and ``train_log.json``."""
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.perf_counter()
    text = torch.frombuffer(bytearray(data.training_text()), dtype=torch.uint8)
    held_text = torch.frombuffer(bytearray(data.heldout_text()), dtype=torch.uint8)
    held = _evenly(held_text, settings.eval_windows, settings.seq_len + 1)

    target, target_curve = train_target(settings, text, held, log)
    target_s = time.perf_counter() - t_start
    target_eval = evaluate_target(target, held)
    log(f"target held-out: {target_eval}")

    t1 = time.perf_counter()
    examples = _collect(target, text, settings, settings.rollout_batches, settings.rollout_batch, settings.seed + 4, log)
    held_examples = _collect(target, held_text, settings, 1, settings.eval_rollouts, settings.seed + 5, log)
    rollout_s = time.perf_counter() - t1

    t2 = time.perf_counter()
    drafter, drafter_curve = train_drafter(settings, examples, held_examples, log)
    drafter_s = time.perf_counter() - t2
    drafter_eval = evaluate_drafter(drafter, *held_examples)
    log(f"drafter held-out: {drafter_eval}")

    out = Path(out_dir)
    save_weights(out / "target.safetensors", target.state_dict(), config=TARGET.to_dict())
    save_weights(out / "drafter.safetensors", drafter.state_dict(), config=DRAFTER.to_dict())
    train_files, held_files = data.corpus_files()
    record = {
        "format": "perfkit-train-log",
        "version": 1,
        "settings": asdict(settings),
        "target_config": TARGET.to_dict(),
        "drafter_config": DRAFTER.to_dict(),
        "parameters": {
            "target": sum(p.numel() for p in target.parameters()),
            "drafter": sum(p.numel() for p in drafter.parameters()),
        },
        "corpus": {
            "training_files": len(train_files),
            "training_bytes": len(data.training_text()),
            "heldout_files": [os.path.basename(f) for f in held_files],
            "heldout_bytes": len(data.heldout_text()),
        },
        "target": {"curve": target_curve, "heldout": {k: round(v, 4) for k, v in target_eval.items()}},
        "drafter": {"examples": int(examples[1].numel()), "curve": drafter_curve, "heldout": drafter_eval},
        "wall_s": {
            "target": round(target_s, 1),
            "rollouts": round(rollout_s, 1),
            "drafter": round(drafter_s, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": settings.threads},
    }
    _write_json(out / "train_log.json", record)
    return record


def _write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="perfkit engine train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(CHECKPOINT_DIR), help="where checkpoints and train_log.json go")
    parser.add_argument("--quick", action="store_true", help="a few steps of each stage (smoke test, useless weights)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 2)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.threads:
        settings = replace(settings, threads=args.threads)
    train(settings, out_dir=args.out, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
