"""Train the shipped target and drafter: deterministic, byte-level, on the stdlib's code and prose.

    python -m perfkit.engine.training.train [--out DIR] [--quick]      (or `perfkit engine train`)

1. Target: next-byte prediction on random windows of `data.training_text(kind)`, `prose_share`
   of them prose, the rest code (AdamW, cosine): a target that has read prose as well as code
   continues prose with prose instead of falling into the loops a code-only one fell into.
2. Drafter sequences (`examples.collect`), prompts of both kinds (`drafter_prose_share` prose):
   passages, the real text after the prompt with the target's hidden states over it
   (teacher-forced), and optionally rollouts, the trained target's greedy continuations with its
   hidden states. Each position of either is a drafter example: the hidden state that predicted
   the root, the root, the window of the `window` positions before it, and the next `block`
   tokens as labels. The shipped drafter learns from passages only, as EAGLE-1 learns from a
   fixed dataset: rollouts of a target this small teach it to copy the loops its greedy text
   falls into, and a drafter trained on them (recipe 1) was an oracle: 8.9 of at most 9 tokens
   per step.
3. Drafter: cross-entropy of each slot against those tokens.
Held-out bytes of each kind (`data.heldout_text(kind)`) measure the target's loss and accuracy,
through held-out rollouts the drafter's per-slot accuracy, and through the engine the tokens
committed per step at budget 32 on held-out prompts of each kind; all of it goes to
`train_log.json`, with `recipe` (RECIPE), also in the drafter's weights metadata.

Fixed seeds, a seeded generator for every random draw and `torch.use_deterministic_algorithms`:
the same machine and thread count give the same weights.

Format history (`format_version`) of train_log.json: 1: keys `format` and `version`; 2: `format_version`;
3: `recipe`, and held-out figures (target, drafter, corpus) per text kind.
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
from perfkit.engine.model import ModelConfig, Transformer
from perfkit.engine.training.examples import Draw, Sequences, collect, evenly, mixed_windows
from perfkit.errors import UserError
from perfkit.files import read_json, write_json

__all__ = ["TARGET", "DRAFTER", "Settings", "train", "main", "FORMAT_VERSION"]

FORMAT_VERSION = 3
#: What the shipped weights were trained as, in train_log.json and the drafter's weights metadata:
#: 1 (no `recipe` key): a code-only target, a drafter on the target's greedy rollouts of code;
#: 2: a target on code and prose, a drafter on real text of both kinds, teacher-forced.
RECIPE = 2

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
    target_steps: int = 1500
    prose_share: float = 0.3  # share of the target's training windows cut from prose (the rest: code)
    target_lr: float = 3e-3
    warmup: int = 50
    rollout_batch: int = 128
    rollout_prompts: tuple = (64, 320, 704, 1088)  # prompt lengths, cycled over rollout batches
    rollout_len: int = 64
    # The drafter's sequences: real text only. Measured on this target (accept length at budget 32,
    # held-out code / prose): 32 batches of rollouts 7.39 / 6.63, 16 + 16 6.66 / 6.20, 32 of
    # passages 4.38 / 3.85 (examples.py says why).
    rollout_batches: int = 0  # batches of the target's greedy continuations
    passage_batches: int = 32  # batches of real text, teacher-forced (labels: the text's own bytes)
    drafter_prose_share: float = 0.3  # share of both kinds of drafter sequences drawn from prose
    drafter_batch: int = 256
    drafter_steps: int = 1200
    drafter_lr: float = 2e-3
    eval_windows: int = 64
    eval_rollouts: int = 128  # held-out greedy continuations per kind (slot accuracy)
    accept_prompts: int = 16  # held-out prompts per kind whose accept length the engine measures
    accept_prompt_len: int = 1024
    accept_gen: int = 64
    log_every: int = 50


# The settings stage 1 (the target) depends on; --reuse-target compares only these.
TARGET_SETTINGS = ("seed", "threads", "seq_len", "target_batch", "target_steps", "prose_share", "target_lr", "warmup")
TARGET_SETTINGS += ("eval_windows", "log_every")

QUICK = Settings(
    seq_len=256,
    target_steps=20,
    rollout_batch=32,
    rollout_prompts=(64, 300),
    rollout_batches=0,
    passage_batches=2,
    rollout_len=24,
    drafter_steps=20,
    eval_windows=8,
    eval_rollouts=32,
    accept_prompts=4,
    accept_prompt_len=256,
    accept_gen=16,
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
    passage_batches=1,
    rollout_len=12,
    drafter_batch=8,
    drafter_steps=2,
    eval_windows=2,
    eval_rollouts=4,
    accept_prompts=2,
    accept_prompt_len=40,
    accept_gen=4,
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


def train_target(settings: Settings, texts: dict, held: dict, log) -> tuple[Transformer, list]:
    """Next-byte prediction on windows of both kinds (`prose_share` of them prose); `held` is
    {kind: held-out windows}, of which the curve evaluates the first 16 of each kind."""
    torch.manual_seed(settings.seed)
    target = Transformer(TARGET)
    opt = _optimizer(target, settings.target_lr)
    gen = torch.Generator().manual_seed(settings.seed + 1)
    curve = []
    t0 = time.perf_counter()
    for step in range(settings.target_steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, settings.target_steps, settings.target_lr, settings.warmup)
        batch = mixed_windows(texts, settings.prose_share, settings.target_batch, settings.seq_len + 1, gen)
        logits = target.head(target.forward_sequence(batch[:, :-1]))
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        _update(opt, loss, target)
        if (step + 1) % settings.log_every == 0 or step + 1 == settings.target_steps:
            point = {"step": step + 1, "loss": round(loss.item(), 4), "wall_s": round(time.perf_counter() - t0, 1)}
            if (step + 1) % (settings.log_every * 4) == 0 or step + 1 == settings.target_steps:
                point["heldout"] = {
                    kind: {k: round(v, 4) for k, v in evaluate_target(target, windows[:16]).items()}
                    for kind, windows in held.items()
                }
            curve.append(point)
            log(
                f"target step {step + 1}/{settings.target_steps} loss "
                f"{loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}"
            )
    target.eval()
    return target, curve


def _all_examples(roll: Sequences, limit: int):
    """A deterministic evaluation set: every root position of the first rollouts, up to `limit`."""
    rows = torch.arange(roll.tokens.shape[0]).repeat_interleave(len(roll.roots))
    roots = torch.tensor(list(roll.roots)).repeat(roll.tokens.shape[0])
    return rows[:limit], roots[:limit]


@torch.no_grad()
def evaluate_drafter(drafter: BlockDrafter, roll: Sequences, limit: int = 1 << 30) -> dict:
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


def train_drafter(settings: Settings, roll: Sequences, held: dict, log) -> tuple[BlockDrafter, list]:
    """Cross-entropy of each slot on random examples of `roll`; the curve evaluates `held`
    ({kind: held-out rollouts}) now and then."""
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
                point["heldout"] = {kind: evaluate_drafter(drafter, r, limit=1024) for kind, r in held.items()}
            curve.append(point)
            log(
                f"drafter step {step + 1}/{settings.drafter_steps} loss "
                f"{loss.item():.3f} ({point['wall_s']}s) {point.get('heldout', '')}"
            )
    drafter.eval()
    return drafter, curve


@torch.no_grad()
def accept_lengths(target: Transformer, drafter: BlockDrafter, kind: str, settings: Settings) -> dict:
    """What the engine commits per step at budget 32 on held-out prompts of `kind` (greedy):
    its mean over the prompts and each prompt's own."""
    from perfkit.engine.decode import Engine

    engine = Engine(target, drafter, device="cpu", dtype=torch.float32)
    prompts = data.sample_prompts(settings.accept_prompts, settings.accept_prompt_len, kind=kind)
    each = [
        engine.generate([p], max_new_tokens=settings.accept_gen, mode="spec", budget=32).mean_accept_length
        for p in prompts
    ]
    return {
        "budget": 32,
        "prompt_bytes": settings.accept_prompt_len,
        "generated": settings.accept_gen,
        "mean": round(sum(each) / len(each), 4),
        "per_prompt": [round(x, 4) for x in each],
    }


def _draw(settings: Settings, batches: int, kind: str | None = None) -> Draw:
    """How the drafter's sequences are drawn: `batches` of both kinds, or one held-out batch of `kind`."""
    return Draw(
        share=settings.drafter_prose_share if kind is None else float(kind == "prose"),
        batches=batches,
        batch=settings.rollout_batch if kind is None else settings.eval_rollouts,
        prompt_lengths=settings.rollout_prompts,
        length=settings.rollout_len,
        window=DRAFTER.window,
        block=DRAFTER.block,
    )


def _record_base(settings: Settings) -> dict:
    train_files, held_files = data.corpus_files()
    train_sections, held_sections = data.prose_sections()
    return {
        "settings": asdict(settings),
        "target_config": TARGET.to_dict(),
        "drafter_config": DRAFTER.to_dict(),
        "corpus": {
            "code": {
                "training_files": len(train_files),
                "training_bytes": len(data.training_text("code")),
                "heldout_files": [os.path.basename(f) for f in held_files],
                "heldout_bytes": len(data.heldout_text("code")),
            },
            "prose": {
                "training_sections": len(train_sections),
                "training_bytes": len(data.training_text("prose")),
                "heldout_sections": list(held_sections),
                "heldout_bytes": len(data.heldout_text("prose")),
            },
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": settings.threads},
    }


def _stage_one(settings: Settings, out: Path, texts: dict, held: dict, log) -> tuple[Transformer, dict]:
    """Train the target and write it (and a log of this stage) at once, before the drafter."""
    t0 = time.perf_counter()
    target, curve = train_target(settings, texts, held, log)
    heldout = {kind: evaluate_target(target, windows) for kind, windows in held.items()}
    log(f"target held-out: {heldout}")
    section = {
        "parameters": sum(p.numel() for p in target.parameters()),
        "curve": curve,
        "heldout": {kind: {k: round(v, 4) for k, v in m.items()} for kind, m in heldout.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    save_weights(out / "target.safetensors", target.state_dict(), config=TARGET.to_dict())
    write_json(out / "train_log.json", _record_base(settings) | {"target": section}, version=FORMAT_VERSION)
    return target, section


def _reuse_stage_one(settings: Settings, out: Path, log) -> tuple[Transformer, dict]:
    """The target a previous run of this script wrote to `out` with the same settings."""
    weights, config, _ = load_weights(out / "target.safetensors")
    previous = read_json(out / "train_log.json")
    if previous.get("format_version") != FORMAT_VERSION:
        raise UserError(f"--reuse-target: {out / 'train_log.json'} is of another format; train the target again")
    same = json.loads(json.dumps(_record_base(settings)))  # tuples become lists, as stored
    previous = {**previous, "settings": {k: previous["settings"].get(k) for k in TARGET_SETTINGS}}
    same["settings"] = {k: same["settings"][k] for k in TARGET_SETTINGS}
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
    texts = {kind: torch.frombuffer(bytearray(data.training_text(kind)), dtype=torch.uint8) for kind in data.KINDS}
    held_texts = {kind: torch.frombuffer(bytearray(data.heldout_text(kind)), dtype=torch.uint8) for kind in data.KINDS}
    held = {kind: evenly(t, settings.eval_windows, settings.seq_len + 1) for kind, t in held_texts.items()}
    if reuse_target:
        target, target_section = _reuse_stage_one(settings, out, log)
    else:
        target, target_section = _stage_one(settings, out, texts, held, log)

    t1 = time.perf_counter()
    roll = Sequences.joined(
        [
            collect(target, texts, _draw(settings, n), settings.seed + seed, real=real, log=log)
            for n, seed, real in ((settings.rollout_batches, 4, False), (settings.passage_batches, 6, True))
            if n
        ]
    )
    held_roll = {
        kind: collect(target, held_texts, _draw(settings, 1, kind), settings.seed + 5, real=False, log=log)
        for kind in data.KINDS
    }
    rollout_s = time.perf_counter() - t1

    t2 = time.perf_counter()
    drafter, drafter_curve = train_drafter(settings, roll, held_roll, log)
    drafter_s = time.perf_counter() - t2
    t3 = time.perf_counter()
    drafter_eval = {
        kind: evaluate_drafter(drafter, held_roll[kind])
        | {"accept_length": accept_lengths(target, drafter, kind, settings)}
        for kind in data.KINDS
    }
    eval_s = time.perf_counter() - t3
    log(f"drafter held-out: {drafter_eval}")

    save_weights(out / "drafter.safetensors", drafter.state_dict(), config=DRAFTER.to_dict(), extra={"recipe": RECIPE})
    record = _record_base(settings) | {
        "recipe": RECIPE,
        "target": target_section,
        "drafter": {
            "parameters": sum(p.numel() for p in drafter.parameters()),
            "sequences": {
                "rollouts": settings.rollout_batches * settings.rollout_batch,
                "passages": settings.passage_batches * settings.rollout_batch,
            },
            "examples": roll.tokens.shape[0] * len(roll.roots),
            "curve": drafter_curve,
            "heldout": drafter_eval,
            "wall_s": {
                "examples": round(rollout_s, 1),
                "training": round(drafter_s, 1),
                "evaluation": round(eval_s, 1),
            },
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
