"""A tiny Llama in GGUF, made here: random weights (seeded) and a byte-level BPE vocabulary trained here.

    .venv-thirdparty/bin/python tests_thirdparty/tinymodel.py OUT.gguf [--tokenizer DIR]

`--tokenizer DIR` also writes the same vocabulary as a Hugging Face tokenizer folder (tokenizer.json,
tokenizer_config.json: `AutoTokenizer.from_pretrained(DIR)` loads it), for a client that counts
tokens itself (AIPerf) and for tinyhf.py's model, which shares it.

Nothing comes from a model hub. The vocabulary is a GPT-2-style byte-level BPE (`tokenizer.ggml.model`
"gpt2", pre-tokenizer "gpt-2": the 256 byte symbols, BOS and EOS, and the merges `tokenizers` learns
from a few Python standard library modules, text every machine with Python has), so a prompt of N
ASCII bytes is fewer than N tokens: a server that is not byte-vocabulary, as real ones are. BOS is
added to every prompt, as Llama's vocabulary does.

The weights are seeded normals, except that the output head's rows of BOS, EOS and every token whose
bytes are not printable ASCII (or a newline or tab) are zero: their logit is always 0 while the
others' maximum is positive, so greedy decoding only ever emits printable ASCII tokens and never
an incomplete UTF-8 sequence a server would hold back. Each generated token is then one streamed
chunk, which the tests check. Written in about a second; the same Python writes the same bytes.

Needs gguf and tokenizers (in .venv-thirdparty, `make thirdparty`), not perfkit; the vocabulary and the
tokenizer folder need tokenizers and numpy alone (gguf is imported by `write`), so tinyhf.py uses them too.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# the corpus: small standard library modules whose text seldom changes between Python versions
CORPUS = ("bisect.py", "colorsys.py", "fnmatch.py", "glob.py", "heapq.py", "shlex.py", "string.py", "textwrap.py")
VOCAB = 512  # 2 special tokens, 256 byte symbols, 254 merges
SPECIAL = ("<s>", "</s>")  # BOS, EOS
N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 128, 2, 2, 256, 4096  # head_dim 64
SEED = 0
# a chat as plain text: each message on its own line after its role, then the assistant's turn
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def byte_of_symbol() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted: the byte each of the 256 byte-level symbols stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def trained() -> Tokenizer:
    """A byte-level BPE trained on CORPUS (GPT-2's pre-tokenizer: its regex, no prefix space), BOS and EOS
    its first two tokens; the same Python and tokenizers train the same one."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / name) for name in CORPUS]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(files, trainer)
    return tokenizer


def vocabulary() -> tuple[list[str], list[str]]:
    """(tokens in id order, merges as "left right") of the trained byte-level BPE."""
    tokenizer = trained()
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    assert [i for _, i in by_id] == list(range(len(tokens)))
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return tokens, [m if isinstance(m, str) else " ".join(m) for m in merges]


def write_tokenizer(folder: str | Path) -> Path:
    """The vocabulary as a Hugging Face tokenizer folder (`folder`, made if missing): tokenizer.json (the
    trained BPE, its merges and byte-level pre-tokenizer and decoder, BOS added to every text as the
    GGUF says) and tokenizer_config.json (a fast tokenizer, its BOS and EOS, a plain chat template).
    The same ids as llama-server's /tokenize of the GGUF; `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = trained()
    bos, eos = SPECIAL
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": N_CTX,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": bos, "eos_token": eos}, indent=2) + "\n", encoding="utf-8"
    )
    return folder


def printable(token: str, byte_of: dict[str, int]) -> bool:
    if token in SPECIAL:
        return False
    data = bytes(byte_of[c] for c in token)
    return all(32 <= b < 127 or b in (9, 10) for b in data)


def write(path: str | Path) -> int:
    """Write the model to `path`; its vocabulary size."""
    import gguf  # in .venv-thirdparty only; the vocabulary and write_tokenizer do without it

    tokens, merges = vocabulary()
    byte_of = byte_of_symbol()
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("perfkit-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(SPECIAL[0]))
    writer.add_eos_token_id(tokens.index(SPECIAL[1]))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    # numpy shapes are (out, in): GGUF stores them reversed, as llama.cpp's {in, out}
    writer.add_tensor("token_embd.weight", normal(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", normal(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", normal(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", normal(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", normal(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    head = normal(n_vocab, N_EMBD)
    head[[i for i, t in enumerate(tokens) if not printable(t, byte_of)]] = 0.0  # never the greedy choice
    writer.add_tensor("output.weight", head)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return n_vocab


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", metavar="OUT.gguf", help="the model file to write")
    parser.add_argument("--tokenizer", metavar="DIR", help="also write the Hugging Face tokenizer folder DIR")
    args = parser.parse_args(argv)
    print(write(args.out))
    if args.tokenizer:
        print(write_tokenizer(args.tokenizer))


if __name__ == "__main__":
    main()
