"""The one table of routing plugins: TOML `type` == module name == registry key."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from routing.plugin import AnyFactory, PluginInfo
from routing.plugins import (
    composite_node,
    congestion,
    feedback_weight,
    healthy,
    least_inflight,
    max_score,
    multi_dim_fusion,
    p99_tier,
    random,
    round_robin,
    serves_model,
    weight,
)

_FACTORIES: tuple[AnyFactory, ...] = (
    # filters
    healthy.FACTORY,
    serves_model.FACTORY,
    # scorers
    least_inflight.FACTORY,
    weight.FACTORY,
    composite_node.FACTORY,
    multi_dim_fusion.FACTORY,
    feedback_weight.FACTORY,
    p99_tier.FACTORY,
    congestion.FACTORY,
    # pickers
    max_score.FACTORY,
    random.FACTORY,
    round_robin.FACTORY,
)

PLUGINS: Mapping[str, AnyFactory] = MappingProxyType({f.type: f for f in _FACTORIES})


def describe_plugins() -> list[PluginInfo]:
    """Every registered plugin with its kind, one-line doc and params (for docs and examples)."""
    return [f.describe() for f in PLUGINS.values()]
