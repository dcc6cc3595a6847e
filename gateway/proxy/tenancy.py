"""Tenants in the request path: who a request belongs to, its class, its queue, its quota.

The tenant comes from the request's API key ([server].api_keys: "default"; a tenant's own
keys: that tenant). An `x-tenant-id` header (or gRPC metadata entry) names it instead only
from a `trusted_sources` address, such as a sidecar that authenticated the user itself; from
anywhere else it is ignored, so no client can pass for another tenant. A name that is not
configured is kept for traces but queued, limited and labelled as `_other`.

The class (P0..P2) is what the request asks for (x-priority, `P1` or `1`, or the body's
`priority`), never better than the tenant's `max_priority`; without one, the tenant's
`priority`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gateway.errors import GatewayError, Unauthorized
from gateway.proxy.admission import Admission, Lane
from gateway.proxy.hints import Hints
from gateway.proxy.identity import TenantKeys, in_networks, key_digest
from gateway.proxy.quota import Limits, LocalQuotaStore, QuotaStore
from gateway.proxy.requests import ParsedRequest
from gateway.proxy.tenancy_config import (
    BEST_CLASS,
    DEFAULT_TENANT,
    OTHER_TENANT,
    WORST_CLASS,
    TenancyConfig,
    TenantConfig,
)
from routing.types import RequestFeatures

log = logging.getLogger("llm_gateway.tenancy")


class QuotaExceeded(GatewayError):
    """A tenant's quota refused the request: 429 with Retry-After and the limit's name."""

    status = 429


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant as the request path uses it."""

    name: str
    weight: float
    priority: int
    max_priority: int
    limits: Limits

    @classmethod
    def of(cls, name: str, cfg: TenantConfig) -> Tenant:
        limits = Limits(cfg.max_concurrent, cfg.requests_per_minute, cfg.tokens_per_minute)
        return cls(name, cfg.weight, cfg.priority, cfg.max_priority, limits)


@dataclass(frozen=True, slots=True)
class Grant:
    """A request's reservation against its tenant's quota, settled once when it ends."""

    tenant: str
    limits: Limits
    tokens: int

    @property
    def wants_usage(self) -> bool:
        """The answer's `usage` settles the tokens: worth reading from the response."""
        return self.limits.tokens_per_minute > 0


def _class(value: int) -> int:
    return min(WORST_CLASS, max(BEST_CLASS, value))


class Tenancy:
    """The tenants of one gateway process: keys, trusted sources, classes, queues, quotas."""

    def __init__(
        self,
        cfg: TenancyConfig,
        api_keys: Iterable[str] = (),
        admin_keys: Iterable[str] = (),
        on_refused: Callable[[str, str], None] | None = None,
        store: QuotaStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        configs = {DEFAULT_TENANT: TenantConfig(), **cfg.tenants}
        self._tenants = {name: Tenant.of(name, c) for name, c in configs.items()}
        self._other = Tenant.of(OTHER_TENANT, TenantConfig())
        static = {key_digest(k): DEFAULT_TENANT for k in api_keys}
        for name, c in cfg.tenants.items():
            static.update((key_digest(k), name) for k in c.keys)
        refused = {key_digest(k) for k in admin_keys}
        self.keys = TenantKeys(static, cfg.keys_file, self._tenants, refused)
        self._check_s = cfg.keys_file_check_s
        self._next_check = clock() + self._check_s  # the file was just read
        self._refreshing: asyncio.Future[bool] | None = None
        self._trusted = tuple(ipaddress.ip_network(s, strict=False) for s in cfg.trusted_sources)
        self._default_completion = cfg.default_completion_tokens
        self._on_refused = on_refused
        self.store: QuotaStore = store if store is not None else LocalQuotaStore()
        self._clock = clock
        # Every tenant label the metrics may carry: configured names and `_other`.
        self.labels = (*sorted(self._tenants), OTHER_TENANT)

    @property
    def keys_enabled(self) -> bool:
        return self.keys.enabled

    @property
    def trusts_headers(self) -> bool:
        """Some source may name the tenant by header (the caller needs the peer's address)."""
        return bool(self._trusted)

    def tenant(self, name: str | None) -> Tenant:
        """The configured tenant of that name; `_other` for any other name."""
        return self._tenants.get(name or DEFAULT_TENANT) or self._other

    def identify(self, authorizations: Iterable[str | bytes]) -> str:
        """The tenant of the request's key ("default" when no key is configured); 401 else."""
        keys = self.keys
        if not keys.enabled:
            return DEFAULT_TENANT
        if keys.path:
            self._maybe_refresh()
        for value in authorizations:
            tenant = keys.tenant_of(value)
            if tenant is not None:
                return tenant
        raise Unauthorized("Invalid or missing API key.")

    def _maybe_refresh(self) -> None:
        """At most once per keys_file_check_s, stat (and maybe re-read) the file in a thread."""
        now = self._clock()
        if now < self._next_check or (self._refreshing and not self._refreshing.done()):
            return
        self._next_check = now + self._check_s
        self._refreshing = asyncio.get_running_loop().run_in_executor(None, self.keys.refresh)
        self._refreshing.add_done_callback(_log_failure)

    def bind(
        self, req: ParsedRequest, key_tenant: str, hints: Hints, peer: str | None
    ) -> ParsedRequest:
        """The request with its tenant and class in its features (hints already applied)."""
        name = key_tenant
        if hints.tenant is not None and self._trusted and in_networks(peer, self._trusted):
            name = hints.tenant
        features = req.features
        asked = hints.priority is not None or "priority" in req.data
        if not asked and name == DEFAULT_TENANT and features.tenant is None:
            # The common case costs no copy: no tenant is the default one at its own class.
            return req
        tenant = self.tenant(name)
        cls = _class(max(features.priority, tenant.max_priority)) if asked else tenant.priority
        if features.tenant == name and features.priority == cls:
            return req
        return replace(req, features=replace(features, tenant=name, priority=cls))

    def lane(self, features: RequestFeatures) -> Lane:
        """The admission queue lane of a bound request."""
        tenant = self.tenant(features.tenant)
        return Lane(tenant.name, tenant.weight, self.priority(features))

    def priority(self, features: RequestFeatures) -> int:
        """The class of a bound request (no tenant: the default tenant's own class)."""
        if features.tenant is None:
            return self._tenants[DEFAULT_TENANT].priority
        return _class(features.priority)

    async def reserve(self, features: RequestFeatures) -> Grant | None:
        """Reserve the request against its tenant's quota (None: no quota); 429 if over it."""
        tenant = self.tenant(features.tenant)
        limits = tenant.limits
        if not limits.any:
            return None
        tokens = 0
        if limits.tokens_per_minute:
            tokens = features.prompt_tokens + (features.max_tokens or self._default_completion)
        refusal = await self.store.reserve(tenant.name, limits, tokens, self._clock())
        if refusal is None:
            return Grant(tenant.name, limits, tokens)
        if self._on_refused is not None:
            self._on_refused(tenant.name, refusal.limit)
        retry = max(1, math.ceil(refusal.retry_after_s))
        value = getattr(limits, refusal.limit)
        raise QuotaExceeded(
            f"Tenant `{tenant.name}` reached its {refusal.limit} quota ({value}); "
            f"retry in {retry} s.",
            retry_after_s=retry,
        )

    def settle(self, grant: Grant, used: int | None) -> None:
        """The request ended: `used` tokens (prompt + completion; None: unknown, keep)."""
        self.store.settle(grant.tenant, grant.limits, grant.tokens, used, self._clock())

    def queue_depth(self, admission: Admission | None) -> dict[str, int]:
        """Waiting requests per tenant label, zeros included."""
        depth = dict.fromkeys(self.labels, 0)
        if admission is not None:
            for tenant, n in admission.queue.tenant_depth().items():
                label = tenant if tenant in depth else OTHER_TENANT
                depth[label] += n
        return depth


def _log_failure(future: asyncio.Future[bool]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("tenancy.keys_file: reload failed", exc_info=future.exception())
