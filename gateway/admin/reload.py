"""Hot reload: re-read the TOML the process started from, validate it whole, apply the diff.

Applied live: the replicas (added, removed after a drain, replaced when their table changed),
the API, admin and tenant keys with the rest of [tenancy] (quotas included), the routing
profile and its weights (a new router for new requests), and the [upstream] keys the pipeline
reads per request. Everything else needs a restart: it is reported as `restart_required` and
left as it was. A file that fails validation changes nothing; the error names the key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gateway.admin.fleet import FleetError
from gateway.config import GatewayConfig, ReplicaConfig, load_config
from gateway.config_loader import ConfigError
from gateway.proxy.tenancy import Tenancy
from routing.router import Router

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("llm_gateway.reload")

# [upstream] keys read per request by the pipeline; the others shape the connection pool.
_UPSTREAM_LIVE = (
    "api_key",
    "first_byte_timeout_s",
    "response_head_timeout_s",
    "idle_timeout_s",
    "non_stream_timeout_s",
    "max_retries",
    "retry_budget_ratio",
    "min_retry_concurrency",
)
_LIVE = (
    "server.api_keys",
    "server.admin_keys",
    "tenancy",
    "routing",
    *(f"upstream.{k}" for k in _UPSTREAM_LIVE),
)


@dataclass
class ReloadResult:
    """What a reload changed, what it could not, and what needs a restart."""

    applied: list[str] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    # Replica changes refused or cut short (the last routable one, streams outlasting the wait).
    failed: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        changed = bool(self.applied or self.added or self.removed or self.replaced)
        return {
            "changed": changed,
            "applied": self.applied,
            "restart_required": self.restart_required,
            "replicas": {
                "added": self.added,
                "removed": self.removed,
                "replaced": self.replaced,
                "failed": self.failed,
            },
        }


def changed_paths(old: object, new: object, prefix: str = "") -> list[str]:
    """Dotted key paths whose values differ between two configs (tables compared per key)."""
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new) and type(old) is type(new):
        out: list[str] = []
        for f in dataclasses.fields(old):
            path = f"{prefix}.{f.name}" if prefix else f.name
            out += changed_paths(getattr(old, f.name), getattr(new, f.name), path)
        return out
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=str)
        return [f"{prefix}.{k}" for k in keys if old.get(k) != new.get(k)]
    return [] if old == new else [prefix]


def _is_live(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in _LIVE)


@dataclass(frozen=True, slots=True)
class _Prepared:
    config: GatewayConfig
    router: Router
    tenancy: Tenancy


def _prepare(
    path: str, build_router: Callable[[GatewayConfig], Router], runtime: Runtime
) -> _Prepared:
    """Parse and validate everything a reload needs (file I/O: run off the event loop)."""
    cfg = load_config(path)
    router = build_router(cfg)
    server = cfg.server
    tenancy = Tenancy(
        cfg.tenancy, server.api_keys, server.admin_keys, runtime.metrics.quota_refused
    )
    return _Prepared(cfg, router, tenancy)


def _effective(old: GatewayConfig, new: GatewayConfig) -> GatewayConfig:
    """The old config with the live parts of the new one: what the process runs after it."""
    try:
        return replace(
            old,
            server=replace(
                old.server, api_keys=new.server.api_keys, admin_keys=new.server.admin_keys
            ),
            tenancy=new.tenancy,
            routing=new.routing,
            upstream=replace(old.upstream, **{k: getattr(new.upstream, k) for k in _UPSTREAM_LIVE}),
            replicas=new.replicas,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config: {exc}") from None


def _adopt_tenancy(old: Tenancy, new: Tenancy) -> None:
    """`old` takes `new`'s keys, tenants and quotas in place: the front ends hold `old`."""
    # The quota counters (local or Redis) carry over: grants in flight settle where reserved.
    new.store = old.store
    vars(old).update(vars(new))


def _check_urls(runtime: Runtime, wanted: dict[str, ReplicaConfig]) -> None:
    """A file replica may not take the url of another live replica that the file leaves."""
    fleet = runtime.fleet
    for i, cfg in enumerate(wanted.values()):
        for r in runtime.pool:
            taken = r.config.url == cfg.url and r.name != cfg.name
            # Free only when the file drops the replica holding it (removed first, then).
            if taken and (fleet.origins.get(r.name) != "config" or r.name in wanted):
                raise ConfigError(
                    f"replicas[{i}].url: {cfg.url} is already served by replica {r.name!r}"
                )


async def reload_from_file(runtime: Runtime, path: str | None = None) -> ReloadResult:
    """Re-read `path` (default: the file the process started with) and apply what changed."""
    file = path or runtime.config_path
    if not file:
        raise ConfigError("reload: this process was not started from a configuration file")
    from gateway.runtime import build_router

    async with runtime.fleet.reload_lock:
        prepared = await asyncio.to_thread(_prepare, file, build_router, runtime)
        old, new = runtime.config, prepared.config
        effective = _effective(old, new)
        wanted = {r.name: r for r in new.replicas}
        _check_urls(runtime, wanted)
        result = ReloadResult()
        for p in changed_paths(replace(old, replicas=()), replace(new, replicas=())):
            (result.applied if _is_live(p) else result.restart_required).append(p)
        for p in result.restart_required:
            log.warning("reload %s: %s changed; needs a restart, not applied", file, p)
        if any(
            p.startswith(("server.api_keys", "server.admin_keys", "tenancy"))
            for p in result.applied
        ):
            runtime.admin_keys.replace(new.server.admin_keys)
            _adopt_tenancy(runtime.tenancy, prepared.tenancy)
        router = (
            prepared.router
            if any(p.startswith("routing") for p in result.applied)
            else runtime.router
        )
        # New replicas first: a new profile may route only to them, and removals then find
        # them routable. Changed and dropped ones go after the swap, drained.
        owned = [n for n, origin in runtime.fleet.origins.items() if origin == "config"]
        deferred = await _add_replicas(runtime, wanted, result)
        runtime.swap(effective, router)
        for p in result.applied:
            log.info("reload %s: %s applied", file, p)
        await _change_replicas(runtime, wanted, owned, deferred, result)
        return result


async def _add_replicas(
    runtime: Runtime, wanted: dict[str, ReplicaConfig], result: ReloadResult
) -> list[ReplicaConfig]:
    """Add the file's new replicas; those whose url a leaving replica still holds wait."""
    fleet = runtime.fleet
    pool = runtime.pool.replicas
    deferred: list[ReplicaConfig] = []
    for name, cfg in wanted.items():
        live = pool.get(name)
        if live is None:
            if any(r.config.url == cfg.url for r in pool.values()):
                deferred.append(cfg)  # its url leaves with a replica the file drops
                continue
            await _try(result, name, fleet.add(cfg, "config"), result.added)
        elif live.config == cfg:
            fleet.origins[name] = "config"  # a replica added at runtime that the file now lists
    return deferred


async def _change_replicas(
    runtime: Runtime,
    wanted: dict[str, ReplicaConfig],
    owned: list[str],
    deferred: list[ReplicaConfig],
    result: ReloadResult,
) -> None:
    """Replace the changed replicas, remove the dropped ones, then add the deferred ones."""
    fleet = runtime.fleet
    pool = runtime.pool.replicas
    for name, cfg in wanted.items():
        live = pool.get(name)
        if live is not None and live.config != cfg and await _remove(runtime, name, result):
            await _try(result, name, fleet.add(cfg, "config"), result.replaced)
    for name in owned:
        if name not in wanted and name in pool and await _remove(runtime, name, result):
            result.removed.append(name)
    for cfg in deferred:
        await _try(result, cfg.name, fleet.add(cfg, "config"), result.added)


async def _remove(runtime: Runtime, name: str, result: ReloadResult) -> bool:
    """Drain and remove `name`; False (and recorded as failed) when it stays."""
    try:
        removal = await runtime.fleet.remove(name, why="reload")
    except FleetError as exc:
        result.failed.append({"name": name, "removed": False, "outcome": exc.message})
        return False
    if not removal.removed:
        result.failed.append(removal.as_dict())
    return removal.removed


async def _try(
    result: ReloadResult, name: str, change: Coroutine[Any, Any, object], into: list[str]
) -> None:
    try:
        await change
    except FleetError as exc:
        result.failed.append({"name": name, "outcome": exc.message})
        return
    into.append(name)


def install_sighup(runtime: Runtime) -> None:
    """SIGHUP reloads `runtime.config_path` (a worker of `--workers` calls this too)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload_in_background, runtime)


def reload_in_background(runtime: Runtime) -> None:
    """SIGHUP: reload without blocking the signal handler; the outcome goes to the log."""
    task = asyncio.get_running_loop().create_task(reload_from_file(runtime))
    _background.add(task)
    task.add_done_callback(_reloaded)


_background: set[asyncio.Task[ReloadResult]] = set()


def _reloaded(task: asyncio.Task[ReloadResult]) -> None:
    _background.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, ConfigError):
        log.error("reload refused, nothing changed: %s", exc)
    elif exc is not None:
        log.error("reload failed", exc_info=exc)
    else:
        log.info("reload done: %s", task.result().as_dict())
