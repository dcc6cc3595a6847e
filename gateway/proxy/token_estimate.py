"""Characters per token without a tokenizer, learned from the replicas' own `usage`.

Without a tokenizer the gateway counts a prompt's tokens from its characters. A fixed 4 is
English prose under GPT-style vocabularies; a small or code-heavy vocabulary makes twice as
many tokens of the same text, and then every figure compared with the replicas' own token
counts (a prefix's share of a KV cache, the prefill a replica still has to do, the length
buckets) is off by that factor. vLLM says how many tokens each prompt was: the templated
prompt's characters over that count, summed over recent answers, is the ratio this model's
tokenizer makes on this traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

# The ratio a model starts at, and keeps until enough of its answers were counted.
DEFAULT_CHARS_PER_TOKEN = 4.0
# Ratios outside these are taken as a miscount (a prompt vLLM truncated, a wrong pairing).
_LOWEST, _HIGHEST = 1.0, 16.0
# Models remembered: far above any fleet's served names; past it, new names stay at the default.
_MAX_MODELS = 1024


@dataclass(slots=True)
class _Sums:
    chars: float = 0.0
    tokens: float = 0.0
    seen: int = 0


class CharsPerToken:
    """Each model's characters per prompt token, from (characters sent, tokens vLLM counted)."""

    __slots__ = ("_every", "_forget_at", "_min_tokens", "_ratios", "_sums")

    def __init__(
        self, min_tokens: int = 2048, forget_tokens: int = 1 << 20, sample_every: int = 16
    ) -> None:
        """`min_tokens`: counted tokens before a model leaves the default; `forget_tokens`:
        the sums halve past it (recent traffic weighs most); `sample_every`: once calibrated,
        one answer in this many is read (reading a stream's usage costs a scan per chunk)."""
        self._min_tokens = min_tokens
        self._forget_at = max(forget_tokens, 2 * min_tokens)
        self._every = max(1, sample_every)
        self._sums: dict[str, _Sums] = {}
        self._ratios: dict[str, float] = {}

    def ratio(self, model: str) -> float:
        """Characters per token for `model`'s prompts."""
        return self._ratios.get(model, DEFAULT_CHARS_PER_TOKEN)

    def wants(self, model: str) -> bool:
        """Whether this request's usage should be read: every one until the model is
        calibrated, then one in `sample_every`."""
        sums = self._sums.get(model)
        if sums is None:
            return len(self._sums) < _MAX_MODELS
        sums.seen += 1
        return model not in self._ratios or sums.seen % self._every == 0

    def observe(self, model: str, chars: int, tokens: int) -> None:
        """A prompt of `chars` characters was `tokens` tokens on the replica."""
        if chars <= 0 or tokens <= 0 or not _LOWEST <= chars / tokens <= _HIGHEST:
            return
        sums = self._sums.get(model)
        if sums is None:
            if len(self._sums) >= _MAX_MODELS:
                return
            sums = self._sums[model] = _Sums()
        sums.chars += chars
        sums.tokens += tokens
        if sums.tokens >= self._forget_at:
            sums.chars, sums.tokens = sums.chars / 2, sums.tokens / 2
        if sums.tokens >= self._min_tokens:
            self._ratios[model] = sums.chars / sums.tokens

    def tokens(self, model: str, chars: int) -> int:
        """The estimated tokens of `chars` characters of `model`'s prompt."""
        return int(chars / self.ratio(model))
