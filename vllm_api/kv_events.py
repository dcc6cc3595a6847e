"""Decode (and encode) vLLM KV-cache event batches carried on the ZMQ PUB socket.

Wire form, checked against vllm/distributed/kv_events.py (msgspec structs):
- 0.32: ``EventBatch`` is ``array_like`` -> ``[ts, [events...], data_parallel_rank]``;
  events are tagged maps ``{"type": "BlockStored", "block_hashes": ..., ...}`` in field
  declaration order, ``omit_defaults=True`` (fields with a default are left out when unset).
- older releases: events are positional arrays too, the tag first:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, ...]``.
- newest main: the batch itself is a map ``{"ts", "events", "data_parallel_rank"}``.
Block hashes are ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the low 64 bits of the
SHA-256 digest) or the raw digest bytes; both map to the same low-64-bit int here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import msgpack

from vllm_api.errors import VllmApiError

MASK64 = (1 << 64) - 1
MEDIUM_GPU = "GPU"
END_SEQ = -1
SEQ_BYTES = 8


class KvEventDecodeError(VllmApiError):
    """A KV-event frame that is not in any known vLLM encoding."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that became resident; ``token_ids`` holds every token of those blocks."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None
    medium: str | None
    lora_id: int | None = None
    extra_keys: tuple[object, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted from ``medium``."""

    block_hashes: tuple[int, ...]
    medium: str | None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event type this decoder does not know; kept so the batch still decodes."""

    type: str


KvEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One ZMQ message's payload: a timestamp and the events of one engine step."""

    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None


# Declaration order of vLLM's structs: positional (array_like) events follow it, and
# msgspec writes map keys in it, so the encoder must too.
_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
# Fields that have a default in vLLM's structs: omitted on the wire when unset.
_OPTIONAL = frozenset(
    {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
)


def decode_seq(frame: bytes) -> int:
    """Sequence frame (8-byte big-endian) -> int; the replay end marker decodes to -1."""
    if len(frame) != SEQ_BYTES:
        raise KvEventDecodeError(f"sequence frame must be {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    """Int -> 8-byte big-endian sequence frame (``-1`` gives the replay end marker)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def normalize_hash(value: object) -> int:
    """A block hash as vLLM may send it (int or digest bytes) -> its low 64 bits."""
    if isinstance(value, bool):
        raise KvEventDecodeError("block hash must be int or bytes, got bool")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes | bytearray):
        if not value:
            raise KvEventDecodeError("empty block hash")
        # Same truncation as vLLM's maybe_convert_block_hash, so both forms agree.
        return int.from_bytes(value, "big") & MASK64
    raise KvEventDecodeError(f"block hash must be int or bytes, got {type(value).__name__}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack payload frame in any vLLM encoding."""
    try:
        obj: object = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise KvEventDecodeError(f"payload is not msgpack: {exc}") from exc
    if isinstance(obj, list):
        if len(obj) < 2:
            raise KvEventDecodeError("batch array needs at least [ts, events]")
        ts, events, rank = obj[0], obj[1], obj[2] if len(obj) > 2 else None
    elif isinstance(obj, dict):
        if "ts" not in obj or "events" not in obj:
            raise KvEventDecodeError("batch map needs 'ts' and 'events'")
        ts, events, rank = obj["ts"], obj["events"], obj.get("data_parallel_rank")
    else:
        raise KvEventDecodeError(f"batch must be an array or a map, got {type(obj).__name__}")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvEventDecodeError("batch ts must be a number")
    if not isinstance(events, list):
        raise KvEventDecodeError("batch events must be an array")
    return EventBatch(
        ts=float(ts),
        events=tuple(_decode_event(event) for event in events),
        data_parallel_rank=_opt_int(rank, "data_parallel_rank"),
    )


def _decode_event(raw: object) -> KvEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields: Mapping[object, object] = raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = _FIELDS.get(tag, ()) if isinstance(tag, str) else ()
        # Newer releases append fields; positions past the ones we know are ignored.
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KvEventDecodeError(f"event must be a tagged map or array, got {raw!r:.80}")
    if not isinstance(tag, str):
        raise KvEventDecodeError(f"event type must be a string, got {tag!r:.80}")
    decoder = _DECODERS.get(tag)
    return UnknownEvent(type=tag) if decoder is None else decoder(fields)


def _block_stored(f: Mapping[object, object]) -> BlockStored:
    hashes = _hashes(_required(f, "block_hashes"))
    tokens = _int_tuple(_required(f, "token_ids"), "token_ids")
    block_size = _required(f, "block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise KvEventDecodeError("block_size must be a positive int")
    parent = f.get("parent_block_hash")
    extra = f.get("extra_keys")
    if extra is not None and not isinstance(extra, list):
        raise KvEventDecodeError("extra_keys must be an array or null")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else normalize_hash(parent),
        token_ids=tokens,
        block_size=block_size,
        lora_name=_opt_str(f.get("lora_name"), "lora_name"),
        medium=_opt_str(f.get("medium"), "medium"),
        lora_id=_opt_int(f.get("lora_id"), "lora_id"),
        extra_keys=None if extra is None else tuple(_freeze(item) for item in extra),
        group_idx=_opt_int(f.get("group_idx"), "group_idx"),
        kv_cache_spec_kind=_opt_str(f.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
        kv_cache_spec_sliding_window=_opt_int(
            f.get("kv_cache_spec_sliding_window"), "kv_cache_spec_sliding_window"
        ),
    )


def _block_removed(f: Mapping[object, object]) -> BlockRemoved:
    return BlockRemoved(
        block_hashes=_hashes(_required(f, "block_hashes")),
        medium=_opt_str(f.get("medium"), "medium"),
        group_idx=_opt_int(f.get("group_idx"), "group_idx"),
    )


def _all_cleared(_: Mapping[object, object]) -> AllBlocksCleared:
    return AllBlocksCleared()


_DECODERS: dict[str, Callable[[Mapping[object, object]], KvEvent]] = {
    "BlockStored": _block_stored,
    "BlockRemoved": _block_removed,
    "AllBlocksCleared": _all_cleared,
}


def _required(f: Mapping[object, object], name: str) -> object:
    if name not in f:
        raise KvEventDecodeError(f"event is missing {name!r}")
    return f[name]


def _hashes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KvEventDecodeError("block_hashes must be an array")
    return tuple(normalize_hash(item) for item in value)


def _int_tuple(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise KvEventDecodeError(f"{name} must be an array of ints")
    return tuple(value)


def _opt_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvEventDecodeError(f"{name} must be an int or null")
    return value


def _opt_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise KvEventDecodeError(f"{name} must be a string or null")


def _freeze(value: object) -> object:
    # Arrays become tuples so the event stays hashable and immutable.
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    return value


def encode_batch(batch: EventBatch) -> bytes:
    """Encode exactly as vLLM 0.32 does: ``[ts, [tagged map events], data_parallel_rank]``.

    Optional BlockStored fields (extra_keys, group_idx, kv_cache_spec_*) are written only
    when set, like msgspec's ``omit_defaults``; 0.32 sets ``extra_keys`` (one entry per
    block), ``group_idx=0`` and ``kv_cache_spec_kind="full_attention"``.
    """
    # array_like structs write every field (omit_defaults only drops map keys), so the
    # rank slot is present even when it is null.
    events = [_encode_event(event) for event in batch.events]
    body = [float(batch.ts), events, batch.data_parallel_rank]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def _encode_event(event: KvEvent) -> dict[str, object]:
    if isinstance(event, UnknownEvent):
        return {"type": event.type}
    name = type(event).__name__
    out: dict[str, object] = {"type": name}
    for field in _FIELDS[name]:
        value = getattr(event, field)
        if value is None and field in _OPTIONAL:
            continue
        out[field] = list(value) if field in ("block_hashes", "token_ids") else value
    return out
