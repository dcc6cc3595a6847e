"""The replica's engine: one asyncio task drives the shared step clock of the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from simulator.config import SimConfig, SimError
from simulator.kv_cache import KVCache
from simulator.metrics import EngineStats, Gauges
from simulator.scheduler import SchedRequest, Scheduler, State
from vllm_api.kv_events import KvEvent

# A step that overran by more than this (a blocked loop, a debugger) restarts the virtual clock
# instead of bursting tokens out to catch up.
MAX_LAG_S = 0.25


class EngineFailure(SimError):
    """A request failed inside the engine (restart, death, KV exhaustion)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "restart" | "dead" | "out_of_kv"


@dataclass(slots=True, eq=False)
class EngineRequest(SchedRequest):
    """A request plus what its HTTP handler waits on."""

    request_id: str = ""
    max_tokens: int = 16
    eos_after: int | None = None
    finish_reason: str | None = None
    error: EngineFailure | None = None
    want: int = 1
    waiter: asyncio.Future[None] | None = None
    t_arrival: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    m_first: float = 0.0
    m_last: float = 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(frozen=True, slots=True)
class ModelledTiming:
    """Per-request timing as the model scheduled it vs as the engine delivered it."""

    request_id: str
    tokens: int
    modelled_ttft: float
    modelled_itl: float
    engine_ttft: float
    engine_itl: float


class Engine:
    """Continuous batching over a paged KV cache on a virtual-deadline step clock."""

    def __init__(
        self,
        config: SimConfig,
        *,
        hash_seed: int = 0,
        publish: Callable[[list[KvEvent]], None] | None = None,
    ) -> None:
        self.config = config
        self.timing = config.timing
        self.cache = KVCache(
            config.num_gpu_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            hash_seed=hash_seed,
        )
        self.scheduler = Scheduler(
            self.cache, config.max_num_seqs, max(config.max_num_batched_tokens, 1)
        )
        self.stats = EngineStats()
        self.timings: deque[ModelledTiming] = deque(maxlen=100_000)
        self._publish = publish
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_start = 0.0
        # API-server CPU time (/metrics renders) owed by the next step, and all of it so far.
        self._debt = 0.0
        self.held_s = 0.0
        # Virtual time skipped by clock restarts (steps that overran by over MAX_LAG_S): it
        # lands in the modelled timings, so a test on them can tell it from the model's own.
        self.lagged_s = 0.0

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def gauges(self) -> Gauges:
        return Gauges(self.num_running, self.num_waiting, self.cache.usage)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle_start = self._loop.time()
        self._task = asyncio.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fail_all(EngineFailure("restart", "engine stopped"))

    def submit(self, req: EngineRequest) -> None:
        assert self._loop is not None, "engine not started"
        req.t_arrival = self._loop.time()
        if not self._wake.is_set():
            # Waking an idle engine: the first step starts at the arrival, not at the wake-up.
            self._idle_start = req.t_arrival
        self.scheduler.add(req)
        self._wake.set()

    async def wait(self, req: EngineRequest, want: int) -> None:
        """Until `want` tokens exist or the request is done (failed or finished)."""
        if req.done or req.num_generated >= want:
            return
        assert self._loop is not None
        req.want = want
        fut = req.waiter = self._loop.create_future()
        await fut

    def charge(self, seconds: float) -> None:
        """The API server spent `seconds` of CPU: the next step ends that much later.

        An idle engine owes nothing: the render ran on a CPU nothing else wanted."""
        if self.scheduler.running or self.scheduler.num_waiting:
            self._debt += seconds

    def finish(self, req: EngineRequest, reason: str) -> None:
        """End a request early (stop string matched, client gone -> "abort")."""
        if req.state is State.FINISHED:
            return
        self.scheduler.finish(req)
        req.finish_reason = req.finish_reason or reason
        self.stats.success[reason] = self.stats.success.get(reason, 0) + 1
        self._wake.set()

    def restart(self) -> None:
        """Abort everything, drop the cache (AllBlocksCleared) and start afresh."""
        self._fail_all(EngineFailure("restart", "engine restarted"))
        self.cache.clear()
        self._flush_events()

    def fail_all(self, kind: str, message: str) -> None:
        self._fail_all(EngineFailure(kind, message))

    def reset_prefix_cache(self) -> bool:
        """Like vLLM's: refused while requests hold blocks; AllBlocksCleared is only queued and
        goes out with the next step's batch (an idle replica publishes nothing until then)."""
        return self.cache.reset_prefix_cache()

    def _fail_all(self, exc: EngineFailure) -> None:
        for r in self.scheduler.clear():
            if isinstance(r, EngineRequest):
                self._fail(r, exc)

    def _fail(self, req: EngineRequest, exc: EngineFailure) -> None:
        req.error = exc
        req.state = State.FINISHED
        self.stats.success["error"] += 1
        w = req.waiter
        if w is not None and not w.done():
            w.set_result(None)
        req.waiter = None

    def _flush_events(self) -> None:
        events = self.cache.drain_events()
        if events and self._publish is not None:
            self._publish(events)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sched = self.scheduler
        # A request submitted before this task first ran set _idle_start to its arrival.
        deadline = self._idle_start
        while True:
            if not sched.running and not sched.num_waiting:
                self._wake.clear()
                await self._wake.wait()  # idle replicas do not spin
                deadline = self._idle_start
            plan = sched.schedule()
            for r in plan.rejected:
                if isinstance(r, EngineRequest):
                    self._fail(r, EngineFailure("out_of_kv", "prompt exceeds the KV cache"))
            self.stats.preemptions += len(plan.preempted)
            self._flush_events()
            if not sched.running:
                if not plan.preempted and not plan.rejected:
                    self._wake.clear()
                    await self._wake.wait()
                    deadline = loop.time()
                continue
            if self.config.lora_adapters:
                # vLLM sets the gauge once per step; each label set keeps its last timestamp.
                self.stats.lora_info[sched.lora_names()] = time.time()
            now = loop.time()
            for r in plan.admitted:
                if r.num_preemptions == 0:
                    self.stats.queue.observe_n(now - r.t_arrival)  # type: ignore[attr-defined]
                    self.stats.prompt_tokens += len(r.prompt_ids)
                    self.stats.prefix_queries += len(r.prompt_ids)
                    self.stats.prefix_hits += r.num_cached_tokens or 0
            # The API server's renders since the last step took their CPU time from this one.
            dur = self.timing.step_s(plan.num_running, plan.prefill_tokens) + self._debt
            self.held_s += self._debt
            self._debt = 0.0
            if deadline < now - MAX_LAG_S:
                self.lagged_s += now - MAX_LAG_S - deadline
                deadline = now - MAX_LAG_S
            deadline += dur
            delay = deadline - now
            # Sleeping to the virtual deadline absorbs our own overhead instead of adding it.
            await asyncio.sleep(delay if delay > 0 else 0)
            if plan.admitted and plan.prefill_tokens:
                self.stats.prefill.observe_n(self.timing.prefill_s(plan.prefill_tokens))
            self._deliver(loop.time(), deadline)

    def _deliver(self, now: float, modelled: float) -> None:
        stats = self.stats
        finished: list[EngineRequest] = []
        decoding = 0
        itl = 0.0
        for r in self.scheduler.running:
            assert isinstance(r, EngineRequest)
            r.num_generated += 1
            n = r.num_generated
            if n == 1:
                r.t_first = now
                r.m_first = modelled
                stats.ttft.observe_n(now - r.t_arrival)
            else:
                decoding += 1
                itl = now - r.t_last
            r.t_last = now
            r.m_last = modelled
            if n >= r.max_tokens:
                r.finish_reason = "length"
                finished.append(r)
            elif r.eos_after is not None and n >= r.eos_after:
                r.finish_reason = "stop"
                finished.append(r)
            w = r.waiter
            if w is not None and (n >= r.want or r.finish_reason is not None):
                r.waiter = None
                if not w.done():
                    w.set_result(None)
        stats.generation_tokens += len(self.scheduler.running)
        if decoding:
            stats.itl.observe_n(itl, decoding)
        for r in finished:
            self.scheduler.finish(r)
            stats.success[r.finish_reason or "stop"] += 1
            stats.e2e.observe_n(now - r.t_arrival)
            n = r.num_generated
            self.timings.append(
                ModelledTiming(
                    r.request_id,
                    n,
                    r.m_first - r.t_arrival,
                    (r.m_last - r.m_first) / (n - 1) if n > 1 else 0.0,
                    r.t_first - r.t_arrival,
                    (r.t_last - r.t_first) / (n - 1) if n > 1 else 0.0,
                )
            )
