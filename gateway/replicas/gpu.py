"""GPU memory and utilisation: worker heartbeats, or NVML read directly on the GPU host."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from gateway.errors import BadRequest
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.state import ReplicaState

log = logging.getLogger("llm_gateway.gpu")

# NVML is cheap but synchronous; once a second is plenty for scores that move on that scale.
NVML_INTERVAL_S = 1.0


def apply_heartbeat(pool: ReplicaPool, data: Any) -> ReplicaState:
    """Validate a worker heartbeat and record it; BadRequest names the faulty field.

    It carries GPU figures (all three fields), the replica's liveness as its agent sees it
    (`vllm_healthy`, from an agent without a GPU reader), or both.
    """
    if not isinstance(data, Mapping):
        raise BadRequest("The heartbeat must be a JSON object.")
    name = data.get("replica")
    if not isinstance(name, str) or name not in pool.replicas:
        raise BadRequest("`replica` must name a configured replica.", param="replica")
    alive = data.get("vllm_healthy")
    if alive is not None and not isinstance(alive, bool):
        raise BadRequest("`vllm_healthy` must be true or false.", param="vllm_healthy")
    gpu_keys = ("gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization")
    has_gpu = any(k in data for k in gpu_keys)
    if not has_gpu and alive is None:
        raise BadRequest(
            "The heartbeat needs GPU figures or `vllm_healthy`.", param="gpu_memory_used_bytes"
        )
    replica = pool[name]
    now = time.monotonic()
    if has_gpu:
        frac, util = _gpu_figures(data)
        replica.gpu_mem_used_frac = frac
        replica.gpu_util = util
        replica.gpu_seen_at = now
    if alive is not None:
        replica.agent_vllm_healthy = alive
        replica.agent_seen_at = now
    return replica


def _gpu_figures(data: Mapping[str, Any]) -> tuple[float, float]:
    used, total = data.get("gpu_memory_used_bytes"), data.get("gpu_memory_total_bytes")
    util = data.get("gpu_utilization")
    for key, value in (("gpu_memory_used_bytes", used), ("gpu_memory_total_bytes", total)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"`{key}` must be a non-negative integer.", param=key)
    assert isinstance(used, int) and isinstance(total, int)
    if total == 0 or used > total:
        raise BadRequest(
            "`gpu_memory_total_bytes` must be > 0 and >= used.", param="gpu_memory_total_bytes"
        )
    if isinstance(util, bool) or not isinstance(util, int | float) or not 0 <= util <= 1:
        raise BadRequest("`gpu_utilization` must be a number in [0, 1].", param="gpu_utilization")
    return used / total, float(util)


class NvmlUnavailable(Exception):
    """No NVML here (no library, or no driver); the message says which."""


def open_nvml() -> Any:
    """The pynvml module, initialised; NvmlUnavailable when the host has none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
        raise NvmlUnavailable(f"{type(exc).__name__}: {exc}") from None
    return pynvml


def read_nvml(nv: Any, indices: tuple[int, ...]) -> tuple[int, int, float]:
    """Bytes used, bytes in all and mean utilisation (0..1) over the devices (blocking)."""
    used = total = 0
    util = 0.0
    for i in indices:
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        used, total = used + int(mem.used), total + int(mem.total)
        util += nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
    return used, total, util / len(indices)


class Nvml:
    """NVML when a driver is present; `available` False (and one log line) otherwise."""

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        try:
            self._nvml = open_nvml()
            self.available = True
        except NvmlUnavailable as exc:
            self.reason = str(exc)
            log.info("NVML unavailable (%s); GPU scores fall back to vLLM metrics", self.reason)

    def read(self, indices: tuple[int, ...]) -> tuple[float, float]:
        """(memory used fraction, utilisation 0..1) over the given devices."""
        used, total, util = read_nvml(self._nvml, indices)
        return used / total, util

    async def run(self, pool: ReplicaPool) -> None:
        """Sample every replica that names its GPUs, forever (cancelled by the owner)."""
        local = [r for r in pool if r.config.gpu_indices]
        while local:
            for replica in local:
                try:
                    frac, util = await asyncio.to_thread(self.read, replica.config.gpu_indices)
                except Exception as exc:  # a device vanished: keep the last value, ageing
                    log.warning("NVML read for %s failed: %s", replica.name, exc)
                    continue
                replica.gpu_mem_used_frac, replica.gpu_util = frac, util
                replica.gpu_seen_at = time.monotonic()
            await asyncio.sleep(NVML_INTERVAL_S)
