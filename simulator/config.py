"""Configuration values of the simulated fleet: every knob, with defaults, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from simulator.timing import (
    DECODE_BASE_MS,
    DECODE_PER_SEQ_MS,
    METRICS_COST_MS,
    PREFILL_BASE_MS,
    PREFILL_PER_TOKEN_MS,
    TimingModel,
)

RUNNERS = ("generate", "pooling", "transcription")


class SimError(Exception):
    """Root error of the simulator package."""


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault switches of one replica; all off by default."""

    error_rate: float = 0.0
    error_status: int = 500
    reset_before_first_byte: bool = False
    reset_after_tokens: int | None = None
    stall_seconds: float = 0.0
    stall_after_tokens: int | None = None
    unhealthy: bool = False
    slow_start_seconds: float = 0.0
    dead: bool = False
    out_of_kv: bool = False
    # /load as vLLM 0.32 serves it without --enable-server-load-tracking ({"server_load": 0}
    # always), or absent (404) as a build without the route.
    load_untracked: bool = False
    load_absent: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise SimError("error_rate must be within [0, 1]")
        if not 400 <= self.error_status <= 599:
            raise SimError("error_status must be a 4xx or 5xx status")
        if self.stall_seconds < 0 or self.slow_start_seconds < 0:
            raise SimError("durations must be >= 0")
        for name in ("reset_after_tokens", "stall_after_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SimError(f"{name} must be a non-negative int or null")

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def updated(self, patch: dict[str, Any]) -> Faults:
        """Partial update from a JSON object; unknown fields or wrong types raise SimError."""
        known = {f.name: f for f in fields(self)}
        for key, value in patch.items():
            if key not in known:
                raise SimError(f"unknown fault field: {key}")
            if not _type_ok(getattr(Faults(), key), key, value):
                raise SimError(f"bad value for fault field {key}: {value!r}")
        kwargs = {
            k: (float(v) if isinstance(getattr(self, k), float) else v) for k, v in patch.items()
        }
        return replace(self, **kwargs)  # type: ignore[arg-type]


_OPTIONAL_INT = ("reset_after_tokens", "stall_after_tokens")


def _type_ok(default: Any, key: str, value: Any) -> bool:
    if key in _OPTIONAL_INT:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return False


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Every knob of a simulated replica (the fleet gives each replica its own seed and ports)."""

    model: str = "sim-llama-3-8b"
    lora_adapters: tuple[str, ...] = ()
    max_lora: int = 4
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 4096
    enable_prefix_caching: bool = True
    time_scale: float = 1.0
    stream_interval: int = 1
    seed: int = 0
    tokenizer: str | None = None
    kv_events: bool = True
    kv_events_endpoint: str = "tcp://127.0.0.1:*"
    kv_events_topic: str = "kv"
    replay: bool = True
    replay_buffer_steps: int = 10_000
    enable_prompt_tokens_details: bool = True
    eos_after_tokens: int | None = None
    decode_base_ms: float = DECODE_BASE_MS
    decode_per_seq_ms: float = DECODE_PER_SEQ_MS
    prefill_base_ms: float = PREFILL_BASE_MS
    prefill_per_token_ms: float = PREFILL_PER_TOKEN_MS
    # Each /metrics request holds the API server this long, pushing the engine's next step
    # back (time_scale applies): a replica scraped often streams slower, as vLLM does.
    metrics_cost_ms: float = METRICS_COST_MS
    # vLLM keeps Responses (store, GET, cancel, previous_response_id) only with
    # VLLM_ENABLE_RESPONSES_API_STORE=1, as the real CPU fleet runs; off, store is ignored.
    responses_store: bool = True
    # vLLM's store grows without bound; the simulator's drops the oldest beyond this many.
    responses_store_size: int = 10_000
    # vLLM's --runner: "generate" serves the generation routes, "pooling" (an embedding model,
    # --convert embed) /v1/embeddings and /pooling instead; each answers the other's with 404.
    # "transcription": a Whisper-type model (supports_transcription_only), whose only task is
    # transcription: vLLM registers /v1/audio/transcriptions, /translations and /v1/realtime,
    # and none of the generation routes.
    runner: str = "generate"
    # A pooling replica's vector size, and whether it takes `dimensions` (Matryoshka).
    embedding_size: int = 64
    matryoshka: bool = False
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_gpu_blocks <= 0 or self.max_num_seqs <= 0:
            raise SimError("block_size, num_gpu_blocks and max_num_seqs must be > 0")
        if self.stream_interval < 1:
            raise SimError("stream_interval must be >= 1")
        if self.time_scale <= 0:
            raise SimError("time_scale must be > 0")
        if self.max_model_len <= 0 or self.max_num_batched_tokens <= 0:
            raise SimError("max_model_len and max_num_batched_tokens must be > 0")
        if self.metrics_cost_ms < 0:
            raise SimError("metrics_cost_ms must be >= 0")
        if self.responses_store_size < 1:
            raise SimError("responses_store_size must be >= 1")
        if self.runner not in RUNNERS:
            raise SimError("runner must be 'generate', 'pooling' or 'transcription'")
        if self.embedding_size < 1:
            raise SimError("embedding_size must be >= 1")

    @property
    def timing(self) -> TimingModel:
        return TimingModel(
            decode_base_ms=self.decode_base_ms,
            decode_per_seq_ms=self.decode_per_seq_ms,
            prefill_base_ms=self.prefill_base_ms,
            prefill_per_token_ms=self.prefill_per_token_ms,
            time_scale=self.time_scale,
            metrics_cost_ms=self.metrics_cost_ms,
        )
