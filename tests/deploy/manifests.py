"""Reading deploy/: kustomizations, their documents, the gateway TOML, PromQL and /metrics."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config import GatewayConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Where the gateway container reads its configuration (the `serve --config` argument).
CONFIG_PATH = "/etc/llm-gateway/gateway.toml"


@dataclass(frozen=True)
class Kustomization:
    """One kustomization.yaml and the documents its resources list."""

    path: Path
    spec: dict[str, Any]
    documents: tuple[dict[str, Any], ...]

    @property
    def name(self) -> str:
        return self.path.parent.name

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.documents if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if name in (None, d["metadata"]["name"])]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name or ''}, got {len(found)}"
        return found[0]


def kustomization_files() -> list[Path]:
    return sorted(DEPLOY.rglob("kustomization.yaml"))


def load_kustomization(path: Path) -> Kustomization:
    spec = yaml.safe_load(path.read_text())
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        target = path.parent / resource
        if target.is_dir():
            docs.extend(load_kustomization(target / "kustomization.yaml").documents)
        else:
            docs.extend(d for d in yaml.safe_load_all(target.read_text()) if d is not None)
    return Kustomization(path, spec, tuple(docs))


def kustomizations() -> list[Kustomization]:
    return [load_kustomization(p) for p in kustomization_files()]


def pod_specs(k: Kustomization) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec) of every Deployment and StatefulSet."""
    for kind in ("Deployment", "StatefulSet"):
        for w in k.of_kind(kind):
            yield w, w["spec"]["template"]["spec"]


def gateway_container(k: Kustomization) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the one container running `llm-gateway serve`."""
    found = [
        (spec, c)
        for _, spec in pod_specs(k)
        for c in spec["containers"]
        if c.get("args", [])[:1] == ["serve"]
    ]
    assert len(found) == 1, f"{k.name}: expected one gateway container, got {len(found)}"
    return found[0]


def gateway_toml(k: Kustomization) -> str:
    """The TOML text the gateway container reads, followed from its --config to a ConfigMap."""
    spec, c = gateway_container(k)
    args = c["args"]
    config = args[args.index("--config") + 1]
    assert config == CONFIG_PATH
    mount_dir, filename = config.rsplit("/", 1)
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == mount_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = k.one("ConfigMap", volume["configMap"]["name"])
    text: str = cm["data"][filename]
    return text


def gateway_config(k: Kustomization) -> GatewayConfig:
    """The gateway's configuration, loaded strictly as `llm-gateway serve` would."""
    return parse_config(tomllib.loads(gateway_toml(k)))


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a name or a number) as the container's port number."""
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == port))


def prometheus_queries(k: Kustomization) -> list[tuple[str, str]]:
    """(ScaledObject trigger name, PromQL) of every prometheus trigger."""
    return [
        (t["name"], t["metadata"]["query"])
        for so in k.of_kind("ScaledObject")
        for t in so["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]


# --- PromQL: just enough of the grammar to find the selectors and the label names -------

_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right"}  # fmt: skip
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# Aggregations may put `by (...)` between their name and their parenthesis.
_AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk",
                 "bottomk", "quantile", "count_values", "limitk", "limit_ratio"}  # fmt: skip


@dataclass(frozen=True)
class Selector:
    """A metric name and its label matchers (label -> (operator, value))."""

    metric: str
    matchers: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Query:
    selectors: tuple[Selector, ...]
    # Label names of by(...), without(...), on(...), ignoring(...), group_*(...).
    grouping_labels: frozenset[str]


def _matchers(body: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(f"cannot parse label matchers {{{body}}}")
        out[m[1]] = (m[2], m[3])
        pos = m.end()
    return out


def parse_promql(query: str) -> Query:
    """The selectors of a query: identifiers that are neither functions, keywords nor labels."""
    token = re.compile(
        rf'({_IDENT})|(\{{[^}}]*\}})|(\[[^\]]*\])|("(?:[^"\\]|\\.)*")|([0-9][0-9.]*(?:[eE][+-]?[0-9]+)?|\S)'
    )
    tokens = [m for m in token.finditer(query)]
    selectors: list[Selector] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        ident, braces = tokens[i][1], tokens[i][2]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if ident in _GROUPING and nxt is not None and nxt[0] == "(":
            j = i + 2
            while tokens[j][0] != ")":
                if tokens[j][1]:
                    grouping.add(tokens[j][1])
                j += 1
            i = j + 1
            continue
        function = ident in _AGGREGATIONS or (nxt is not None and nxt[0] == "(")
        # Numbers (0.99, 1e5) are read whole by the last alternative: never an identifier.
        if ident and ident not in _KEYWORDS and not function:
            body = nxt[2] if nxt is not None and nxt[2] else None
            selectors.append(Selector(ident, _matchers(body[1:-1]) if body else {}))
            i += 2 if body else 1
            continue
        if braces:
            raise ValueError(f"a selector without a metric name: {braces}")
        i += 1
    return Query(tuple(selectors), frozenset(grouping))


# --- the exposition the gateway serves ---------------------------------------------------

_SAMPLE = re.compile(rf"^({_IDENT})(?:\{{(.*)\}})?\s+\S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# A histogram's (or summary's) samples are its family name plus one of these.
_SERIES_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass(frozen=True)
class Exposition:
    """Families (name -> type) and samples (name, labels) of a Prometheus text exposition."""

    families: dict[str, str]
    samples: tuple[tuple[str, dict[str, str]], ...]

    def family_of(self, name: str) -> str | None:
        """The family a series name belongs to; a suffix is stripped only where its type has it."""
        if name in self.families and self.families[name] not in _SERIES_SUFFIXES:
            return name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name.removesuffix(suffix)
            if base != name and suffix in _SERIES_SUFFIXES.get(self.families.get(base, ""), ()):
                return base
        return None


def parse_exposition(text: str) -> Exposition:
    families: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m is not None, f"unparsable sample line: {line!r}"
            samples.append((m[1], dict(_LABEL.findall(m[2] or ""))))
    return Exposition(families, tuple(samples))


def matches(labels: dict[str, str], matchers: dict[str, tuple[str, str]]) -> bool:
    """Whether a sample's labels satisfy PromQL matchers (regexes anchored, as PromQL's)."""
    for name, (op, value) in matchers.items():
        have = labels.get(name, "")
        ok = {
            "=": have == value,
            "!=": have != value,
            "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None,
        }[op]
        if not ok:
            return False
    return True
