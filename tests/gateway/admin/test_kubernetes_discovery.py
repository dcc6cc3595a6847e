"""Kubernetes discovery against a stand-in API server: ready endpoints become replicas."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.admin.config import DiscoveryConfig
from gateway.admin.kubernetes import KubernetesDiscovery, ListError, in_cluster_url, ready_addresses
from gateway.config import parse_config
from gateway.config_loader import ConfigError
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.admin.conftest import fleet_config, removed_while_busy, started
from tests.gateway.admin.load import StreamingLoad
from tests.gateway.admin.test_discovery import _two_hosts
from tests.gateway.conftest import eventually

SERVICE = "vllm"
NAMESPACE = "llm"
SELECTOR = f"kubernetes.io/service-name={SERVICE}"


def endpoint_slices(endpoints: dict[str, bool | None]) -> dict[str, Any]:
    """An EndpointSliceList as the API answers it: one slice, one endpoint per address."""
    items = [
        {
            "metadata": {
                "name": f"{SERVICE}-abcde",
                "labels": {"kubernetes.io/service-name": SERVICE},
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": [address], "conditions": {} if ready is None else {"ready": ready}}
                for address, ready in endpoints.items()
            ],
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        }
    ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSliceList",
        "metadata": {"resourceVersion": "1"},
        "items": items,
    }


class ApiServer:
    """The EndpointSlice list endpoint over a real socket; its answer is changed by the test."""

    def __init__(self) -> None:
        self.token = "token-1"
        self.endpoints: dict[str, bool | None] = {}
        self.status = 200  # anything else: that status instead of the list
        self.asked: list[int] = []  # the status of each answer given
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            status, body = 401, {"kind": "Status", "reason": "Unauthorized", "code": 401}
        elif request.match_info["namespace"] != NAMESPACE:
            status, body = 404, {"kind": "Status", "reason": "NotFound", "code": 404}
        elif request.query.get("labelSelector") != SELECTOR:
            status, body = 400, {"kind": "Status", "reason": "BadRequest", "code": 400}
        elif self.status != 200:
            status, body = self.status, {"kind": "Status", "code": self.status}
        else:
            status, body = 200, endpoint_slices(self.endpoints)
        self.asked.append(status)
        return web.json_response(body, status=status)


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    server = ApiServer()
    app = web.Application()
    app.router.add_get(
        "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", server.handle
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def account(tmp_path: Path, token: str = "token-1") -> Path:
    """A service-account directory (token, namespace); returns the token file."""
    (tmp_path / "namespace").write_text(f"{NAMESPACE}\n")
    token_file = tmp_path / "token"
    token_file.write_text(f"{token}\n")
    return token_file


async def answered(api: ApiServer, status: int, rounds: int = 3) -> None:
    """Until the server has given `status` `rounds` times in a row from now."""
    start = len(api.asked)

    def done() -> bool:
        tail = api.asked[start:]
        return len(tail) >= rounds and tail[-rounds:] == [status] * rounds

    await eventually(done, 10.0, f"{rounds} answers {status}")


def k8s_config(api: ApiServer, token_file: Path, port: int, **kw: Any) -> DiscoveryConfig:
    return DiscoveryConfig(
        mode="kubernetes",
        service=SERVICE,
        api_url=api.url,
        token_file=str(token_file),
        port=port,
        **kw,
    )


async def test_ready_endpoints_are_added_and_unready_ones_drained_under_load(
    fleet3: SimFleet, api: ApiServer, tmp_path: Path
) -> None:
    token_file = account(tmp_path)
    async with _two_hosts() as port:
        # namespace "" is read from the file beside the token (a 404 otherwise).
        discovery = k8s_config(api, token_file, port, interval_s=0.05, slow_start=False)
        async with running_gateway(fleet_config(fleet3, first=1, discovery=discovery)) as gw:
            pool, fleet = gw.runtime.pool, gw.runtime.fleet
            two, three = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
            api.endpoints = {"127.0.0.2": True}
            await eventually(lambda: fleet.origins.get(two) == "kubernetes", 10.0, ".2 added")
            assert pool[two].config.url == f"http://127.0.0.2:{port}"
            async with StreamingLoad(gw.url, clients=9) as load:
                api.endpoints = {"127.0.0.2": True, "127.0.0.3": None}  # no `ready`: served
                await eventually(lambda: fleet.origins.get(three) == "kubernetes", 10.0, ".3")
                await eventually(lambda: started(pool[three]) > 5, 10.0, "streams on .3")
                # A 500, then a rotated token the gateway has not read yet (401): no change.
                api.endpoints = {}
                api.status = 500
                await answered(api, 500)
                assert sorted(pool.replicas) == sorted(["sim-0", two, three])
                api.status, api.token = 200, "token-2"
                await answered(api, 401)
                assert sorted(pool.replicas) == sorted(["sim-0", two, three])
                assert not pool[two].drained and not pool[three].drained
                # The token file rotates too and the list is served again: re-read each round.
                api.endpoints = {"127.0.0.2": True, "127.0.0.3": True}
                token_file.write_text("token-2")
                await answered(api, 200, rounds=1)
                # .2 terminates (listed, ready false) while streams run on it: drained, removed.
                async with removed_while_busy(pool, two):
                    api.endpoints = {"127.0.0.2": False, "127.0.0.3": True}
                await load.wait_for(20)
            load.check()
            assert {n: fleet.origins[n] for n in pool.replicas} == {
                "sim-0": "config",
                three: "kubernetes",
            }


async def test_a_failed_list_changes_nothing_and_logs_once_per_streak(
    api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = account(tmp_path)
    k8s = KubernetesDiscovery(k8s_config(api, token_file, 8000, namespace=NAMESPACE), None)  # type: ignore[arg-type]
    api.endpoints = {"10.0.0.7": True, "10.0.0.8": False}
    assert await k8s.lookup() == ["10.0.0.7"]
    caplog.set_level(logging.INFO, logger="llm_gateway.discovery")
    api.status = 500
    for _ in range(3):
        assert await k8s.lookup() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 500" in warnings[0].getMessage()
    api.status = 200
    assert await k8s.lookup() == ["10.0.0.7"]
    assert "listed again" in caplog.records[-1].getMessage()
    token_file.write_text("wrong")
    assert await k8s.lookup() is None  # a new streak: logged again
    assert "HTTP 401" in caplog.records[-1].getMessage()
    token_file.write_text("token-1")
    assert await k8s.lookup() == ["10.0.0.7"]


async def test_an_unreachable_api_or_missing_account_is_a_failed_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
    token_file = account(tmp_path)
    cfg = DiscoveryConfig(mode="kubernetes", service=SERVICE, token_file=str(token_file))
    assert await KubernetesDiscovery(replace(cfg, api_url=closed), None).lookup() is None  # type: ignore[arg-type]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert await KubernetesDiscovery(cfg, None).lookup() is None  # type: ignore[arg-type]
    # No namespace file beside the token (and none configured): nothing to ask for.
    (tmp_path / "namespace").unlink()
    assert await KubernetesDiscovery(replace(cfg, api_url=closed), None).lookup() is None  # type: ignore[arg-type]


def test_the_list_shape_is_checked() -> None:
    assert ready_addresses(endpoint_slices({"10.0.0.2": None, "10.0.0.1": True})) == [
        "10.0.0.1",
        "10.0.0.2",
    ]
    assert ready_addresses({"kind": "EndpointSliceList", "items": None}) == []
    with pytest.raises(ListError, match="not an EndpointSliceList"):
        ready_addresses({"kind": "Status", "code": 403})
    with pytest.raises(ListError, match="malformed"):
        ready_addresses({"kind": "EndpointSliceList", "items": [{"endpoints": ["10.0.0.1"]}]})


def test_the_in_cluster_api_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert in_cluster_url() == "https://10.96.0.1:6443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert in_cluster_url() == "https://[fd00::1]:6443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ListError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_url()


def test_kubernetes_mode_needs_a_service_and_valid_keys() -> None:
    with pytest.raises(ConfigError, match="discovery: service is required"):
        parse_config({"discovery": {"mode": "kubernetes"}})
    with pytest.raises(ConfigError, match="api_url must start with http"):
        parse_config({"discovery": {"mode": "kubernetes", "service": "v", "api_url": "k8s:443"}})
    cfg = parse_config({"discovery": {"mode": "kubernetes", "service": "vllm"}}).discovery
    assert (cfg.namespace, cfg.api_url) == ("", "")
    assert cfg.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert cfg.ca_file == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
