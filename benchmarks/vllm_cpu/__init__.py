"""Real vLLM (CPU build) for tests and benchmarks: engine env, tiny models, replica launcher."""

from benchmarks.vllm_cpu.engine_env import (
    VLLM_VERSION,
    EngineEnv,
    VllmCpuError,
    cache_root,
    ensure_audio,
    ensure_engine,
)
from benchmarks.vllm_cpu.fleet import VllmFleet, VllmReplica
from benchmarks.vllm_cpu.lora import LORA_NAME
from benchmarks.vllm_cpu.model import MODEL_NAME, ensure_model, lora_dir, model_dir
from benchmarks.vllm_cpu.whisper_model import WHISPER_NAME, ensure_whisper, whisper_dir

__all__ = [
    "LORA_NAME",
    "MODEL_NAME",
    "VLLM_VERSION",
    "WHISPER_NAME",
    "EngineEnv",
    "VllmCpuError",
    "VllmFleet",
    "VllmReplica",
    "cache_root",
    "ensure_audio",
    "ensure_engine",
    "ensure_model",
    "ensure_whisper",
    "lora_dir",
    "model_dir",
    "whisper_dir",
]
