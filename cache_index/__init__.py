"""Pure cache index: block hashing, prompt and session caches, prefix index, admission queue."""

from cache_index.admission_queue import AdmissionQueue, QueueFull, Ticket, bucket_names
from cache_index.chat_template import (
    DEFAULT_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
)
from cache_index.errors import CacheIndexError
from cache_index.hashing import HashingError, block_hashes, char_block_hashes, prompt_hash
from cache_index.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    KvEventDecodeError,
    UnknownEvent,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
    normalize_hash,
)
from cache_index.prefix_home import PrefixHome
from cache_index.prefix_index import Mode, PrefixIndex, ReplicaBlocks, ReplicaStats, TokensToHashes
from cache_index.prompt_cache import PromptCache
from cache_index.session_affinity import SessionAffinity, session_key
from cache_index.tokenizer import (
    BuiltinTokenizer,
    HFTokenizer,
    Tokenizer,
    TokenizerError,
    load_tokenizer,
)

__all__ = [
    "DEFAULT_TEMPLATE",
    "AdmissionQueue",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "BuiltinTokenizer",
    "CacheIndexError",
    "ChatTemplate",
    "ChatTemplateError",
    "EventBatch",
    "HFTokenizer",
    "HashingError",
    "KvEvent",
    "KvEventDecodeError",
    "Mode",
    "PrefixHome",
    "PrefixIndex",
    "PromptCache",
    "QueueFull",
    "ReplicaBlocks",
    "ReplicaStats",
    "SessionAffinity",
    "Ticket",
    "Tokenizer",
    "TokenizerError",
    "TokensToHashes",
    "UnknownEvent",
    "block_hashes",
    "bucket_names",
    "char_block_hashes",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
    "load_chat_template",
    "load_tokenizer",
    "normalize_hash",
    "prompt_hash",
    "session_key",
]
