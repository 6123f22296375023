"""The engine's byte vocabulary as a Hugging Face tokenizer folder, for clients that count tokens themselves.

A serving benchmark client (AIPerf, guidellm, `vllm bench serve`) loads the served model's tokenizer
to make prompts of an exact token count and to count the tokens it receives. The bundled engine's
token ids are the 256 byte values (perfkit.engine.data), so its tokenizer is byte-level BPE with no
merges: each byte is one token whose id is the byte's value, the bytes shown as printable characters
as GPT-2's byte-level tokenizers show them. No special tokens: the engine has none.

    python -m perfkit.engine.tokenizer DIR        (needs `tokenizers`; the shipped copy is TOKENIZER_DIR)

The folder holds `tokenizer.json` and `tokenizer_config.json`, what `AutoTokenizer.from_pretrained(DIR)`
reads; the same code writes the same bytes, and tests/test_engine_tokenizer.py checks the shipped copy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfkit.engine import data
from perfkit.errors import UserError
from perfkit.files import write_atomic

__all__ = ["TOKENIZER_DIR", "byte_characters", "write"]

TOKENIZER_DIR = Path(__file__).resolve().parent / "checkpoints" / "tokenizer"  # shipped with the weights


def byte_characters() -> list[str]:
    """The printable character standing for each byte value, in byte order: printable Latin-1 bytes stand
    for themselves; the others (controls, space, ...) take the code points from 256 on, in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, spare = [], 256
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(spare))
            spare += 1
    return out


def _tokenizer_json() -> str:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise UserError("writing the engine's tokenizer needs `tokenizers`: pip install tokenizers") from None
    vocab = {ch: b for b, ch in enumerate(byte_characters())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return json.dumps(json.loads(tokenizer.to_str()), indent=1, sort_keys=True) + "\n"


def _config() -> str:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,  # the shipped target's max_seq_len
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def write(folder: Path) -> Path:
    """Write the tokenizer folder (atomically, file by file); returns it."""
    if data.VOCAB_SIZE != 256:
        raise UserError(f"the engine's vocabulary has {data.VOCAB_SIZE} ids, not the 256 bytes this tokenizer is")
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "tokenizer.json", _tokenizer_json())
    write_atomic(folder / "tokenizer_config.json", _config())
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m perfkit.engine.tokenizer DIR")
    print(write(Path(sys.argv[1])))
