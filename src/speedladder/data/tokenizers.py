"""The tokenizers: characters, GPT-2's BPE (from the ranks shipped in assets/), and a token file's ids."""

from __future__ import annotations

import re
from typing import Protocol

from speedladder.config.run import TOKEN_FILE_TOKENIZER
from speedladder.data import asset
from speedladder.errors import UsageError

TOKENIZERS = ("char", "gpt2")

# GPT-2's split pattern, for tiktoken releases that do not carry it as r50k_pat_str.
_GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_GPT2_EOT = 50256


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """d2l's character-level tokenizer: lower-case, every run of non-letters -> one space.

    As d2l's read_time_machine does, each line is preprocessed and stripped, and
    the lines are concatenated (The Time Machine -> 170,580 characters). The
    vocabulary is fixed (unknown, space, a..z: 28 symbols), so it does not depend
    on the corpus; after the preprocessing nothing maps to unknown.
    """

    name = "char"
    symbols = ("<unk>", " ", *"abcdefghijklmnopqrstuvwxyz")
    vocab_size = len(symbols)

    def __init__(self) -> None:
        self._index = {s: i for i, s in enumerate(self.symbols)}

    @staticmethod
    def preprocess(text: str) -> str:
        return "".join(re.sub("[^A-Za-z]+", " ", line).strip().lower() for line in text.splitlines())

    def encode(self, text: str) -> list[int]:
        return [self._index.get(c, 0) for c in self.preprocess(text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.symbols[i] if i > 0 else "?" for i in ids)


class GPT2Tokenizer:
    """GPT-2 byte-pair encoding through tiktoken, built from the shipped ranks (no download)."""

    name = "gpt2"
    vocab_size = 50257

    def __init__(self) -> None:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext import openai_public

        ranks = load_tiktoken_bpe(str(asset("gpt2.tiktoken")))
        self._enc = tiktoken.Encoding(
            name="gpt2-speedladder",
            # tiktoken >= 0.8 ships an equivalent pattern with possessive quantifiers (faster).
            pat_str=getattr(openai_public, "r50k_pat_str", _GPT2_PAT),
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": _GPT2_EOT},
        )

    def encode(self, text: str) -> list[int]:
        # Ordinary: text that happens to contain "<|endoftext|>" is encoded as text, not refused.
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


class IdsTokenizer:
    """A token file's ids, used as they are: nothing to encode; decoded as the numbers themselves."""

    name = TOKEN_FILE_TOKENIZER
    vocab_size = 0  # the model's, or --vocab-size

    def encode(self, text: str) -> list[int]:
        raise UsageError("a token file's ids need no tokenizer; text needs --tokenizer char or gpt2")

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def get_tokenizer(name: str) -> Tokenizer:
    if name == "char":
        return CharTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == TOKEN_FILE_TOKENIZER:
        return IdsTokenizer()
    raise UsageError(f"unknown tokenizer {name!r} (choose from {', '.join(TOKENIZERS)})")
