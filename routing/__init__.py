"""Pure, synchronous request routing: replica snapshots and request features in, a Decision out."""

from routing.plugin import Kind, ParamInfo, PluginFactory, PluginInfo, param
from routing.profile import (
    BUILTIN_PROFILES,
    PluginSpec,
    ProfileSpec,
    resolve_profile,
    validate_profile,
)
from routing.registry import PLUGINS, describe_plugins
from routing.router import Router
from routing.types import (
    Branch,
    Decision,
    Filter,
    NoReplicaError,
    Pick,
    Picker,
    PluginConfigError,
    ReplicaSnapshot,
    RequestFeatures,
    RoutingError,
    Saturated,
    Scorer,
)

__all__ = [
    "BUILTIN_PROFILES",
    "PLUGINS",
    "Branch",
    "Decision",
    "Filter",
    "Kind",
    "NoReplicaError",
    "ParamInfo",
    "Pick",
    "Picker",
    "PluginConfigError",
    "PluginFactory",
    "PluginInfo",
    "PluginSpec",
    "ProfileSpec",
    "ReplicaSnapshot",
    "RequestFeatures",
    "Router",
    "RoutingError",
    "Saturated",
    "Scorer",
    "describe_plugins",
    "param",
    "resolve_profile",
    "validate_profile",
]
