"""No event-loop callback of the hot path takes over 1 ms of CPU (issue 17), and the check bites."""

from __future__ import annotations

from benchmarks.overhead_loop import LIMIT_MS, check


async def test_no_callback_holds_the_loop_over_1_ms_per_request() -> None:
    rows = await check((1, 16), requests=400)
    for r in rows:
        # A request is several callbacks (its task's steps, its sockets' reads): all timed.
        assert r.callbacks > 2 * r.requests
        # A few in a thousand may pass the limit: on two shared cores a hyperthread sibling's
        # load can double a callback's CPU time (seen: a 2.4 ms socket read, with the usual
        # maximum 0.7 ms; in a clean-clone CI run, 4 request steps of 1.03-1.18 ms among 3,431
        # callbacks). A blocking step is in every request (the test below): over one in ten.
        assert r.p99_ms < LIMIT_MS, (r.concurrency, r.slow)
        assert r.over_limit <= r.callbacks // 200, (r.concurrency, LIMIT_MS, r.slow)


async def test_a_blocking_step_in_a_request_is_caught_and_named() -> None:
    (row,) = await check((1,), requests=20, inject_ms=2.0)
    assert row.over_limit >= 20 and row.max_ms > 2.0
    # Each request's own task step: attributed to the request, not to the loop at large.
    named = [line for line in row.slow if line.endswith("task RequestResponseCycle.run_asgi")]
    assert len(named) >= 20, row.slow


async def test_long_prompts_keep_the_loop_within_bounds() -> None:
    # One request in 8 with an 8k-token prompt. What stays on the loop grows with the prompt:
    # the prefix index records ~500 blocks per answer (0.3-0.6 ms, and a few ms when its dicts
    # resize: benchmarks/results/2026-12-03-hotpath/analysis.md), so a handful of such steps
    # may pass 1 ms, and on two shared cores they come in bursts under other jobs' load. A 2 ms
    # step in every long request (tried: a busy loop in Affinity.lookup) puts all 50 over it:
    # a p99 of 2.5 ms.
    (row,) = await check((16,), requests=400, long_every=8)
    assert row.callbacks > 2 * row.requests
    assert row.p99_ms < LIMIT_MS, row.slow
    assert row.over_limit <= row.requests // 20, (row.over_limit, row.slow)
