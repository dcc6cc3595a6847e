"""Deterministic pseudo-text for generated tokens: one short English word per token."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import xxhash

from vllm_api.tokenizer import BuiltinTokenizer, HFTokenizer, Tokenizer

# Words of at most four letters so each " word" is exactly one builtin token.
_WORDS: tuple[str, ...] = tuple(
    " ".join(
        (
            "the of and to in is that for it as was with be by on not he this are or his from",
            "at but have an had they you were one all we can her has been if more when will",
            "who so no out up into than them only some time two may then do its also now my",
            "over such new our most made back any way even well must much good each work down",
            "year just both like long life own see very show part form high here far land sea",
            "sky blue red cold warm fast slow road city home door hand eye face head mind",
            "word line page book data code test path node fire rain snow wind star moon sun",
            "tree leaf seed root rock sand gold iron wood ship boat",
        )
    ).split()
)


class OutputVocab:
    """(token id, text) pairs the simulator emits; same seed + prompt -> same output."""

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        ids: list[int] = []
        texts: list[str] = []
        for word in _WORDS:
            piece = " " + word
            if isinstance(tokenizer, BuiltinTokenizer):
                tid = tokenizer.register(piece)
            elif isinstance(tokenizer, HFTokenizer):
                enc = tokenizer.encode_plain(piece)
                if len(enc) != 1:
                    continue
                tid = enc[0]
            else:
                enc = tokenizer.encode(piece)
                if len(enc) != 1:
                    continue
                tid = enc[0]
            ids.append(tid)
            texts.append(piece)
        if not ids:  # a tokenizer that splits every word: fall back to a placeholder token
            ids, texts = [0], [" x"]
        self.ids = ids
        self.texts = texts
        self._seed = seed

    def offset(self, prompt_ids: Sequence[int]) -> int:
        """Per-request start position, a function of the prompt (like greedy decoding)."""
        head = ",".join(map(str, prompt_ids[-8:]))
        key = f"{len(prompt_ids)}:{head}".encode()
        return xxhash.xxh32_intdigest(key, seed=self._seed & 0xFFFFFFFF)

    def text(self, offset: int, start: int, stop: int) -> str:
        n = len(self.texts)
        texts = self.texts
        return "".join(texts[(offset + i * 7) % n] for i in range(start, stop))

    def token_ids(self, offset: int, start: int, stop: int) -> list[int]:
        n = len(self.ids)
        return [self.ids[(offset + i * 7) % n] for i in range(start, stop)]


@functools.cache
def max_chars_per_token(tokenizer_path: str | None) -> int | None:
    """Longest vocabulary entry (added tokens included), as vLLM bounds prompt text with it;
    None for the builtin tokenizer, whose pieces have no length bound."""
    if tokenizer_path is None:
        return None
    from tokenizers import Tokenizer as _HF

    file = tokenizer_path
    if os.path.isdir(file):
        file = os.path.join(file, "tokenizer.json")
    vocab = _HF.from_file(file).get_vocab(with_added_tokens=True)
    return max(map(len, vocab), default=None)
