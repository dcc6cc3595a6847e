"""Tokenizers shared by the simulated replicas and the gateway (they must agree exactly)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Protocol

import xxhash

from vllm_api.errors import VllmApiError

VOCAB_SIZE = 32000
# Ids below this are reserved for special tokens so hashed pieces never collide with them.
NUM_SPECIAL = 256
BOS_ID = 1
EOS_ID = 2

# Words are cut into pieces of at most 5 letters (a leading space rides along), which gives
# about 4 characters per token on English prose, close to BPE tokenizers of 8B-class models.
_PIECE = re.compile(r" ?[A-Za-z]{1,5}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]|\s+(?!\S)|\s")
_CACHE_LIMIT = 200_000


class TokenizerError(VllmApiError):
    """Root error of the tokenizer module (bad path, unreadable tokenizer file)."""


class Tokenizer(Protocol):
    """Text <-> token ids, exactly as the replica tokenizes."""

    name: str

    def encode(self, text: str) -> list[int]:
        """A prompt as a completion request sends it (special tokens such as BOS added)."""
        ...

    def encode_plain(self, text: str) -> list[int]:
        """Text already templated (chat): vLLM adds no special tokens, the template did."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class BuiltinTokenizer:
    """Deterministic, dependency-light tokenizer: regex pieces hashed into a 32k vocabulary."""

    name = "builtin"

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: dict[int, str] = {}

    def _piece_id(self, piece: str) -> int:
        h = xxhash.xxh64_intdigest(piece.encode("utf-8"))
        return NUM_SPECIAL + h % (VOCAB_SIZE - NUM_SPECIAL)

    def encode(self, text: str) -> list[int]:
        """Encode without special tokens (the builtin vocabulary has no BOS convention)."""
        ids = self._ids
        out: list[int] = []
        append = out.append
        for piece in _PIECE.findall(text):
            tid = ids.get(piece)
            if tid is None:
                tid = self._piece_id(piece)
                # Bounded memo: long-running simulators see unbounded distinct pieces.
                if len(ids) < _CACHE_LIMIT:
                    ids[piece] = tid
                    self._pieces.setdefault(tid, piece)
            append(tid)
        return out

    def encode_plain(self, text: str) -> list[int]:
        """The same as `encode`: the built-in vocabulary has no special tokens to add."""
        return self.encode(text)

    def register(self, piece: str) -> int:
        """Pin a piece in the decode table (used for the simulator's output vocabulary)."""
        tid = self._piece_id(piece)
        self._ids[piece] = tid
        self._pieces[tid] = piece
        return tid

    def decode(self, ids: Sequence[int]) -> str:
        pieces = self._pieces
        return "".join(pieces.get(i, f"<{i}>") for i in ids)


class HFTokenizer:
    """A Hugging Face `tokenizers` file; adds special tokens as vLLM does for prompts."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _HF

        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        try:
            self._tok = _HF.from_file(file)
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise TokenizerError(f"cannot load tokenizer from {file}: {exc}") from exc
        self.name = os.path.basename(os.path.dirname(os.path.abspath(file))) or "hf"

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def encode_plain(self, text: str) -> list[int]:
        """Encode without special tokens (for text appended to an existing sequence)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())


def load_tokenizer(path: str | None) -> Tokenizer:
    """`None` -> BuiltinTokenizer; else a dir holding tokenizer.json (or the file itself)."""
    if path is None:
        return BuiltinTokenizer()
    return HFTokenizer(path)
