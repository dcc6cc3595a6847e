"""The one table of routing plugins: TOML `type` == module name == registry key."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from routing.plugin import AnyFactory, PluginInfo
from routing.plugins import (
    affinity_guard,
    cache_footprint,
    congestion,
    feedback_weight,
    fusion,
    healthy,
    kv_utilization,
    label,
    latency_tier,
    least_inflight,
    length_class,
    lora_affinity,
    max_score,
    model_version,
    prefill_cost,
    prefix_affinity,
    queue_load,
    random,
    round_robin,
    saturation,
    seed_composite,
    serves_model,
    token_load,
    weight,
)

_FACTORIES: tuple[AnyFactory, ...] = (
    # filters
    healthy.FACTORY,
    serves_model.FACTORY,
    saturation.FACTORY,
    lora_affinity.FACTORY,
    label.FACTORY,
    model_version.FACTORY,
    length_class.FACTORY,
    # scorers
    least_inflight.FACTORY,
    queue_load.FACTORY,
    kv_utilization.FACTORY,
    token_load.FACTORY,
    prefix_affinity.FACTORY,
    cache_footprint.FACTORY,
    weight.FACTORY,
    seed_composite.FACTORY,
    fusion.FACTORY,
    feedback_weight.FACTORY,
    latency_tier.FACTORY,
    congestion.FACTORY,
    # pickers
    max_score.FACTORY,
    affinity_guard.FACTORY,
    prefill_cost.FACTORY,
    random.FACTORY,
    round_robin.FACTORY,
)

PLUGINS: Mapping[str, AnyFactory] = MappingProxyType({f.type: f for f in _FACTORIES})


def describe_plugins() -> list[PluginInfo]:
    """Every registered plugin with its kind, one-line doc and params (routing.docs renders it)."""
    return [f.describe() for f in PLUGINS.values()]
