"""JSON schemas of the two custom resources deploy/ uses, written from their projects' CRDs.

Kubernetes' own schemas (kubernetes-validate) do not cover custom resources, so these are
kept here, as strict as the CRDs (unknown fields are errors: a typo is not ignored).

- ScaledObject, keda.sh/v1alpha1: KEDA's CRD, kedacore/keda
  `config/crd/bases/keda.sh_scaledobjects.yaml` (KEDA 2.x), and its reference page "ScaledObject
  specification" (keda.sh/docs/2.16/reference/scaledobject-spec/): spec.scaleTargetRef,
  pollingInterval, cooldownPeriod, initialCooldownPeriod, idleReplicaCount, minReplicaCount,
  maxReplicaCount, fallback, advanced (restoreToOriginalReplicaCount,
  horizontalPodAutoscalerConfig.{name, behavior}, scalingModifiers), triggers[] (type, name,
  metadata: a string map, authenticationRef, metricType, useCachedMetrics). The prometheus
  trigger's metadata keys are from the scaler's page (keda.sh/docs/2.16/scalers/prometheus/).
- ServiceMonitor, monitoring.coreos.com/v1: the Prometheus Operator's CRD,
  prometheus-operator/prometheus-operator
  `example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml`, and its API
  reference (prometheus-operator.dev/docs/api-reference/api/, "ServiceMonitor"): the fields
  of spec and of spec.endpoints[] that a gateway scrape can use.
"""

from __future__ import annotations

from typing import Any

_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
             r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}  # fmt: skip
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_METADATA = _object(
    {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    ("name",),
)

# The HPA's behavior, as autoscaling/v2 HorizontalPodAutoscalerBehavior.
_HPA_RULES = _object(
    {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "tolerance": {"type": ["string", "number"]},
        "policies": {
            "type": "array",
            "minItems": 1,
            "items": _object(
                {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
                ("type", "value", "periodSeconds"),
            ),
        },
    }
)

# The keys KEDA's prometheus scaler reads; each value is a string (the CRD's metadata map).
PROMETHEUS_METADATA = _object(
    {
        key: {"type": "string", "minLength": 1}
        for key in (
            "serverAddress", "query", "threshold", "activationThreshold", "namespace",
            "customHeaders", "ignoreNullValues", "unsafeSsl", "queryParameters", "timeout",
            "authModes",
        )
    },
    ("serverAddress", "query", "threshold"),
)  # fmt: skip

SCALED_OBJECT: dict[str, Any] = _object(
    {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": _METADATA,
        "spec": _object(
            {
                "scaleTargetRef": _object(
                    {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string", "minLength": 1},
                        "envSourceContainerName": {"type": "string"},
                    },
                    ("name",),
                ),
                "pollingInterval": _INT32,
                "cooldownPeriod": _INT32,
                "initialCooldownPeriod": _INT32,
                "idleReplicaCount": _INT32,
                "minReplicaCount": _INT32,
                "maxReplicaCount": _INT32,
                "fallback": _object(
                    {
                        "failureThreshold": _INT32,
                        "replicas": _INT32,
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                    ("failureThreshold", "replicas"),
                ),
                "advanced": _object(
                    {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": _object(
                            {
                                "name": {"type": "string"},
                                "behavior": _object(
                                    {"scaleUp": _HPA_RULES, "scaleDown": _HPA_RULES}
                                ),
                            }
                        ),
                        "scalingModifiers": _object(
                            {
                                "formula": {"type": "string"},
                                "target": {"type": "string"},
                                "activationTarget": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value"]},
                            }
                        ),
                    }
                ),
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "allOf": [
                            _object(
                                {
                                    "type": {"type": "string", "minLength": 1},
                                    "name": {"type": "string"},
                                    "metadata": _STRING_MAP,
                                    "authenticationRef": _object(
                                        {"name": {"type": "string"}, "kind": {"type": "string"}},
                                        ("name",),
                                    ),
                                    "metricType": {
                                        "enum": ["AverageValue", "Value", "Utilization"]
                                    },
                                    "useCachedMetrics": {"type": "boolean"},
                                },
                                ("type", "metadata"),
                            ),
                            {
                                "if": {"properties": {"type": {"const": "prometheus"}}},
                                "then": {"properties": {"metadata": PROMETHEUS_METADATA}},
                            },
                        ]
                    },
                },
            },
            ("scaleTargetRef", "triggers"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

_SECRET_KEY = _object(
    {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}},
    ("key",),
)
_LABEL_SELECTOR = _object(
    {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": _object(
                {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                ("key", "operator"),
            ),
        },
    }
)
_RELABEL = {"type": "array", "items": {"type": "object"}}  # relabel_config: Prometheus' own

SERVICE_MONITOR: dict[str, Any] = _object(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": _object(
            {
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": _object(
                    {"any": {"type": "boolean"}, "matchNames": {"type": "array"}}
                ),
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "authorization": _object(
                                {"type": {"type": "string"}, "credentials": _SECRET_KEY}
                            ),
                            "bearerTokenSecret": _SECRET_KEY,
                            "tlsConfig": {"type": "object"},
                            "params": {"type": "object"},
                            "relabelings": _RELABEL,
                            "metricRelabelings": _RELABEL,
                        }
                    ),
                },
            },
            ("selector", "endpoints"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

CRDS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
}
