"""[discovery]: where replicas come from besides the [[replicas]] tables, and slow start."""

from __future__ import annotations

from dataclasses import dataclass, field

_MODES = ("static", "dns", "kubernetes")
_FAMILIES = ("any", "ipv4", "ipv6")


def nameserver_address(value: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address: (host, port), port 53 unless set."""
    host, port = value, "53"
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"nameserver {value!r}: expected [address]:port")
            port = rest[1:]
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"nameserver must be host[:port] with a port 1..65535, got {value!r}")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """Static replicas only, or also every address a DNS name resolves to (a headless Service)."""

    # "static": the [[replicas]] tables; "dns": those plus one replica per address of hostname;
    # "kubernetes": those plus one per ready endpoint of `service`'s EndpointSlices.
    mode: str = "static"
    hostname: str = ""
    port: int = 8000
    scheme: str = "http"
    # "any", "ipv4" or "ipv6": the address families taken from the answer.
    family: str = "any"
    interval_s: float = 10.0
    resolve_timeout_s: float = 2.0
    # "" = the system resolver (getaddrinfo); "host[:port]" = ask that DNS server over UDP.
    nameserver: str = ""
    # mode "kubernetes": the Service whose EndpointSlices are listed; "" namespace = the
    # service account's (the `namespace` file beside token_file); "" api_url = in-cluster
    # https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. Each list: resolve_timeout_s.
    service: str = ""
    namespace: str = ""
    api_url: str = ""
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    # Settings of every discovered replica, as in a [[replicas]] table.
    models: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    kv_events: str = ""
    # Replicas added at runtime (admin API, discovery, reload) ramp up from [outlier]
    # ramp_start of their share, as a replica returning from an ejection does.
    slow_start: bool = True

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if self.family not in _FAMILIES:
            raise ValueError(f"family must be one of {', '.join(_FAMILIES)}, got {self.family!r}")
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be 'http' or 'https', got {self.scheme!r}")
        if self.mode == "dns" and not self.hostname:
            raise ValueError("hostname is required when mode is 'dns'")
        if self.mode == "kubernetes" and not self.service:
            raise ValueError("service is required when mode is 'kubernetes'")
        if self.api_url and not self.api_url.startswith(("http://", "https://")):
            raise ValueError(f"api_url must start with http:// or https://, got {self.api_url!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be 1..65535, got {self.port}")
        if self.nameserver:
            nameserver_address(self.nameserver)  # raises naming the problem
        for name in ("interval_s", "resolve_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
