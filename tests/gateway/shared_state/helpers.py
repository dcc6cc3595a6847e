"""What the shared-state tests read off a gateway: where a request went, and by which branch."""

from __future__ import annotations

import re

from gateway.shared_state.quota import RedisQuotaStore
from gateway.shared_state.state import SharedState
from tests.gateway.conftest import MODEL, InProcessGateway, eventually

_DECISION = re.compile(
    rb'^llm_gateway_routing_decisions_total\{branch="([^"]+)",replica="([^"]+)"\} (\S+)$', re.M
)


def decisions(gw: InProcessGateway) -> dict[tuple[str, str], float]:
    """(replica, branch) -> routing decisions so far."""
    text = gw.runtime.metrics.render()
    return {(r.decode(), b.decode()): float(n) for b, r, n in _DECISION.findall(text)}


def chat(session: str, turns: int, system: str = "You are terse.") -> dict[str, object]:
    """A conversation's request at `turns` user turns (each earlier one answered)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"{session} question {t} " * 8})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {t} " * 8})
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


async def routed(
    gw: InProcessGateway, body: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[str, str]:
    """Send `body` (alone: nothing else in flight) and return (replica, branch) it took."""
    # The others' ends arrive with their next flush: let their last requests' go first.
    await eventually(lambda: not any(r.remote_in_flight for r in gw.runtime.pool), what="quiet")
    before = decisions(gw)
    r = await gw.client.post("/v1/chat/completions", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    after = decisions(gw)
    moved = [k for k, n in after.items() if n > before.get(k, 0.0)]
    assert len(moved) == 1, moved
    return moved[0]


def shared(gw: InProcessGateway) -> SharedState:
    """The gateway's shared-state component (the test configured one)."""
    state = gw.runtime.shared_state
    assert state is not None
    return state


def store(gw: InProcessGateway) -> RedisQuotaStore:
    """The gateway's Redis quota store (the test configured tenants with quotas)."""
    found = gw.runtime.tenancy.store
    assert isinstance(found, RedisQuotaStore)
    return found


def up_gauge(gw: InProcessGateway) -> float:
    """llm_gateway_shared_state_up as /metrics reports it."""
    text = gw.runtime.metrics.render().decode()
    line = next(x for x in text.splitlines() if x.startswith("llm_gateway_shared_state_up "))
    return float(line.split()[1])
