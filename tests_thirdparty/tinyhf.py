"""A tiny Llama as a Hugging Face model folder, made here: the model vLLM serves in the tests.

    .venv-vllm/bin/python tests_thirdparty/tinyhf.py OUT_DIR

Nothing comes from a model hub. `transformers.LlamaConfig` (2 layers, hidden 128, 2 heads of 64: the
smallest head vLLM's CPU attention takes, intermediate 256) with seeded random weights, saved by
`save_pretrained` as safetensors, and tinymodel.py's tokenizer (a byte-level BPE of 512 tokens trained
on stdlib modules; BOS added to every prompt) beside it, so `AutoTokenizer.from_pretrained(OUT_DIR)`
and vLLM load the folder as they would a real model's. The output head's rows of BOS, EOS and every
token that is not printable ASCII are zero, as in tinymodel.py: greedy decoding emits printable
ASCII tokens only, one streamed chunk each, and never stops early. Written in a few seconds; the
same folder every time (the weights from a seeded torch generator, the vocabulary trained again).

Needs torch, transformers and tokenizers (.venv-vllm has them: `make thirdparty-vllm`), not perfkit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tinymodel
import torch
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN, HEADS, HEAD_DIM, LAYERS, INTERMEDIATE = 128, 2, 64, 2, 256
MAX_POSITIONS = 4096
SEED = 0


def config(n_vocab: int, bos: int, eos: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=n_vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def write(folder: str | Path) -> Path:
    """Write the model and its tokenizer into `folder` (made if missing); `folder`."""
    folder = Path(folder)
    tokens, _ = tinymodel.vocabulary()
    bos, eos = (tokens.index(t) for t in tinymodel.SPECIAL)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config(len(tokens), bos, eos)).to(torch.float32)
    byte_of = tinymodel.byte_of_symbol()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(SEED)
        for name, weight in sorted(model.named_parameters()):  # one order, whatever the init did
            if name.endswith("norm.weight"):
                weight.fill_(1.0)
            else:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.02)
        never = [i for i, t in enumerate(tokens) if not tinymodel.printable(t, byte_of)]
        model.lm_head.weight[never] = 0.0  # never the greedy choice: their logit is 0, the maximum's is positive
    model.generation_config.do_sample = False
    model.save_pretrained(folder, safe_serialization=True)
    tinymodel.write_tokenizer(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", metavar="OUT_DIR", help="the model folder to write")
    print(write(parser.parse_args(argv).out))


if __name__ == "__main__":
    main()
