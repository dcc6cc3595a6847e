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
    Decision,
    Filter,
    NoReplicaError,
    Pick,
    Picker,
    PluginConfigError,
    ReplicaSnapshot,
    RequestFeatures,
    RoutingError,
    Scorer,
)

__all__ = [
    "BUILTIN_PROFILES",
    "PLUGINS",
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
    "Scorer",
    "describe_plugins",
    "param",
    "resolve_profile",
    "validate_profile",
]
