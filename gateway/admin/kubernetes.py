"""Kubernetes discovery: one replica per ready endpoint of a Service's EndpointSlices.

Each round lists `GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices` filtered by
the `kubernetes.io/service-name` label, with the service account's bearer token (re-read each
round: projected tokens rotate) and CA, and hands the addresses to the same add/drain/remove
code as DNS discovery. An endpoint whose `conditions.ready` is false counts as gone, so a
terminating pod is drained while it still serves. A failed list (refused, 401/403, 5xx, not
an EndpointSliceList, no answer in resolve_timeout_s) changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from gateway.admin.config import DiscoveryConfig
from gateway.admin.discovery import DnsDiscovery
from gateway.admin.fleet import Fleet

log = logging.getLogger("llm_gateway.discovery")


class ListError(Exception):
    """The API's answer could not be used (a status, a shape); the round changes nothing."""


def in_cluster_url() -> str:
    """The API server as a pod sees it, from the env the kubelet sets."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ListError("KUBERNETES_SERVICE_HOST is not set (not in a cluster? set api_url)")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def ready_addresses(body: Any) -> list[str]:
    """Every address of an EndpointSliceList whose endpoint is not `ready: false`."""
    if not isinstance(body, dict) or body.get("kind") != "EndpointSliceList":
        raise ListError("the answer is not an EndpointSliceList")
    found: set[str] = set()
    try:
        for item in body.get("items") or []:
            for endpoint in item.get("endpoints") or []:
                # Absent or null `ready` means unknown: served, as kube-proxy does.
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                found.update(str(a) for a in endpoint.get("addresses") or [])
    except (AttributeError, TypeError) as exc:  # a field of the wrong type
        raise ListError(f"malformed EndpointSliceList: {exc}") from None
    return sorted(found)


class KubernetesDiscovery(DnsDiscovery):
    """One replica per ready endpoint of `[discovery] service`, kept in step every interval_s."""

    origin = "kubernetes"

    def __init__(self, cfg: DiscoveryConfig, fleet: Fleet) -> None:
        super().__init__(cfg, fleet)

    def _read_files(self) -> tuple[str, str, ssl.SSLContext | None]:
        """(namespace, token, TLS context) from the service-account files; in a thread."""
        cfg = self._cfg
        namespace = cfg.namespace
        if not namespace:
            ns_file = Path(cfg.token_file).with_name("namespace")
            namespace = ns_file.read_text().strip()
        token_path = Path(cfg.token_file)
        # No token file (e.g. through `kubectl proxy`): ask without one; the API says 401 if needed.
        token = token_path.read_text().strip() if token_path.exists() else ""
        tls = None
        if (cfg.api_url or "https://").startswith("https://"):
            tls = ssl.create_default_context(cafile=cfg.ca_file)
        return namespace, token, tls

    async def list_addresses(self) -> list[str]:
        """The Service's ready endpoint addresses now (raises on any failure)."""
        cfg = self._cfg
        api = (cfg.api_url or in_cluster_url()).rstrip("/")
        namespace, token, tls = await asyncio.to_thread(self._read_files)
        selector = quote(f"kubernetes.io/service-name={cfg.service}", safe="")
        url = (
            f"{api}/apis/discovery.k8s.io/v1/namespaces/{quote(namespace, safe='')}"
            f"/endpointslices?labelSelector={selector}"
        )
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        timeout = aiohttp.ClientTimeout(total=cfg.resolve_timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers, ssl=tls if tls is not None else True) as r,
        ):
            if r.status != 200:
                raise ListError(f"HTTP {r.status}: {(await r.text())[:200]}")
            return ready_addresses(await r.json(content_type=None))

    async def lookup(self) -> list[str] | None:
        """The ready addresses now; None when the list failed (nothing is changed then)."""
        service = self._cfg.service
        try:
            addresses = await self.list_addresses()
        except (OSError, TimeoutError, ValueError, aiohttp.ClientError, ListError) as exc:
            if not self._failing:
                log.warning(
                    "discovery: cannot list the endpoints of service %s: %s",
                    service,
                    str(exc) or type(exc).__name__,
                )
            self._failing = True
            return None
        if self._failing:
            log.info("discovery: the endpoints of service %s are listed again", service)
        self._failing = False
        return addresses
