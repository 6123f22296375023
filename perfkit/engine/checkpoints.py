"""Weights on disk without pickle: the safetensors layout, written and read with the stdlib.

A file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape and
byte range; `__metadata__` with string values) and the raw little-endian tensor bytes. Any
safetensors reader can open these files; loading one can never execute code. The metadata carries
`format`/`version` (this module's layout version) and `config` (the model's sizes, JSON).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import torch

from perfkit.engineoptions import PRESETS
from perfkit.errors import UserError
from perfkit.files import write_atomic

__all__ = ["CHECKPOINT_DIR", "FORMAT", "VERSION", "save_weights", "load_weights"]

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
FORMAT = "perfkit-weights"
VERSION = 1

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
_NAMES = {v: k for k, v in _DTYPES.items()}


def save_weights(
    path: str | Path, tensors: dict[str, torch.Tensor], *, config: dict, extra: dict | None = None
) -> None:
    """Write `tensors` and their model `config` atomically (temporary file, then rename)."""
    if sys.byteorder != "little":
        raise UserError("writing weights needs a little-endian machine")
    header: dict = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise UserError(f"cannot store {name} of dtype {t.dtype}")
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    meta = {"format": FORMAT, "version": str(VERSION), "config": json.dumps(config, sort_keys=True)}
    if extra:
        meta.update({k: json.dumps(v, sort_keys=True) for k, v in extra.items()})
    header["__metadata__"] = meta
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # align the data to 8 bytes
    write_atomic(Path(path), b"".join([struct.pack("<Q", len(head)), head, *blobs]))


def load_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """(tensors, config, extra metadata) from a file written by `save_weights`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file not found: {path}")
    data = path.read_bytes()
    if len(data) < 8:
        raise UserError(f"{path}: not a weights file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as exc:
        raise UserError(f"{path}: unreadable weights header ({exc})") from exc
    meta = header.pop("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise UserError(f"{path}: not a perfkit weights file (format {meta.get('format')!r})")
    if int(meta.get("version", 0)) > VERSION:
        raise UserError(f"{path}: weights format version {meta['version']} is newer than this perfkit ({VERSION})")
    body = memoryview(data)[8 + n :]
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = _NAMES[info["dtype"]]
        flat = torch.frombuffer(bytearray(body[start:end]), dtype=dtype) if end > start else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    config = json.loads(meta["config"])
    extra = {k: json.loads(v) for k, v in meta.items() if k not in ("format", "version", "config")}
    return tensors, config, extra


# --- presets ---------------------------------------------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # engineoptions.DTYPES, each its torch dtype


def _random_configs(preset: str):
    from perfkit.engine.drafter import DrafterConfig
    from perfkit.engine.model import ModelConfig

    if preset == "tiny-random":
        target = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128)
    else:  # moe-random: 8 experts, 2 per token
        target = ModelConfig(
            d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256, n_experts=8, top_k=2
        )
    drafter = DrafterConfig(target_d_model=target.d_model, d_model=64, n_layers=1, n_heads=4, d_ff=128, block=6)
    return target, drafter


def load_engine(preset: str = "shipped", *, device="cpu", dtype: str = "fp32", seed: int = 0):
    """An Engine: "shipped" (the trained weights in checkpoints/), "tiny-random" (fast tests) or
    "moe-random" (MoE target); random presets are initialised from `seed`."""
    from perfkit.engine.decode import Engine
    from perfkit.engine.drafter import BlockDrafter, DrafterConfig
    from perfkit.engine.model import ModelConfig, Transformer

    if preset not in PRESETS:
        raise UserError(f"unknown engine preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but torch has no CUDA device here")
    if preset == "shipped":
        t_weights, t_config, _ = load_weights(CHECKPOINT_DIR / "target.safetensors")
        d_weights, d_config, _ = load_weights(CHECKPOINT_DIR / "drafter.safetensors")
        target = Transformer(ModelConfig.from_dict(t_config))
        drafter = BlockDrafter(DrafterConfig.from_dict(d_config))
        target.load_state_dict(t_weights)
        drafter.load_state_dict(d_weights)
    else:
        t_config, d_config = _random_configs(preset)
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        target = Transformer(t_config)
        drafter = BlockDrafter(d_config)
        torch.random.set_rng_state(gen_state)
    target.to(device=device, dtype=DTYPES[dtype])
    drafter.to(device=device, dtype=DTYPES[dtype])
    return Engine(target, drafter, device=device, dtype=DTYPES[dtype], preset=preset)
