"""Traffic management around routing: model versions before it, classes and priority after it.

Before routing, `choose` draws the request's model version (routing/versions.py) when its
model has versions in `[traffic]`: a version with `labels` restricts the candidates to its
replicas (RequestFeatures.version_labels, kept by the model_version filter, so cache affinity
stays within the version); one with `served_model` rewrites the body's `model` to that name
(routing then follows the replicas serving it, and the answer's `model` is that name, as
vLLM reports it). `X-Canary-Weight` is honoured only when `allow_canary_header` is on, and
then only for `canary_header_tenants` (all tenants when empty).

After routing, `relabel` names a decision `class_fallback` when the profile's length_class
filter found the request's instance class empty; `upstream_body` passes the request's class
(P0..P2 as vLLM's `priority`, lower first) to a replica marked `priority_scheduling` (vLLM run
with `--scheduling-policy priority`), and keeps other replicas from seeing any priority, so
the gateway's classes (bounded by the tenant's `max_priority`) are the only ones vLLM obeys.
"""

from __future__ import annotations

import random
from collections.abc import Callable, MutableMapping
from dataclasses import replace

import orjson

from cache_index.session_affinity import session_key
from gateway.config import GatewayConfig, ReplicaConfig
from gateway.proxy.requests import Kind, ParsedRequest
from gateway.proxy.tenancy_config import DEFAULT_TENANT, WORST_CLASS
from routing.plugins import length_class
from routing.profile import BUILTIN_PROFILES
from routing.types import Branch, Decision, RequestFeatures
from routing.versions import VersionSet
from routing.versions import choose as choose_version

# vLLM (0.32) reads a request's priority from this header before the body's field: a client's
# own value must never reach a replica, or it would bypass the tenant's max_priority.
VLLM_PRIORITY_HEADER = "x-vllm-priority"
# Routes whose body is the JSON of ParsedRequest.data, re-encoded to change `model` or
# `priority`; any other body is never rewritten (its model has no versions, its replica gets
# the priority header only).
JSON_KINDS: frozenset[Kind] = frozenset({"chat", "completions", "chat_batch"})


def _length_class(config: GatewayConfig) -> length_class.Params | None:
    """The length_class filter's params in the profile that routes, if it has one."""
    spec = {**BUILTIN_PROFILES, **config.routing.profiles}.get(config.routing.profile)
    if spec is None:
        return None
    for f in spec.filters:
        if f.type == "length_class":
            params: length_class.Params = length_class.FACTORY.parse(f.params)
            return params
    return None


class Traffic:
    """Model versions, instance-class labels and vLLM priorities for one gateway process."""

    __slots__ = (
        "_allowed",
        "_classes",
        "_count",
        "_header_on",
        "_priority_of",
        "_rng",
        "_session_header",
        "_versions",
    )

    def __init__(
        self,
        config: GatewayConfig,
        count: Callable[[str, str], None],
        priority_of: Callable[[RequestFeatures], int] | None = None,
    ) -> None:
        cfg = config.traffic
        self._versions: dict[str, VersionSet] = {m.model: m.version_set for m in cfg.model_versions}
        self._header_on = cfg.allow_canary_header
        self._allowed = frozenset(cfg.canary_header_tenants)
        self._rng = random.Random(cfg.seed)
        self._session_header = config.cache_index.session_header.lower().encode("latin-1")
        self._classes = _length_class(config)
        # (model, version) -> counted once per request.
        self._count = count
        # The request's class (the tenant's bounds applied); no tenancy: its own, clamped.
        self._priority_of = priority_of

    def choose(self, req: ParsedRequest, headers: list[tuple[bytes, bytes]]) -> ParsedRequest:
        """The request bound to a version of its model (unchanged when it has none)."""
        if req.kind not in JSON_KINDS:
            return req
        features = self._bind(req.model, headers, req.data.get("user"), req.features)
        if features.model == req.model:
            return req if features is req.features else replace(req, features=features)
        data = {**req.data, "model": features.model}
        return replace(
            req, body=orjson.dumps(data), data=data, model=features.model, features=features
        )

    def choose_session(
        self, model: str, headers: list[tuple[bytes, bytes]], features: RequestFeatures
    ) -> RequestFeatures:
        """`choose` for a bodiless request (a realtime session): its features, version bound."""
        return self._bind(model, headers, None, features)

    def _bind(
        self,
        model: str,
        headers: list[tuple[bytes, bytes]],
        user: object,
        features: RequestFeatures,
    ) -> RequestFeatures:
        """`features` of a request for `model`, bound to one of its versions (sticky on the
        session header or the body's `user`): the version's labels and served name."""
        versions = self._versions.get(model)
        if versions is None:
            return features
        header = next((v.decode("latin-1") for k, v in headers if k == self._session_header), None)
        session = session_key(header, user)
        version = choose_version(versions, session, self._rng, self._canary_weight(features))
        self._count(model, version.name)
        if version.labels:
            features = replace(features, version_labels=version.labels)
        served = version.served_model or model
        return features if features.model == served else replace(features, model=served)

    def _canary_weight(self, features: RequestFeatures) -> int | None:
        if not self._header_on or features.canary_weight is None:
            return None
        if self._allowed and (features.tenant or DEFAULT_TENANT) not in self._allowed:
            return None
        return features.canary_weight

    def relabel(self, features: RequestFeatures, decision: Decision) -> Decision:
        """`decision`, labelled class_fallback when it left the request's instance class."""
        params = self._classes
        if params is None or length_class.in_class(params, features, decision.replica):
            return decision
        return replace(decision, branch=Branch.CLASS_FALLBACK)

    def upstream_body(
        self, req: ParsedRequest, replica: ReplicaConfig, headers: MutableMapping[str, str]
    ) -> bytes:
        """The body (and priority header) for `replica`: the class where it schedules by it."""
        headers.pop(VLLM_PRIORITY_HEADER, None)
        data = req.data
        if replica.priority_scheduling:
            cls = self._class(req.features)
            headers[VLLM_PRIORITY_HEADER] = str(cls)
            if data.get("priority") == cls or req.kind not in JSON_KINDS:
                return req.body
            return orjson.dumps({**data, "priority": cls})
        if data.get("priority", 0) == 0 or req.kind not in JSON_KINDS:
            return req.body
        # A replica scheduling first come first served: no priority (older vLLM refuses one).
        return orjson.dumps({k: v for k, v in data.items() if k != "priority"})

    def _class(self, features: RequestFeatures) -> int:
        if self._priority_of is not None:
            return self._priority_of(features)
        return min(WORST_CLASS, max(0, features.priority))
