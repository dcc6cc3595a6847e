"""The `[tenancy]` TOML table: tenants, their keys, fair shares, priority classes and quotas."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.proxy.identity import key_digest

# The tenant of [server].api_keys (and of every request when no key is configured).
DEFAULT_TENANT = "default"
# The label and queue of tenants named only by a trusted header, not configured here.
OTHER_TENANT = "_other"
# Priority classes: 0 (P0) is served first, 2 (P2) last.
BEST_CLASS, WORST_CLASS = 0, 2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_tenant_name(name: str) -> bool:
    """Up to 64 characters of A-Z a-z 0-9 . _ -, not starting with `_` (kept for `_other`)."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One tenant: its keys, its fair share, its priority classes and its quotas (0 = none)."""

    # Bearer keys of the tenant, plain or as `sha256:<hex digest>`.
    keys: tuple[str, ...] = ()
    # Share of admission-queue dispatches while several tenants wait (2 = twice a 1's).
    weight: float = 1.0
    # The class of a request that asks for none, and the best class it may ask for
    # (x-priority or the body's `priority`; 0 = P0, the first served).
    priority: int = 1
    max_priority: int = 1
    # Requests in flight or queued at once.
    max_concurrent: int = 0
    requests_per_minute: int = 0
    # Prompt plus completion tokens, from each answer's `usage`.
    tokens_per_minute: int = 0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        for name in ("priority", "max_priority"):
            if not BEST_CLASS <= getattr(self, name) <= WORST_CLASS:
                raise ValueError(f"{name} must be 0..2 (P0..P2), got {getattr(self, name)}")
        if self.priority < self.max_priority:
            raise ValueError(
                f"priority {self.priority} is better than max_priority {self.max_priority}"
            )
        for name in ("max_concurrent", "requests_per_minute", "tokens_per_minute"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = unlimited), got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class TenancyConfig:
    """Who a request belongs to, and what that tenant may use (the `[tenancy]` table)."""

    # Tenants by name; [server].api_keys belong to "default" (configurable here by that name).
    tenants: dict[str, TenantConfig] = field(default_factory=dict)
    # More keys: `tenant key` lines (# comments), re-read when the file changes.
    keys_file: str = ""
    # How often at most the keys file's mtime is checked (off the request path).
    keys_file_check_s: float = 1.0
    # Client addresses (CIDRs) whose x-tenant-id header names the tenant, e.g. a sidecar.
    trusted_sources: tuple[str, ...] = ()
    # Completion tokens reserved against tokens_per_minute when a request sets no max_tokens.
    default_completion_tokens: int = 256

    def __post_init__(self) -> None:
        for name in self.tenants:
            if not valid_tenant_name(name):
                raise ValueError(
                    f"tenant name {name!r}: up to 64 of A-Z a-z 0-9 . _ -, not starting with _"
                )
        for source in self.trusted_sources:
            try:
                ipaddress.ip_network(source, strict=False)
            except ValueError:
                raise ValueError(f"trusted_sources: {source!r} is not an address or CIDR") from None
        if not self.keys_file_check_s > 0:
            raise ValueError(f"keys_file_check_s must be > 0, got {self.keys_file_check_s}")
        if self.default_completion_tokens < 1:
            raise ValueError(
                f"default_completion_tokens must be >= 1, got {self.default_completion_tokens}"
            )

    def check_keys(self, api_keys: Iterable[str], admin_keys: Iterable[str]) -> None:
        """A key opens one tenant only, and never the admin routes as well."""
        owner: dict[bytes, str] = {key_digest(k): DEFAULT_TENANT for k in api_keys}
        admin = {key_digest(k) for k in admin_keys}
        for name, tenant in self.tenants.items():
            for key in tenant.keys:
                digest = key_digest(key)
                if digest in admin:
                    raise ValueError(f"tenancy.tenants.{name}: a key is also an admin key")
                other = owner.setdefault(digest, name)
                if other != name:
                    raise ValueError(f"tenancy.tenants.{name}: a key is also {other!r}'s")
