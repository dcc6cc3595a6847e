"""The gateway's use of the three-tier cache index: features in, affinity hints out."""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cache_index.admission_queue import bucket_of
from cache_index.hashing import block_hashes, char_block_hashes, prompt_hash
from cache_index.inflight_prefixes import InflightPrefixes
from cache_index.prefix_home import PrefixHome
from cache_index.prefix_index import PrefixIndex
from cache_index.prompt_cache import PromptCache
from cache_index.session_affinity import SessionAffinity, session_key
from gateway.config import AdmissionConfig, CacheIndexConfig
from gateway.proxy import batch_route, messages_route, responses_route
from gateway.proxy.requests import Kind, ParsedRequest, with_features
from gateway.proxy.token_estimate import CharsPerToken
from routing.types import RequestFeatures
from vllm_api.chat_template import ChatTemplate, load_chat_template
from vllm_api.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("llm_gateway.affinity")

# Estimated prompt tokens (parse-time estimate) above which features are computed off the loop.
_THREAD_ABOVE_TOKENS = 4096
# Requests in flight whose prefixes one process tracks (far above any replica's batch).
_MAX_INFLIGHT = 1 << 16
# Prefixed to a token-id prompt's bytes before its prompt hash: no text hashes the same.
_IDS_KEY = b"\x00token-ids\x00"
# Routes that generate (and so leave a prefix in the replica's KV cache).
_CACHED_KINDS: frozenset[Kind] = frozenset(
    {"chat", "completions", "responses", "messages", "chat_batch"}
)
# Routes whose rendered chat vLLM tokenizes without adding special tokens.
_PLAIN_KINDS: frozenset[Kind] = frozenset({"chat", "messages", "chat_batch"})


@dataclass(frozen=True, slots=True)
class Digest:
    """What hashing a prompt found: pure, so it may be computed in a worker thread."""

    tokens: int
    prompt_hash: int
    hashes: tuple[int, ...]
    # Prompt tokens per block of `hashes`.
    block_tokens: int
    # The templated prompt's characters when `tokens` was estimated from them, else 0.
    chars: int = 0


class Affinity:
    """Tier 1 (prompt hash, session) and tier 2 (prefix blocks) for one gateway process."""

    def __init__(
        self,
        cfg: CacheIndexConfig,
        is_lora: Callable[[str], bool],
        buckets: Sequence[int] | None = None,
    ) -> None:
        """`buckets`: the admission queue's token limits ([admission].buckets; None: default)."""
        self.cfg = cfg
        self._is_lora = is_lora
        self.buckets = tuple(AdmissionConfig().buckets if buckets is None else buckets)
        path = cfg.tokenizer if cfg.tokenizer not in ("", "builtin") else None
        self.tokenizer: Tokenizer | None = load_tokenizer(path) if cfg.tokenizer else None
        self.template: ChatTemplate = load_chat_template(path)
        self.prompts = PromptCache(ttl_s=cfg.prompt_cache_ttl_s, max_entries=cfg.max_prompts)
        self.sessions = SessionAffinity(ttl_s=cfg.session_ttl_s, max_entries=cfg.max_sessions)
        self.prefixes = PrefixIndex(
            default_capacity=cfg.default_capacity_blocks,
            approx_ratio=cfg.history_ratio,
            max_total_blocks=cfg.max_total_blocks,
        )
        # Homes are kept for precise replicas only (approximate ones remember their routing
        # history in the index itself); an eighth of the index's bound (~100 B an entry).
        self.homes = PrefixHome(max(1, cfg.max_total_blocks // 8))
        # Prefixes being computed now: a second request of a new prefix follows the first.
        self.inflight = InflightPrefixes(_MAX_INFLIGHT)
        self._session_header = cfg.session_header.lower().encode()
        # Blocks of a token-id prompt without a tokenizer: a 64-character block is about 16
        # tokens (~4 characters each). Fixed: a block's hash must not change with estimates.
        self.block_tokens = cfg.block_size if self.tokenizer else max(1, cfg.block_chars // 4)
        # Without a tokenizer, text prompts' tokens are estimated at a ratio learned from vLLM.
        self.chars_per_token = CharsPerToken()
        # Told of every routing outcome `record` keeps (shared state publishes them); None alone.
        self.on_record: Callable[[RequestFeatures, str], None] | None = None

    def prompt_text(self, req: ParsedRequest) -> str:
        """The whole templated prompt, as the replica will see it (system prompt and history)."""
        data = req.data
        if req.kind == "chat":
            return self.template.render(data["messages"], add_generation_prompt=True)
        if req.kind == "chat_batch":
            conversation = batch_route.routing_conversation(data)
            return self.template.render(conversation, add_generation_prompt=True)
        # Rendered from the chat vLLM converts them to, so their prefixes hash as chat's do.
        if req.kind == "responses":
            return self.template.render(responses_route.chat_messages(data))
        if req.kind == "messages":
            return self.template.render(messages_route.chat_messages(data))
        prompt: Any = data["prompt"]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            return prompt[0]  # a batch of prompts: route on the first
        return ""

    def _token_ids(self, req: ParsedRequest) -> list[int] | None:
        """The prompt's token ids when the client sent ids (a batch: the first prompt's)."""
        prompt: Any = req.data.get("prompt") if req.kind == "completions" else None
        if not isinstance(prompt, list) or not prompt:
            return None
        first = prompt[0]
        if isinstance(first, int):
            return prompt
        if isinstance(first, list) and first and isinstance(first[0], int):
            return first
        return None

    def _hashes(self, req: ParsedRequest, text: str) -> Digest:
        # vLLM keys a LoRA adapter's blocks apart from the base model's: so does the index.
        extra = req.model.encode() if self._is_lora(req.model) else b""
        whole = prompt_hash(req.model, text)
        if self.tokenizer is not None:
            # A rendered chat already carries the template's BOS; vLLM adds none to it.
            tok = self.tokenizer
            # Responses tokenizes with special tokens (a BOS before the template's), as vLLM.
            plain = req.kind in _PLAIN_KINDS
            ids = tok.encode_plain(text) if plain else tok.encode(text)
            hashes = block_hashes(ids, self.cfg.block_size, extra=extra)
            return Digest(len(ids), whole, tuple(hashes), self.cfg.block_size)
        hashes = char_block_hashes(text, self.cfg.block_chars, extra=extra)
        ratio = self.chars_per_token.ratio(req.model)
        per_block = max(1, round(self.cfg.block_chars / ratio))
        return Digest(int(len(text) / ratio), whole, tuple(hashes), per_block, len(text))

    def _id_digest(self, req: ParsedRequest, ids: list[int]) -> Digest:
        # Token ids are exactly what vLLM caches: blocks of the replicas' block size with a
        # tokenizer, else of block_tokens (so matched blocks x block_tokens stays the tokens).
        extra = req.model.encode() if self._is_lora(req.model) else b""
        size = self.cfg.block_size if self.tokenizer is not None else self.block_tokens
        hashes = tuple(block_hashes(ids, size, extra=extra))
        # Keyed apart from text prompts; ids are < 2**32 (parse_request checked them).
        whole = prompt_hash(req.model, _IDS_KEY + array("I", ids).tobytes())
        return Digest(len(ids), whole, hashes, size)

    def digest(self, req: ParsedRequest) -> Digest | None:
        """The prompt's tokens, prompt hash and block hashes (None: nothing to route on)."""
        # Odd but valid input (content parts the template can't take, ids the tokenizer or the
        # hashes refuse) is the replica's to judge: without features it is routed by load.
        # Counts and tokenizations fill no KV cache; a follow-up's prompt starts with turns
        # only its replica knows (and goes there anyway): neither has features to route on.
        if req.kind not in _CACHED_KINDS or req.response_id is not None:
            return None
        try:
            ids = self._token_ids(req)
            if ids is not None:
                return self._id_digest(req, ids)
            return self._hashes(req, self.prompt_text(req))
        except Exception as exc:
            log.debug("no features for %s: %s: %s", req.request_id, type(exc).__name__, exc)
            return None

    def lookup(
        self,
        req: ParsedRequest,
        headers: list[tuple[bytes, bytes]],
        digest: Digest | None,
    ) -> RequestFeatures:
        """What each tier knows about this request (on the event loop: the tiers aren't shared)."""
        if digest is None:
            bucket = bucket_of(self.buckets, req.features.prompt_tokens)
            return with_features(req.features, bucket=bucket)
        tokens, hashes, chars = digest.tokens, digest.hashes, digest.chars
        if req.kind == "chat_batch":  # hashed on its first conversation, sized on them all
            tokens, chars = batch_route.prompt_tokens(req.data, tokens), 0
        now = time.monotonic()
        header = next((v.decode("latin-1") for k, v in headers if k == self._session_header), None)
        session = session_key(header, req.data.get("user"))
        match = self.prefixes.match(hashes) if hashes else {}
        running: dict[str, int] = {}
        if hashes and self.inflight:
            running = self.inflight.match(hashes)
            for replica in [r for r, depth in running.items() if depth <= match.get(r, 0)]:
                del running[replica]
        # Every tier answers; the routing profile decides which one the request follows.
        home = None
        if not match and not running and hashes:
            # No cache holds any of it: if vLLM evicted it, it may go back where it lived.
            home = self.homes.lookup(hashes)
        return with_features(
            req.features,
            prompt_tokens=tokens,
            bucket=bucket_of(self.buckets, tokens),
            prompt_chars=chars,
            prompt_hash=digest.prompt_hash,
            block_hashes=hashes,
            session=session,
            prefix_match=match,
            inflight_match=running,
            block_tokens=digest.block_tokens,
            prompt_cache_replica=self.prompts.get(digest.prompt_hash, now),
            session_replica=self.sessions.get(session, now) if session is not None else None,
            prefix_home_replica=home[0] if home is not None else None,
        )

    def features(self, req: ParsedRequest, headers: list[tuple[bytes, bytes]]) -> RequestFeatures:
        """Complete the request's features with hashes and what each tier knows."""
        return self.lookup(req, headers, self.digest(req))

    async def features_off_loop(
        self, req: ParsedRequest, headers: list[tuple[bytes, bytes]]
    ) -> RequestFeatures:
        """`features`, tokenizing long prompts in a worker thread so the loop keeps serving."""
        # Measured: the built-in tokenizer takes ~2.5 ms for 11k tokens; templating and hashing
        # add ~0.1 ms per 10k characters. Below ~1 ms a thread hop costs more than it saves.
        if req.features.prompt_tokens < _THREAD_ABOVE_TOKENS:
            return self.features(req, headers)
        digest = await asyncio.to_thread(self.digest, req)
        return self.lookup(req, headers, digest)

    def record(self, features: RequestFeatures, replica: str) -> None:
        """The request was served by `replica`: remember it in every tier."""
        now = time.monotonic()
        if features.prompt_hash is not None:
            self.prompts.put(features.prompt_hash, replica, now)
        if features.session is not None:
            self.sessions.put(features.session, replica, now)
        if features.block_hashes:
            self.prefixes.record_routed(replica, features.block_hashes, now)
            if self.prefixes.mode(replica) == "precise":
                self.homes.record(replica, features.block_hashes)
        if self.on_record is not None:
            self.on_record(features, replica)

    def wants_usage(self, features: RequestFeatures) -> bool:
        """Whether this answer's prompt token count should be read (to learn the estimate)."""
        return features.prompt_chars > 0 and self.chars_per_token.wants(features.model)

    def observe_usage(self, features: RequestFeatures, prompt_tokens: int) -> None:
        """The replica counted `prompt_tokens` for this request's prompt."""
        self.chars_per_token.observe(features.model, features.prompt_chars, prompt_tokens)

    def forget_replica(self, replica: str) -> None:
        """A replica restarted or left: nothing it cached can be trusted."""
        self.prompts.forget_replica(replica)
        self.sessions.forget_replica(replica)
        self.prefixes.remove_replica(replica)
        self.homes.forget_replica(replica)
        self.inflight.forget_replica(replica)
