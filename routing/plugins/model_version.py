"""Filter: keep the replicas of the request's model version (its required labels).

The gateway's version stage (gateway/proxy/versions.py, the `[traffic]` table) draws a model
version per request and, for a version defined by labels, sets RequestFeatures.version_labels:
only replicas carrying every one of them stay, so cache affinity stays within the version.
A request without version labels passes through. An empty version means no replica: a canary
never silently falls back to the stable fleet (or the reverse).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.plugin import PluginFactory
from routing.plugins.label import with_labels
from routing.types import ReplicaSnapshot, RequestFeatures


@dataclass(frozen=True, slots=True)
class Params:
    """The model_version filter has no parameters."""


class ModelVersion:
    """Keeps replicas whose labels include every one of request.version_labels."""

    __slots__ = ()

    def __init__(self, params: Params) -> None:
        del params

    def filter(
        self, request: RequestFeatures, replicas: Sequence[ReplicaSnapshot]
    ) -> Sequence[ReplicaSnapshot]:
        wanted = request.version_labels
        return with_labels(replicas, wanted) if wanted else replicas


FACTORY = PluginFactory(__name__, __doc__, "filter", Params, ModelVersion)
