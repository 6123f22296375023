"""Does an established serving benchmark client agree with perfkit.serving? NVIDIA's AIPerf, side by side.

    make bench-clients            (or: python tests_thirdparty/client_agreement.py [--requests N] [--rounds R])

For each server (the bundled `perfkit engine serve`; llama.cpp's llama-server with the tests' tiny
model when PERFKIT_LLAMA_SERVER names the binary), one workload (256-token prompts cut from the same
text, 32 output tokens with `ignore_eos`, concurrency 1 and 4, `--requests` requests after one warm-up)
is measured by perfkit.serving and by `aiperf profile` in alternation (A B A B ...: drift hits both
alike), on one server process. The servers run on the first CPU (one thread), the clients on the
others: AIPerf is several processes, and on shared CPUs its own work would slow the server it times.
AIPerf reads prompts made as perfkit.serving makes them (`--input-file`, single_turn) and counts
tokens with the server's own tokenizer folder and the server's usage (`--use-server-token-count`).

Compared, each as both tools define it (AIPerf's metrics reference, v0.13):
- TTFT: request start to the first response that carries content: AIPerf's `time_to_first_token`,
  perfkit's `ttft` (the first text chunk; a role-only or empty chunk is never the first token).
- ITL: per token: AIPerf's `inter_token_latency` is (request latency - TTFT) / (output tokens - 1)
  per request, averaged over requests; perfkit's is `tpot`, the same quotient (its `itl` spreads each
  chunk's gap over that chunk's tokens: the same mean per request). A gap per *chunk* (perfkit's
  `itl_chunk`, AIPerf's `inter_chunk_latency`) is shown beside it where a step sends several tokens.
- output tok/s: all requests' output tokens over the benchmark's wall time (AIPerf's
  `output_token_throughput`; perfkit's Summary.output_throughput).
The table prints each figure as the mean over rounds with the rounds' spread, and the difference
between the tools; a difference over 10% is explained by the definitions or is a disagreement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perfkit.engine import data
from perfkit.engine.tokenizer import TOKENIZER_DIR
from perfkit.probe import serving

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AIPERF = Path(os.environ.get("PERFKIT_AIPERF", ROOT / ".venv-aiperf" / "bin" / "aiperf"))
CONTEXT, GEN = 256, 32
FIGURES = ("ttft_ms", "itl_ms", "output_tok_s")
AGREE = 0.10


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    model: str
    tokenizer: Path  # the server's Hugging Face tokenizer folder (AIPerf counts and makes prompts with it)
    text: str  # what prompts are cut from


def _prompts(n: int, seed: int, text: str) -> list[str]:
    return serving.make_prompts(n, CONTEXT, seed=seed, text=text, tag=f"s{seed}-")


def perfkit_side(t: Target, concurrency: int, requests: int, seed: int) -> dict[str, float]:
    results = serving.run(
        t.url, context=CONTEXT, gen=GEN, concurrency=concurrency, requests=requests, warmup=1, seed=seed, text=t.text
    )
    s = serving.summary(results)
    if s.failed:
        raise RuntimeError(f"perfkit.serving against {t.name}: {s}")
    ok = [r for r in results if r.ok]
    chunk_gaps = [g for r in ok for g in r.itl_chunk]
    return {
        "ttft_ms": 1e3 * statistics.fmean(r.ttft for r in ok),
        "itl_ms": 1e3 * statistics.fmean(r.tpot for r in ok),
        "itl_chunk_ms": 1e3 * statistics.fmean(chunk_gaps) if chunk_gaps else float("nan"),
        "output_tok_s": s.output_throughput,
    }


def aiperf_export(t: Target, concurrency: int, requests: int, seed: int, work: Path) -> dict:
    """`aiperf profile` of the workload against `t`: its profile_export_aiperf.json, parsed."""
    prompts = _prompts(requests + 1, seed, t.text)
    dataset = work / f"prompts-{seed}.jsonl"
    dataset.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts[1:]), encoding="utf-8")
    out = work / f"aiperf-{seed}"
    argv = [str(AIPERF), "profile", "-m", t.model, "--url", t.url, "--endpoint-type", "completions", "--streaming"]
    argv += ["--tokenizer", str(t.tokenizer), "--input-file", str(dataset), "--custom-dataset-type", "single_turn"]
    argv += ["--osl", str(GEN), "--concurrency", str(concurrency), "--request-count", str(requests)]
    argv += ["--warmup-request-count", "1", "--extra-inputs", "ignore_eos:true", "--use-server-token-count"]
    argv += ["--random-seed", str(seed), "--artifact-dir", str(out), "--ui", "none"]
    argv += ["--no-server-metrics"]  # its polling of /metrics would be load perfkit.serving's requests do not see
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    export = out / "profile_export_aiperf.json"
    if done.returncode != 0 or not export.exists():
        raise RuntimeError(
            f"aiperf against {t.name} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    got = json.loads(export.read_text())
    if got["request_count"]["avg"] != requests or got.get("error_summary"):
        raise RuntimeError(
            f"aiperf against {t.name}: {got['request_count']} requests, errors {got.get('error_summary')}"
        )
    return got


def aiperf_side(t: Target, concurrency: int, requests: int, seed: int, work: Path) -> dict[str, float]:
    got = aiperf_export(t, concurrency, requests, seed, work)
    return {
        "ttft_ms": got["time_to_first_token"]["avg"],
        "itl_ms": got["inter_token_latency"]["avg"],
        "itl_chunk_ms": got.get("inter_chunk_latency", {}).get("avg", float("nan")),
        "output_tok_s": got["output_token_throughput"]["avg"],
    }


def compare(t: Target, concurrency: int, requests: int, rounds: int, work: Path) -> dict[str, dict[str, list[float]]]:
    got: dict[str, dict[str, list[float]]] = {"perfkit": {}, "aiperf": {}}
    for r in range(rounds):
        order = ("perfkit", "aiperf") if r % 2 == 0 else ("aiperf", "perfkit")
        for tool in order:
            seed = 100 * concurrency + r
            one = (
                perfkit_side(t, concurrency, requests, seed)
                if tool == "perfkit"
                else aiperf_side(t, concurrency, requests, seed, work)
            )
            for k, v in one.items():
                got[tool].setdefault(k, []).append(v)
            print(
                f"  {t.name} c{concurrency} round {r} {tool}: " + ", ".join(f"{k} {v:.4g}" for k, v in one.items()),
                flush=True,
            )
    return got


def _cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    spread = f" ±{100 * statistics.stdev(values) / mean:.0f}%" if len(values) > 1 and mean else ""
    return f"{mean:.3g}{spread}"


def table(rows: list[tuple[str, int, dict]]) -> str:
    lines = [
        "| server | concurrency | figure | perfkit.serving | AIPerf | difference |",
        "|---|---|---|---|---|---|",
    ]
    for name, c, got in rows:
        for f in FIGURES:
            p, a = got["perfkit"][f], got["aiperf"][f]
            diff = statistics.fmean(a) / statistics.fmean(p) - 1
            flag = "" if abs(diff) <= AGREE else " **over 10%**"
            lines.append(f"| {name} | {c} | {f} | {_cell(p)} | {_cell(a)} | {100 * diff:+.1f}%{flag} |")
        pc, ac = statistics.fmean(got["perfkit"]["itl_chunk_ms"]), statistics.fmean(got["aiperf"]["itl_chunk_ms"])
        lines.append(f"| {name} | {c} | itl per chunk | {pc:.3g} | {ac:.3g} | {100 * (ac / pc - 1):+.1f}% |")
    return "\n".join(lines)


@contextlib.contextmanager
def targets() -> Iterator[list[Target]]:
    """The servers, each on the first CPU with one thread; this process and the clients it starts then move
    to the other CPUs, so a client's own work (AIPerf runs several processes) never slows the server.

    Always the bundled `perfkit engine serve`; llama.cpp's llama-server on tinymodel.py's GGUF when
    PERFKIT_LLAMA_SERVER names the binary and PERFKIT_THIRDPARTY_PYTHON a python with gguf (tinymodel.py
    runs there, writing the GGUF and its Hugging Face tokenizer folder); vLLM on tinyhf.py's model folder
    (its tokenizer: the same vocabulary) when .venv-vllm (or PERFKIT_VLLM_PYTHON) has vLLM. `make
    test-thirdparty` sets all three."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("the comparison needs two CPUs: one for the servers, one for the clients")
    sys.path.insert(0, str(HERE))
    import llamaserver
    import vllmserver

    def executable(value: str | None) -> bool:
        return bool(value) and os.access(str(value), os.X_OK)

    with contextlib.ExitStack() as stack:
        stack.callback(os.sched_setaffinity, 0, cpus)  # this process gets its CPUs back at the end
        os.sched_setaffinity(0, cpus[:1])  # what starts now inherits it: the servers
        options = serving.EngineOptions(tp=1, preset="shipped", threads=1)
        srv = stack.enter_context(serving.server("", options))
        text = data.heldout_text().decode("ascii", "replace")
        found = [
            Target("perfkit engine serve (tp 1, 1 thread, shipped)", srv.url, "perfkit-shipped", TOKENIZER_DIR, text)
        ]
        binary, made_with = os.environ.get("PERFKIT_LLAMA_SERVER"), os.environ.get("PERFKIT_THIRDPARTY_PYTHON")
        if executable(binary) and executable(made_with):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perfkit-tiny-llama-")))
            model, tokenizer = folder / "tiny.gguf", folder / "tokenizer"
            command = [str(made_with), str(HERE / "tinymodel.py"), str(model), "--tokenizer", str(tokenizer)]
            subprocess.run(command, check=True, capture_output=True, timeout=300)
            llama = stack.enter_context(llamaserver.llama_server(model, "-np", "4"))  # a slot per request at c 4
            found.append(
                Target("llama.cpp llama-server (tiny Llama)", llama.url, llamaserver.MODEL_NAME, tokenizer, text)
            )
        vllm_python = os.environ.get("PERFKIT_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
        if executable(vllm_python):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perfkit-tiny-hf-")))
            model = vllmserver.write_model(folder / "tiny-hf", Path(vllm_python))
            # one OpenMP thread bound to the servers' CPU; its API server and engine core inherit the affinity
            vllm = stack.enter_context(vllmserver.vllm_server(model, cpu=cpus[0], vllm_python=Path(vllm_python)))
            found.append(Target("vLLM, CPU (tiny Hugging Face Llama)", vllm.url, vllmserver.MODEL_NAME, model, text))
        os.sched_setaffinity(0, cpus[1:])  # the clients: this process and what it starts from now on
        yield found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="measured requests per round and tool")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, alternating which tool goes first")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args(argv)
    if not AIPERF.exists():
        print(f"no aiperf at {AIPERF}: `make bench-clients` installs it into .venv-aiperf/", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="perfkit-clients-"))
    rows = []
    try:
        with targets() as found:
            for t in found:
                for c in args.concurrency:
                    rows.append((t.name, c, compare(t, c, args.requests, args.rounds, work)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
