"""Around the engine: the text corpus, the weights format, the training script and the CLI."""

import json
import os

import pytest
import torch

from perfkit.engine import checkpoints, data
from perfkit.engine.benchmarks import bench
from perfkit.engine.cli import main
from perfkit.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_corpus_split_is_disjoint_and_deterministic():
    train, held = data.corpus_files()
    assert train and held
    assert not set(train) & set(held)
    assert (train, held) == data.corpus_files()
    assert all(p.endswith(".py") for p in train + held)
    assert data.heldout_text() == data.heldout_text("code") and data.training_text() == data.training_text("code")
    for kind in data.KINDS:
        assert data.heldout_text(kind) not in data.training_text(kind)
        assert len(data.training_text(kind)) > 4 * len(data.heldout_text(kind)) > 4 * 40_000
    # prose: sections split by title, so a section that several topics repeat is on one side only
    train_sections, held_sections = data.prose_sections()
    assert train_sections and held_sections and not set(train_sections) & set(held_sections)
    prose = data.training_text("prose")
    assert not any(text.encode() in prose for text in held_sections.values())
    assert data.heldout_text("prose").count(b" the ") > 10 * data.heldout_text("prose").count(b"self.")


def test_encode_decode_and_prompts():
    assert data.encode("é\n") == [0xC3, 0xA9, 10]
    assert data.decode(data.encode("def f():\n    pass")) == "def f():\n    pass"
    assert data.decode([0xC3]) == "\ufffd"  # cut mid-character: replaced, not raised
    prompts = data.sample_prompts(3, 40)
    assert prompts == data.sample_prompts(3, 40)
    assert all(len(p) == 40 for p in prompts)
    assert all(bytes(p) in data.heldout_text() for p in prompts)
    for kind in data.KINDS:
        one, other = data.sample_prompts(4, 1024, kind=kind), data.sample_prompts(4, 1024, kind=kind, seed=4)
        assert all(bytes(p) in data.heldout_text(kind) for p in one + other)
        assert not {bytes(p) for p in one} & {bytes(p) for p in other}  # a replicate's own prompts (seed + 4 r)
    with pytest.raises(UserError):
        data.sample_prompts(1, 10, source=b"short")
    with pytest.raises(UserError, match="kind"):
        data.heldout_text("poetry")


def test_weights_roundtrip_without_pickle(tmp_path):
    tensors = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5).bfloat16(),
        "c": torch.arange(6).view(2, 3),
        "e": torch.zeros(0),
    }
    path = tmp_path / "w.safetensors"
    checkpoints.save_weights(path, tensors, config={"d_model": 4}, extra={"note": [1, 2]})
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    assert header["a"] == {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}
    got, config, extra = checkpoints.load_weights(path)
    assert config == {"d_model": 4} and extra == {"note": [1, 2]}
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
    with pytest.raises(UserError):
        checkpoints.load_weights(path)
    with pytest.raises(UserError):
        checkpoints.load_weights(tmp_path / "missing.safetensors")


def test_shipped_weights_are_small_and_documented():
    files = [checkpoints.CHECKPOINT_DIR / n for n in ("target.safetensors", "drafter.safetensors")]
    assert sum(os.path.getsize(f) for f in files) <= 20 * 2**20
    log = json.loads((checkpoints.CHECKPOINT_DIR / "train_log.json").read_text())
    from perfkit.engine.training import train

    assert log["format_version"] == train.FORMAT_VERSION and log["recipe"] == train.RECIPE
    assert checkpoints.load_weights(files[1])[2] == {"recipe": train.RECIPE}
    block = log["drafter_config"]["block"]
    for kind in data.KINDS:
        assert 0 < log["target"]["heldout"][kind]["accuracy"] < 1
        held = log["drafter"]["heldout"][kind]
        assert len(held["slot_accuracy"]) == block
        # a drafter that drafts like a real one: on held-out text of either kind, the engine's
        # tokens per step at budget 32 spread over prompts and stay well below the tree's depth
        accept = held["accept_length"]
        assert len(set(accept["per_prompt"])) > 1
        assert 2 < accept["mean"] < block - 0.5
    prose, code = (log["drafter"]["heldout"][k]["accept_length"]["mean"] for k in ("prose", "code"))
    assert prose < 6.6  # the published range on chat text (MT-Bench: EAGLE ~3.6-4, DFlash + DDTree 6.6)
    engine = checkpoints.load_engine("shipped")
    assert engine.target_config.to_dict() == log["target_config"]
    assert engine.drafter_config.to_dict() == log["drafter_config"]


def test_training_is_deterministic(tmp_path):
    from perfkit.engine.training import train

    a, b = tmp_path / "a", tmp_path / "b"
    quiet = lambda line: None  # noqa: E731
    rec = train.train(train.TINY, out_dir=a, log=quiet)
    train.train(train.TINY, out_dir=b, log=quiet)
    assert json.loads((a / "train_log.json").read_text())["format_version"] == train.FORMAT_VERSION
    for name in ("target.safetensors", "drafter.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert rec["target"]["curve"] and rec["drafter"]["curve"]
    # The drafter stage alone, on the stored target, gives the same drafter again.
    (b / "drafter.safetensors").unlink()
    train.train(train.TINY, out_dir=b, log=quiet, reuse_target=True)
    assert (a / "drafter.safetensors").read_bytes() == (b / "drafter.safetensors").read_bytes()


def test_cli_bench_json(capsys):
    rc = main(
        ["bench", "--ctx", "300", "--gen", "6", "--batch", "2", "--budget", "8", "--preset", "tiny-random", "--json"]
    )
    assert rc == 0
    record = json.loads(capsys.readouterr().out)
    assert record["format_version"] == bench.FORMAT_VERSION
    r = record["result"]
    assert r["prompt_tok"] == 600 and r["gen_tok"] == 12 and r["fill"] == "prefill"
    assert set(record["phases"]) >= {"step", "draft", "verify_forward", "unattributed"}


def test_cli_bench_table_labels_the_approximate_fill(capsys):
    rc = main(["bench", "--ctx", "5000", "--gen", "4", "--preset", "tiny-random", "--mode", "ar"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "fill=approx" in out and "APPROXIMATE" in out
    assert "ctx_req prompt_tok   TTFT_s prefill_tok/s decode_tok/s gen_tok decode_wall accept_len" in out
    assert "verify_forward" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--ctx", "10"],
        ["bench", "--ctx", "0", "--gen", "1"],
        ["bench", "--ctx", "5", "--gen", "1", "--mode", "x"],
        ["nope"],
    ],
)
def test_cli_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_benchmark_table_shows_every_figure():
    from perfkit.engine.benchmarks.headline import format_benchmarks

    record = {
        "quick": True,
        "device": "cpu",
        "threads": 1,
        "spec_vs_ar": {
            "budget": 32,
            "heldout_prompts": 4,
            "heldout_gen": 64,
            "heldout_accept_len": 2.61,
            "heldout_accept_len_code": 3.4,
            "ctx": 1024,
            "heldout_accept_len_sampled": [{"temperature": 1.0, "accept_len": 1.9}],
            "ar_decode_tok_s": 500.0,
            "sweep": [{"budget": 8, "spec_decode_tok_s": 600.0, "accept_len": 2.2, "speedup": 1.2}],
            "best": {"budget": 8, "spec_decode_tok_s": 600.0, "accept_len": 2.2, "speedup": 1.2},
        },
        "tree_build": [
            {
                "batch": 128,
                "budget": 64,
                "pairs": 12,
                "heap_ms": 8.0,
                "vectorized_ms": 2.0,
                "speedup": 4.0,
                "speedup_low": 3.5,
                "speedup_high": 4.4,
                "same_trees": True,
            }
        ],
        "verify_mask": [{"batch": 8, "ctx": 32768, "nodes": 32, "naive_ms": 6.0, "compact_ms": 0.08, "speedup": 75.0}],
    }
    text = format_benchmarks(record)
    said = "accept length on held-out prose (4 prompts x 64 tokens): 2.61; sampled at temperature 1: 1.90"
    assert said + "; greedy on held-out code: 3.40" in text
    assert "spec budget   8:   600.0 tok/s  accept 2.20  spec/AR 1.20x" in text
    assert "12 alternating pairs" in text
    assert "128     64     8.000     2.000       4.00x [3.50, 4.40] True" in text
    assert "8  32768     6.000     0.0800    75.0x" in text


def test_tree_build_benchmark_runs_alone_and_checks_every_tree(capsys):
    assert main(["benchmarks", "--quick", "--only", "tree", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record) == {"format_version", "quick", "device", "threads", "tree_build"}
    rows = record["tree_build"]
    assert [(r["batch"], r["budget"]) for r in rows] == [(b, n) for n in (16, 64, 256) for b in (1, 8, 32, 128)]
    for r in rows:
        assert r["same_trees"] is True
        assert r["speedup_low"] <= r["speedup"] <= r["speedup_high"]
        # timings themselves are not asserted (the suite shares a noisy machine; figures belong in the
        # benchmark's own output): only that every figure is a positive duration or ratio
        assert r["heap_ms"] > 0 and r["vectorized_ms"] > 0 and r["speedup_low"] > 0
