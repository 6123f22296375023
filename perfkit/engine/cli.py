"""`perfkit engine bench|benchmarks|serve|train`: the engine's command line.

The top-level `perfkit` command hands `perfkit engine <rest>` to `main`; it also runs
as `python -m perfkit.engine.cli <rest>`. Exit status: 0 success, 2 a usage or user error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from perfkit.errors import UserError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors are user errors: exit 2 without a traceback
        raise UserError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    """Every choice comes from the constant that defines it, so a new builder or preset shows up here.
    Nothing here imports torch: `serve` starts its ranks (which import it, in parallel) first."""
    from perfkit.engine.benchmarks.headline import SECTIONS
    from perfkit.engineoptions import DEVICES, DTYPES, FILLS, MASKS, MODES, PRESETS, TREES

    top = _Parser(prog="perfkit engine", description="The bundled speculative-decoding engine.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("bench", help="one context-decode measurement: table row and phase breakdown")
    b.add_argument("--ctx", type=int, required=True, help="cached prefix tokens per request")
    b.add_argument("--gen", type=int, required=True, help="tokens to generate per request")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--budget", type=int, default=32, help="draft tree nodes per step")
    b.add_argument("--mode", choices=MODES, default="spec")
    b.add_argument("--mask", choices=MASKS, default="compact")
    b.add_argument("--tree", choices=TREES, default="vectorized")
    b.add_argument("--device", choices=DEVICES, default="cpu")
    b.add_argument("--dtype", choices=DTYPES, default="fp32")
    b.add_argument("--preset", choices=PRESETS, default="shipped")
    b.add_argument(
        "--fill",
        choices=("auto", *FILLS),
        default="auto",
        help="how the cache is filled; auto = approx from 4096 tokens of context (labelled in the output)",
    )
    b.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; above: seeded sampling")
    b.add_argument(
        "--seed", type=int, default=0, help="sampling seed (the same seed gives the same tokens in spec and AR)"
    )
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    b.add_argument("--json", action="store_true", help="print the record as JSON instead of the table")

    m = sub.add_parser("benchmarks", help="spec vs AR, tree build and mask build figures, side by side")
    m.add_argument("--quick", action="store_true", help="fewer repeats and prompts")
    m.add_argument("--device", choices=DEVICES, default="cpu")
    m.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    m.add_argument(
        "--only", action="append", choices=tuple(SECTIONS), help="just these sections (repeatable; default: all)"
    )
    m.add_argument("--json", action="store_true")

    _serve_parser(sub)

    sub.add_parser(
        "train", help="train the shipped target and drafter (deterministic); see `train --help`", add_help=False
    )
    return top


def _serve_parser(sub) -> None:
    from perfkit.engineoptions import EngineOptions

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over tensor-parallel rank processes")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    EngineOptions.add_arguments(s)  # what every rank loads and decodes with, declared once
    s.add_argument(
        "--chunk", choices=("step", "token"), default="step", help="a streamed chunk per decode step or per token"
    )
    s.add_argument("--max-batch", type=int, default=8, help="most requests decoded in one batch")
    s.add_argument(
        "--batch-wait-ms", type=float, default=5.0, help="how long a batch waits for more requests to join it"
    )


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise UserError(f"--{name} must be >= 1, got {value}")


def main(argv: list[str]) -> int:
    if importlib.util.find_spec("torch") is None:  # every engine command runs on it (serve's ranks too): say so first
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    try:
        if argv[:1] == ["train"]:  # its options belong to perfkit.engine.training.train
            from perfkit.engine.training import train

            try:
                return train.main(argv[1:])
            except SystemExit as exc:  # its own --help or usage error
                return int(exc.code or 0)
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        if args.command in ("bench", "benchmarks") and args.threads is not None:  # serve's are each rank's
            import torch

            _positive("threads", args.threads)
            torch.set_num_threads(args.threads)
        if args.command == "bench":
            from perfkit.engine.benchmarks.bench import BenchConfig, format_bench, run_bench

            for name in ("ctx", "gen", "batch", "budget"):
                _positive(name, getattr(args, name))
            cfg = BenchConfig(
                ctx=args.ctx,
                gen=args.gen,
                batch=args.batch,
                budget=args.budget,
                mode=args.mode,
                mask=args.mask,
                tree=args.tree,
                device=args.device,
                dtype=args.dtype,
                preset=args.preset,
                fill=args.fill,
                temperature=args.temperature,
                seed=args.seed,
            )
            record = run_bench(cfg)
            print(json.dumps(record, indent=1, sort_keys=True) if args.json else format_bench(record))
            return 0
        if args.command == "benchmarks":
            from perfkit.engine.benchmarks.headline import SECTIONS, format_benchmarks, run_benchmarks

            record = run_benchmarks(quick=args.quick, device=args.device, only=tuple(args.only or SECTIONS))
            print(json.dumps(record, indent=1, sort_keys=True) if args.json else format_benchmarks(record))
            return 0
        if args.command == "serve":
            from perfkit.engine.serve.app import serve

            _positive("max-batch", args.max_batch)
            if args.port < 0 or not args.batch_wait_ms >= 0:
                raise UserError("--port and --batch-wait-ms must be >= 0")

            return serve(args)
        raise AssertionError(f"unhandled command {args.command}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
