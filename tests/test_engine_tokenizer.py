"""The engine's tokenizer folder (perfkit/engine/tokenizer.py): the byte ids, as a client's tokenizer counts them."""

from __future__ import annotations

import pytest

tokenizers = pytest.importorskip("tokenizers")

from perfkit.engine import data, tokenizer  # noqa: E402

TEXTS = ["def main():\n    return 0\n", "héllo wörld ✓ 🙂", " \t\r\n  leading spaces", "\x00\x01\x7f binary", ""]


def test_the_shipped_folder_is_what_the_code_writes(tmp_path):
    made = tokenizer.write(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (made / name).read_bytes() == (tokenizer.TOKENIZER_DIR / name).read_bytes(), name


@pytest.mark.parametrize("text", TEXTS)
def test_each_byte_is_one_token_whose_id_is_the_byte_and_decoding_gives_the_text_back(text):
    tok = tokenizers.Tokenizer.from_file(str(tokenizer.TOKENIZER_DIR / "tokenizer.json"))
    ids = tok.encode(text).ids
    assert ids == data.encode(text)  # what the engine's /tokenize and usage count
    assert tok.decode(ids) == text


def test_the_byte_characters_are_256_distinct_printable_ones():
    chars = tokenizer.byte_characters()
    assert len(set(chars)) == 256 and all(c.isprintable() and not c.isspace() for c in chars)
    assert chars[ord("A")] == "A" and chars[ord(" ")] != " "  # a space stands for itself nowhere
