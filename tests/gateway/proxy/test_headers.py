"""Headers across the gateway, in-process, checked by a recording upstream on a real socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.config import GatewayConfig, ReplicaConfig, ServerConfig, UpstreamConfig
from gateway.proxy.headers import ForwardPolicy, upstream_request_headers
from tests.gateway.aiohttp_upstream import replica_app, serve
from tests.gateway.conftest import in_process


@pytest.fixture
async def recording_upstream() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response(
            {"id": "chatcmpl-1", "choices": []},
            headers={"Keep-Alive": "timeout=5", "Proxy-Connection": "x", "X-Upstream": "1"},
        )

    async with serve(replica_app(chat)) as url:
        yield url, seen


async def test_hop_by_hop_and_credentials(
    recording_upstream: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = recording_upstream
    cfg = GatewayConfig(
        server=ServerConfig(port=0),
        upstream=UpstreamConfig(api_key="upstream-key"),
        replicas=(ReplicaConfig(url=url, name="rec", models=("m",)),),
    )
    async with in_process(cfg) as gw:
        r = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "Authorization": "Bearer client-secret",
                "Connection": "keep-alive, X-Drop-Me",
                "X-Drop-Me": "1",
                "Keep-Alive": "timeout=9",
                "TE": "trailers",
                "X-Request-Id": "rid-7",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        )
        assert r.status_code == 200
        up = seen[-1]
        assert up["authorization"] == "Bearer upstream-key"
        assert "client-secret" not in str(up)
        for hop in ("x-drop-me", "keep-alive", "te", "proxy-connection"):
            assert hop not in up, hop
        assert up["x-request-id"] == "rid-7"
        assert up["traceparent"].startswith("00-0af7651916cd43dd")
        # Back to the client: upstream hop-by-hop headers are gone, the rest and the id remain.
        assert r.headers["x-upstream"] == "1"
        assert "proxy-connection" not in r.headers and "keep-alive" not in r.headers
        assert r.headers["x-request-id"] == "rid-7"


CLIENT_HEADERS = {
    "Authorization": "Bearer client-secret",
    "Cookie": "session=abc",
    "X-Api-Key": "client-api-key",
    "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
    "X-Forwarded-For": "6.6.6.6",
    "X-Forwarded-Proto": "https",
    "X-Custom": "kept",
}


async def _forwarded(url: str, seen: list[dict[str, str]], server: ServerConfig) -> dict[str, str]:
    cfg = GatewayConfig(
        server=server, replicas=(ReplicaConfig(url=url, name="rec", models=("m",)),)
    )
    async with in_process(cfg) as gw:
        r = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            headers=CLIENT_HEADERS,
        )
        assert r.status_code == 200
    return seen[-1]


async def test_credentials_and_forwarded_claims_stay_at_the_gateway(
    recording_upstream: tuple[str, list[dict[str, str]]],
) -> None:
    up = await _forwarded(*recording_upstream, ServerConfig(port=0))
    for name in ("authorization", "cookie", "x-api-key", "proxy-authorization"):
        assert name not in up, name
    for secret in ("client-secret", "session=abc", "client-api-key", "cHJveHk6"):
        assert secret not in str(up)
    # The client's own X-Forwarded-* is replaced: httpx's ASGI client is 127.0.0.1.
    assert up["x-forwarded-for"] == "127.0.0.1"
    assert up["x-forwarded-proto"] == "http"
    assert up["x-custom"] == "kept"


async def test_forward_headers_lets_named_credentials_through(
    recording_upstream: tuple[str, list[dict[str, str]]],
) -> None:
    server = ServerConfig(port=0, forward_headers=("Cookie", "authorization"))
    up = await _forwarded(*recording_upstream, server)
    assert up["cookie"] == "session=abc"
    assert up["authorization"] == "Bearer client-secret"  # no [upstream] api_key to replace it
    assert "x-api-key" not in up and "proxy-authorization" not in up


async def test_a_trusted_proxy_s_forwarded_chain_is_appended_to(
    recording_upstream: tuple[str, list[dict[str, str]]],
) -> None:
    up = await _forwarded(
        *recording_upstream, ServerConfig(port=0, trusted_proxies=("127.0.0.0/8",))
    )
    assert up["x-forwarded-for"] == "6.6.6.6, 127.0.0.1"
    assert up["x-forwarded-proto"] == "https"


def test_forward_policy_edges() -> None:
    policy = ForwardPolicy((), ("10.0.0.0/8", "fd00::/8"))
    headers = [
        (b"connection", b"keep-alive, x-secret-hop"),
        (b"x-secret-hop", b"1"),
        (b"x-forwarded-for", b"1.1.1.1"),
        (b"x-forwarded-for", b"2.2.2.2"),
        (b"te", b"trailers"),
        (b"accept", b"*/*"),
    ]
    out = dict(policy.apply(headers, "fd00::5", "http"))
    assert out == {
        b"accept": b"*/*",
        b"x-forwarded-for": b"1.1.1.1, 2.2.2.2, fd00::5",
        b"x-forwarded-proto": b"http",
    }
    assert dict(policy.apply(headers, "11.0.0.1", "https"))[b"x-forwarded-for"] == b"11.0.0.1"
    # No peer (a unix socket): nothing to claim, the client's chain still dropped.
    assert b"x-forwarded-for" not in dict(policy.apply(headers, None, "http"))
    # Taken as they are upstream; an unvetted list gets the default drops.
    assert (
        upstream_request_headers(policy.apply(headers, "10.1.1.1", "http"), "r", "")[
            "x-forwarded-for"
        ]
        == "1.1.1.1, 2.2.2.2, 10.1.1.1"
    )
    raw = upstream_request_headers([(b"cookie", b"c"), (b"x-forwarded-for", b"9.9.9.9")], "r", "")
    assert raw == {"x-request-id": "r"}


@pytest.mark.parametrize(
    "server",
    [
        {"forward_headers": ("host",)},
        {"forward_headers": ("Transfer-Encoding",)},
        {"forward_headers": ("x-forwarded-for",)},
        {"trusted_proxies": ("10.0.0.0/33",)},
        {"trusted_proxies": ("proxy.internal",)},
    ],
)
def test_forwarding_config_is_checked(server: dict[str, tuple[str, ...]]) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**server)  # type: ignore[arg-type]
