from simulator.kv_cache import KVCache
from simulator.scheduler import SchedRequest, Scheduler, State


def _req(cache: KVCache, n: int, priority: int = 0, base: int = 0) -> SchedRequest:
    ids = list(range(base, base + n))
    return SchedRequest(prompt_ids=ids, hashes=cache.block_hashes(ids), priority=priority)


def test_running_set_is_capped_by_max_num_seqs() -> None:
    cache = KVCache(1000, 16)
    s = Scheduler(cache, max_num_seqs=3)
    reqs = [_req(cache, 20, base=i * 100) for i in range(5)]
    for r in reqs:
        s.add(r)
    plan = s.schedule()
    assert len(plan.admitted) == 3 and s.num_running == 3 and s.num_waiting == 2
    assert plan.prefill_tokens == 60
    s.finish(reqs[0])
    assert s.schedule().admitted == (reqs[3],)


def test_priority_then_arrival_order() -> None:
    cache = KVCache(1000, 16)
    s = Scheduler(cache, max_num_seqs=1)
    low, high, high2 = _req(cache, 5, 5, 0), _req(cache, 5, -1, 100), _req(cache, 5, -1, 200)
    for r in (low, high, high2):
        s.add(r)
    order = []
    for _ in range(3):
        (adm,) = s.schedule().admitted
        order.append(adm)
        s.finish(adm)
    assert order == [high, high2, low]


def test_full_cache_makes_requests_wait_fifo() -> None:
    cache = KVCache(4, 4)
    s = Scheduler(cache, max_num_seqs=8)
    big, small = _req(cache, 12, base=0), _req(cache, 2, base=50)
    blocker = _req(cache, 8, base=100)
    s.add(blocker)
    s.schedule()
    s.add(big)
    s.add(small)
    plan = s.schedule()
    # big needs 3 blocks, 2 are free: it waits, and small may not overtake it.
    assert plan.admitted == () and s.num_waiting == 2
    s.finish(blocker)
    assert s.schedule().admitted == (big, small)


def test_decode_out_of_blocks_preempts_latest_arrival_and_requeues() -> None:
    cache = KVCache(4, 4)
    s = Scheduler(cache, max_num_seqs=8)
    a, b = _req(cache, 4, base=0), _req(cache, 4, base=10)
    s.add(a)
    s.add(b)
    assert len(s.schedule().admitted) == 2  # 1 block each, 2 free
    for r in (a, b):
        r.num_generated = 5  # 9 tokens each -> 3 blocks each, 6 > 4
    plan = s.schedule()
    assert plan.preempted == (b,) and b.state is State.WAITING and b.num_preemptions == 1
    assert s.num_running == 1 and a.alloc is not None and len(a.alloc.blocks) == 3
    s.finish(a)
    plan = s.schedule()
    # Recompute prompt + output, minus its prompt block that stayed cached.
    assert plan.admitted == (b,) and plan.prefill_tokens == 5 and plan.cached_tokens == 4


def test_abort_frees_blocks_immediately() -> None:
    cache = KVCache(8, 4)
    s = Scheduler(cache, max_num_seqs=8)
    r = _req(cache, 10)
    s.add(r)
    s.schedule()
    assert cache.num_free == 5
    s.abort(r)
    assert cache.num_free == 8 and s.num_running == 0
    w = _req(cache, 3, base=40)
    s.add(w)
    s.abort(w)
    assert s.num_waiting == 0 and s.schedule().admitted == ()
