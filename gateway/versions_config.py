"""The `[traffic]` TOML table: model versions (canary / A-B weights) and who may override them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.proxy.tenancy_config import valid_tenant_name
from routing.profile import BUILTIN_PROFILES, ProfileSpec
from routing.versions import Version, VersionSet

# The filter that keeps a request on its version's replicas (built-in profiles have it).
VERSION_FILTER = "model_version"


@dataclass(frozen=True, slots=True)
class ModelVersionsConfig:
    """One public model and its versions (`[[traffic.model_versions]]`).

    Each version is a table `{ name, weight, stage, labels, served_model }`
    (routing/versions.py's Version is its schema): weights 0-100 summing to 100, exactly one
    `stable`; `labels` pick its replicas, `served_model` the model name they serve it under.
    """

    model: str
    versions: tuple[Version, ...] = ()

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be non-empty")
        VersionSet(self.model, self.versions)  # raises on bad weights, stages or names
        for v in self.versions:
            if v.served_model == self.model:
                raise ValueError(f"version {v.name!r}: served_model repeats the public name")

    @property
    def version_set(self) -> VersionSet:
        return VersionSet(self.model, self.versions)


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    """Traffic management before routing (the `[traffic]` table)."""

    model_versions: tuple[ModelVersionsConfig, ...] = ()
    # Honour a client's `X-Canary-Weight: <0-100>` (the canaries' share for that request).
    allow_canary_header: bool = False
    # Tenants (by API key, or a trusted source's x-tenant-id) whose header is honoured;
    # empty = every tenant, once allow_canary_header is on.
    canary_header_tenants: tuple[str, ...] = ()
    # Seed of the weighted draw for requests without a session key.
    seed: int = 0

    def __post_init__(self) -> None:
        models = [m.model for m in self.model_versions]
        dupes = sorted({m for m in models if models.count(m) > 1})
        if dupes:
            raise ValueError(f"model_versions: {', '.join(dupes)} appear more than once")
        for name in self.canary_header_tenants:
            if not valid_tenant_name(name):
                raise ValueError(f"canary_header_tenants: {name!r} is not a tenant name")

    @property
    def labelled(self) -> bool:
        """Some version is picked by replica labels (the profile needs the version filter)."""
        return any(v.labels for m in self.model_versions for v in m.versions)


def check_profile(
    traffic: TrafficConfig, profile: str, user_profiles: Mapping[str, ProfileSpec]
) -> None:
    """Versions picked by labels need the model_version filter in the profile that routes."""
    spec = {**BUILTIN_PROFILES, **user_profiles}.get(profile)
    if spec is None or not traffic.labelled:
        return  # an unknown profile is the router's error to report
    if all(f.type != VERSION_FILTER for f in spec.filters):
        raise ValueError(
            f"traffic.model_versions: versions picked by labels need the {VERSION_FILTER!r} "
            f"filter in routing profile {profile!r}"
        )
