"""KV-event decoder/encoder against every wire form vLLM has used.

The reference payloads are produced with msgspec structs declared the way vLLM declares
them (vllm/distributed/kv_events.py), so the tests exercise the real encodings rather
than hand-written bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import msgspec
import pytest

from vllm_api.errors import VllmApiError
from vllm_api.kv_events import (
    MASK64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    UnknownEvent,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
    normalize_hash,
)

H1, H2, H3 = 0xFEDCBA9876543210, 42, (1 << 64) - 1
TOKENS = list(range(100, 132))


# --- vLLM 0.32: array batch, tagged map events, omit_defaults --------------------------
class _Event032(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class _Stored032(_Event032, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _Removed032(_Event032, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _Cleared032(_Event032, tag="AllBlocksCleared"):
    pass


class _Batch032(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# --- newest main: the batch is a map too -------------------------------------------------
class _BatchMap(msgspec.Struct, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# --- early releases: everything array_like, fewer fields -------------------------------
class _EventOld(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class _StoredOld(_EventOld, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _StoredMid(_EventOld, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _RemovedOld(_EventOld, tag="BlockRemoved"):
    block_hashes: list[int]


class _ClearedOld(_EventOld, tag="AllBlocksCleared"):
    pass


class _BatchOld(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]


def _stored_032(**overrides: Any) -> _Stored032:
    fields: dict[str, Any] = {
        "block_hashes": [H1, H2],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    fields.update(overrides)
    return _Stored032(**fields)


def _expected_stored(**overrides: Any) -> BlockStored:
    fields: dict[str, Any] = {
        "block_hashes": (H1, H2),
        "parent_block_hash": None,
        "token_ids": tuple(TOKENS),
        "block_size": 16,
        "lora_name": None,
        "medium": "GPU",
        "extra_keys": (None, None),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    fields.update(overrides)
    return BlockStored(**fields)


def test_decodes_vllm_032_form() -> None:
    payload = msgspec.msgpack.encode(
        _Batch032(
            ts=1789095808.25,
            events=[
                _stored_032(),
                _stored_032(
                    block_hashes=[H3],
                    parent_block_hash=H2,
                    token_ids=TOKENS[:16],
                    lora_name="sim-lora",
                    lora_id=1,
                    extra_keys=[("sim-lora",)],
                ),
                _Removed032(block_hashes=[H1], medium="GPU"),
                _Cleared032(),
            ],
            data_parallel_rank=0,
        )
    )
    batch = decode_batch(payload)
    assert batch == EventBatch(
        ts=1789095808.25,
        events=(
            _expected_stored(),
            _expected_stored(
                block_hashes=(H3,),
                parent_block_hash=H2,
                token_ids=tuple(TOKENS[:16]),
                lora_name="sim-lora",
                lora_id=1,
                extra_keys=(("sim-lora",),),
            ),
            BlockRemoved(block_hashes=(H1,), medium="GPU"),
            AllBlocksCleared(),
        ),
        data_parallel_rank=0,
    )


@pytest.mark.parametrize(
    "batch",
    [
        EventBatch(ts=12.5, events=(_expected_stored(),), data_parallel_rank=0),
        EventBatch(
            ts=3.0,
            events=(
                _expected_stored(
                    extra_keys=None, group_idx=None, kv_cache_spec_kind=None, lora_name="x"
                ),
                BlockRemoved(block_hashes=(H1, H3), medium="CPU", group_idx=2),
                AllBlocksCleared(),
            ),
            data_parallel_rank=3,
        ),
        EventBatch(ts=7.0, events=(), data_parallel_rank=None),
    ],
)
def test_encode_is_byte_identical_to_vllm_032(batch: EventBatch) -> None:
    def to_struct(event: object) -> Any:
        if isinstance(event, BlockStored):
            return _Stored032(
                block_hashes=list(event.block_hashes),
                parent_block_hash=event.parent_block_hash,
                token_ids=list(event.token_ids),
                block_size=event.block_size,
                lora_id=event.lora_id,
                medium=event.medium,
                lora_name=event.lora_name,
                extra_keys=None if event.extra_keys is None else list(event.extra_keys),  # type: ignore[arg-type]
                group_idx=event.group_idx,
                kv_cache_spec_kind=event.kv_cache_spec_kind,
            )
        if isinstance(event, BlockRemoved):
            return _Removed032(
                block_hashes=list(event.block_hashes),
                medium=event.medium,
                group_idx=event.group_idx,
            )
        return _Cleared032()

    reference = msgspec.msgpack.encode(
        _Batch032(
            ts=batch.ts,
            events=[to_struct(e) for e in batch.events],
            data_parallel_rank=batch.data_parallel_rank,
        )
    )
    assert encode_batch(batch) == reference
    assert decode_batch(encode_batch(batch)) == batch


def test_encoded_event_maps_start_with_type_in_field_order() -> None:
    raw = msgpack.unpackb(encode_batch(EventBatch(1.0, (_expected_stored(),), 0)))
    assert isinstance(raw, list) and len(raw) == 3
    assert list(raw[1][0]) == [
        "type",
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
    ]


def test_decodes_oldest_positional_form() -> None:
    payload = msgspec.msgpack.encode(
        _BatchOld(
            ts=5.0,
            events=[
                _StoredOld(
                    block_hashes=[H1],
                    parent_block_hash=None,
                    token_ids=TOKENS[:16],
                    block_size=16,
                    lora_id=None,
                ),
                _RemovedOld(block_hashes=[H1]),
                _ClearedOld(),
            ],
        )
    )
    assert msgpack.unpackb(payload)[1][0][0] == "BlockStored"
    assert decode_batch(payload) == EventBatch(
        ts=5.0,
        events=(
            BlockStored((H1,), None, tuple(TOKENS[:16]), 16, lora_name=None, medium=None),
            BlockRemoved(block_hashes=(H1,), medium=None),
            AllBlocksCleared(),
        ),
        data_parallel_rank=None,
    )


def test_decodes_positional_form_with_medium_and_lora() -> None:
    payload = msgspec.msgpack.encode(
        _BatchOld(
            ts=6.0,
            events=[
                _StoredMid(
                    block_hashes=[H2, H3],
                    parent_block_hash=H1,
                    token_ids=TOKENS,
                    block_size=16,
                    lora_id=7,
                    medium="GPU",
                    lora_name="sim-lora",
                )
            ],
        )
    )
    (event,) = decode_batch(payload).events
    assert event == BlockStored(
        (H2, H3), H1, tuple(TOKENS), 16, lora_name="sim-lora", medium="GPU", lora_id=7
    )


def test_positional_fields_beyond_known_ones_are_ignored() -> None:
    payload = msgpack.packb(
        [1.0, [["BlockRemoved", [H1], "GPU", 0, "future-field"]], 0], use_bin_type=True
    )
    assert decode_batch(payload).events == (BlockRemoved((H1,), "GPU", group_idx=0),)


def test_decodes_newest_map_batch() -> None:
    payload = msgspec.msgpack.encode(
        _BatchMap(ts=9.5, events=[_stored_032(), _Cleared032()], data_parallel_rank=1)
    )
    assert isinstance(msgpack.unpackb(payload), dict)
    batch = decode_batch(payload)
    assert batch == EventBatch(9.5, (_expected_stored(), AllBlocksCleared()), 1)


def test_map_batch_without_rank() -> None:
    payload = msgspec.msgpack.encode(_BatchMap(ts=1.0, events=[]))
    assert decode_batch(payload) == EventBatch(1.0, (), None)


def test_bytes_hashes_take_the_low_64_bits() -> None:
    digests = [hashlib.sha256(bytes([i])).digest() for i in range(3)]
    as_ints = [int.from_bytes(d, "big") & MASK64 for d in digests]
    payload = msgspec.msgpack.encode(
        _Batch032(
            ts=1.0,
            events=[
                _stored_032(block_hashes=digests[1:], parent_block_hash=digests[0]),
                _Removed032(block_hashes=[digests[2]], medium="GPU"),
            ],
        )
    )
    stored, removed = decode_batch(payload).events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.block_hashes == tuple(as_ints[1:])
    assert stored.parent_block_hash == as_ints[0]
    assert removed.block_hashes == (as_ints[2],)
    # The int form vLLM sends with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES maps identically.
    assert normalize_hash(as_ints[2]) == normalize_hash(digests[2])


def test_signed_int_hashes_are_masked_to_unsigned() -> None:
    assert normalize_hash(-1) == MASK64
    assert normalize_hash(1 << 70 | 5) == 5


def test_unknown_event_types_do_not_fail_the_batch() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                {"type": "BlockPinned", "block_hashes": [1]},
                ["SomethingNew", 1, 2],
                {"type": "AllBlocksCleared"},
            ],
            0,
        ],
        use_bin_type=True,
    )
    assert decode_batch(payload).events == (
        UnknownEvent("BlockPinned"),
        UnknownEvent("SomethingNew"),
        AllBlocksCleared(),
    )


def test_unknown_event_round_trips_as_bare_tag() -> None:
    batch = EventBatch(1.0, (UnknownEvent("Future"),), 0)
    assert msgpack.unpackb(encode_batch(batch)) == [1.0, [{"type": "Future"}], 0]
    assert decode_batch(encode_batch(batch)) == batch


def _pack(obj: object) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1", "not msgpack"),
        (_pack([1.0, [], 0]) + b"\x00", "trailing garbage"),
        (_pack([1.0, [{"type": "AllBlocksCleared"}], 0])[:-3], "truncated"),
        (_pack("hello"), "top level string"),
        (_pack([1.0]), "array too short"),
        (_pack({"events": []}), "map without ts"),
        (_pack(["x", [], 0]), "ts not a number"),
        (_pack([True, [], 0]), "ts is a bool"),
        (_pack([1.0, {}, 0]), "events not an array"),
        (_pack([1.0, [], "zero"]), "rank not an int"),
        (_pack([1.0, [42], 0]), "event not a map or array"),
        (_pack([1.0, [[]], 0]), "empty positional event"),
        (_pack([1.0, [{"block_hashes": []}], 0]), "map event without type"),
        (_pack([1.0, [[7, [1]]], 0]), "positional tag not a string"),
        (
            _pack([1.0, [{"type": "BlockStored", "token_ids": [], "block_size": 16}], 0]),
            "no hashes",
        ),
        (_pack([1.0, [["BlockStored", [1], None, [1, "a"], 16, None]], 0]), "bad token ids"),
        (_pack([1.0, [["BlockStored", [1.5], None, [1], 16, None]], 0]), "float hash"),
        (_pack([1.0, [["BlockStored", [True], None, [1], 16, None]], 0]), "bool hash"),
        (_pack([1.0, [["BlockStored", [b""], None, [1], 16, None]], 0]), "empty bytes hash"),
        (_pack([1.0, [["BlockStored", [1], None, [1], 0, None]], 0]), "zero block size"),
        (_pack([1.0, [["BlockStored", [1], None, [1], 16, None, 5]], 0]), "medium not a str"),
        (_pack([1.0, [["BlockStored", [1], None, [1], 16, None, "GPU", None, 3]], 0]), "extra"),
        (_pack([1.0, [["BlockRemoved", 5]], 0]), "hashes not an array"),
    ],
)
def test_malformed_payloads_raise_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_batch(payload)


def test_decode_error_is_a_vllm_api_error() -> None:
    assert issubclass(KvEventDecodeError, VllmApiError)


@pytest.mark.parametrize("seq", [0, 1, 255, 256, 2**40, 2**63 - 1])
def test_sequence_frames(seq: int) -> None:
    frame = seq.to_bytes(8, "big")
    assert decode_seq(frame) == seq
    assert encode_seq(seq) == frame


def test_replay_end_marker_is_minus_one() -> None:
    assert decode_seq(b"\xff" * 8) == -1
    assert encode_seq(-1) == (-1).to_bytes(8, "big", signed=True)


@pytest.mark.parametrize("frame", [b"", b"\x00" * 7, b"\x00" * 9])
def test_sequence_frame_of_wrong_length(frame: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_seq(frame)
