"""Continuous-batching scheduler: waiting queue by (priority, arrival), bounded running set."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import Enum

from simulator.kv_cache import Allocation, KVCache


class State(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class SchedRequest:
    """Scheduling state of one request (mutated only by the Scheduler and the engine)."""

    prompt_ids: list[int]
    hashes: list[int]
    priority: int = 0
    lora_name: str | None = None
    lora_id: int | None = None  # vLLM's LoRARequest.lora_int_id, for KV events
    cache_salt: str | None = None
    arrival: int = 0
    num_generated: int = 0
    num_preemptions: int = 0
    alloc: Allocation | None = None
    num_cached_tokens: int | None = None  # set at first admission; what usage reports
    state: State = State.WAITING

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + self.num_generated


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one engine step does: who was admitted (prefilled), preempted or rejected."""

    admitted: tuple[SchedRequest, ...] = ()
    preempted: tuple[SchedRequest, ...] = ()
    rejected: tuple[SchedRequest, ...] = ()
    prefill_tokens: int = 0
    cached_tokens: int = 0
    num_running: int = 0


@dataclass(slots=True)
class Scheduler:
    """Admits waiting requests while seats and KV blocks allow; preempts when decode can't grow."""

    cache: KVCache
    max_num_seqs: int
    max_num_batched_tokens: int = 8192
    running: list[SchedRequest] = field(default_factory=list)
    _waiting: list[tuple[int, int, SchedRequest]] = field(default_factory=list)
    _num_waiting: int = 0
    _arrivals: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self.running)

    def lora_names(self) -> tuple[str, str]:
        """Adapters of the running and of the waiting requests, as vLLM's comma-joined labels."""
        running = {r.lora_name for r in self.running if r.lora_name}
        waiting = {r.lora_name for _, _, r in self._waiting if r.lora_name}
        return ",".join(sorted(running)), ",".join(sorted(waiting))

    def add(self, req: SchedRequest) -> None:
        req.arrival = next(self._arrivals)
        self._push(req)

    def abort(self, req: SchedRequest) -> None:
        """Remove at once, freeing blocks (waiting entries are dropped lazily from the heap)."""
        if req.state is State.RUNNING:
            self.running.remove(req)
            self._release(req)
        elif req.state is State.WAITING:
            self._num_waiting -= 1
        req.state = State.FINISHED

    def finish(self, req: SchedRequest) -> None:
        self.abort(req)

    def clear(self) -> list[SchedRequest]:
        """Drop every request (engine restart); returns them so callers can fail them."""
        dropped = list(self.running)
        dropped += [r for _, _, r in self._waiting if r.state is State.WAITING]
        for r in dropped:
            self._release(r)
            r.state = State.FINISHED
        self.running.clear()
        self._waiting.clear()
        self._num_waiting = 0
        return dropped

    def schedule(self) -> StepPlan:
        preempted = self._grow_running()
        admitted: list[SchedRequest] = []
        rejected: list[SchedRequest] = []
        prefill = cached = 0
        # As in vLLM, nothing new is admitted in a step that had to preempt.
        while not preempted and self._waiting and len(self.running) < self.max_num_seqs:
            _, _, head = self._waiting[0]
            if head.state is not State.WAITING:
                heapq.heappop(self._waiting)
                continue
            n = head.num_tokens
            if self.cache.blocks_for(n) > self.cache.num_blocks:
                self._pop_waiting()
                head.state = State.FINISHED
                rejected.append(head)
                continue
            hit = self.cache.match(head.hashes, n) * self.cache.block_size
            if admitted and prefill + n - hit > self.max_num_batched_tokens:
                break
            alloc = self.cache.allocate(
                head.prompt_ids,
                head.hashes,
                n,
                head.lora_name,
                lora_id=head.lora_id,
                cache_salt=head.cache_salt,
            )
            if alloc is None:
                break  # FIFO: the head waits for blocks, nobody overtakes it
            self._pop_waiting()
            head.alloc = alloc
            head.state = State.RUNNING
            if head.num_cached_tokens is None:
                head.num_cached_tokens = alloc.num_cached_tokens
            self.running.append(head)
            admitted.append(head)
            prefill += n - alloc.num_cached_tokens
            cached += alloc.num_cached_tokens
        return StepPlan(
            tuple(admitted), tuple(preempted), tuple(rejected), prefill, cached, len(self.running)
        )

    def _grow_running(self) -> list[SchedRequest]:
        preempted: list[SchedRequest] = []
        for req in list(self.running):
            if req.state is not State.RUNNING or req.alloc is None:
                continue
            while not self.cache.grow(req.alloc, req.num_tokens):
                victim = max(self.running, key=lambda r: (r.priority, r.arrival))
                self.running.remove(victim)
                self._release(victim)
                victim.num_preemptions += 1
                self._push(victim)  # recompute later; its early arrival keeps it near the front
                preempted.append(victim)
                if victim is req:
                    break
        return preempted

    def _push(self, req: SchedRequest) -> None:
        req.state = State.WAITING
        heapq.heappush(self._waiting, (req.priority, req.arrival, req))
        self._num_waiting += 1

    def _pop_waiting(self) -> None:
        heapq.heappop(self._waiting)
        self._num_waiting -= 1

    def _release(self, req: SchedRequest) -> None:
        if req.alloc is not None:
            self.cache.free(req.alloc)
            req.alloc = None
