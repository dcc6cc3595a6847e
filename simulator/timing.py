"""Step-time model of one vLLM replica (8B-class model, one H100, BF16)."""

from __future__ import annotations

from dataclasses import dataclass

# All defaults come from the "Latency model for a simulator" section of
# /work/shared/reference/vllm.md:
# - decode step t0 + a*B, "t0 8-10 ms, a 0.03-0.06 ms per running sequence" -> 9 ms, 0.045 ms
#   (gives ~9.5 ms ITL at B=10 and ~18 ms at B=200, and ~13k tok/s near saturation);
# - "a prefill chunk adds about 25 ms + 0.1-0.25 ms per uncached token" -> 25 ms, 0.2 ms
#   (a 256-token cold prompt: 25 + 51 + 9 = 85 ms TTFT, inside the quoted 60-120 ms).
DECODE_BASE_MS = 9.0
DECODE_PER_SEQ_MS = 0.045
PREFILL_BASE_MS = 25.0
PREFILL_PER_TOKEN_MS = 0.2
# CPU time of one /metrics render (~53 KB) in vLLM's API server, the process that streams the
# tokens: 5.4-6.9 ms measured on vLLM 0.32.0's CPU build ("Cost of a /metrics scrape" in
# docs/vllm-cpu.md). A GPU host's API server has its cores to itself, so CPU time is the stall.
METRICS_COST_MS = 6.5


@dataclass(frozen=True, slots=True)
class TimingModel:
    """Durations in wall-clock seconds; `time_scale` k runs the whole clock k times faster."""

    decode_base_ms: float = DECODE_BASE_MS
    decode_per_seq_ms: float = DECODE_PER_SEQ_MS
    prefill_base_ms: float = PREFILL_BASE_MS
    prefill_per_token_ms: float = PREFILL_PER_TOKEN_MS
    time_scale: float = 1.0
    metrics_cost_ms: float = METRICS_COST_MS

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.metrics_cost_ms < 0:
            raise ValueError("metrics_cost_ms must be >= 0")

    def metrics_s(self) -> float:
        """One /metrics render."""
        return self.metrics_cost_ms / (1000.0 * self.time_scale)

    def decode_s(self, num_running: int) -> float:
        """One decode step for `num_running` sequences."""
        return (self.decode_base_ms + self.decode_per_seq_ms * num_running) / (
            1000.0 * self.time_scale
        )

    def prefill_s(self, uncached_tokens: int) -> float:
        """Extra step time to prefill `uncached_tokens` (0 when nothing is prefilled)."""
        if uncached_tokens <= 0:
            return 0.0
        return (self.prefill_base_ms + self.prefill_per_token_ms * uncached_tokens) / (
            1000.0 * self.time_scale
        )

    def step_s(self, num_running: int, uncached_tokens: int) -> float:
        """A step = one decode for every running sequence plus the prefill admitted with it."""
        return self.decode_s(num_running) + self.prefill_s(uncached_tokens)
