"""Pure cache index: block hashing, prompt and session caches, prefix index, admission queue."""

from cache_index.admission_queue import AdmissionQueue, QueueFull, Ticket, bucket_names, bucket_of
from cache_index.approx_blocks import ApproxBlocks, budget_for
from cache_index.errors import CacheIndexError
from cache_index.hashing import HashingError, block_hashes, char_block_hashes, prompt_hash
from cache_index.inflight_prefixes import InflightPrefixes
from cache_index.prefix_home import PrefixHome
from cache_index.prefix_index import Mode, PrefixIndex, ReplicaBlocks, ReplicaStats, TokensToHashes
from cache_index.prompt_cache import PromptCache
from cache_index.response_index import ResponseIndex
from cache_index.session_affinity import SessionAffinity, session_hash, session_key

__all__ = [
    "AdmissionQueue",
    "ApproxBlocks",
    "CacheIndexError",
    "HashingError",
    "InflightPrefixes",
    "Mode",
    "PrefixHome",
    "PrefixIndex",
    "PromptCache",
    "QueueFull",
    "ReplicaBlocks",
    "ReplicaStats",
    "ResponseIndex",
    "SessionAffinity",
    "Ticket",
    "TokensToHashes",
    "block_hashes",
    "bucket_names",
    "bucket_of",
    "budget_for",
    "char_block_hashes",
    "prompt_hash",
    "session_hash",
    "session_key",
]
