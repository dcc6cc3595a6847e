"""The gRPC front end's configuration (the `[grpc]` TOML table)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """The gRPC front end: off unless enabled; shares the HTTP front end's pipeline and keys."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 50051
    # A request message over this is refused with RESOURCE_EXHAUSTED before it is parsed.
    max_receive_message_bytes: int = 4 * 1024 * 1024
    max_send_message_bytes: int = 16 * 1024 * 1024
    # Server pings on idle connections find dead clients (and keep NAT/LB mappings alive).
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    keepalive_permit_without_calls: bool = False
    # Clients pinging more often than this are sent GOAWAY (too_many_pings).
    min_client_ping_interval_s: float = 10.0
    # HTTP/2 streams per connection, and RPCs in the whole server (0 = unbounded); RPCs beyond
    # max_concurrent_rpcs are refused with RESOURCE_EXHAUSTED.
    max_concurrent_streams: int = 1024
    max_concurrent_rpcs: int = 0
    # How often the health service re-reads readiness (replica health and draining).
    health_poll_interval_s: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        for name in (
            "max_receive_message_bytes",
            "max_send_message_bytes",
            "keepalive_time_s",
            "keepalive_timeout_s",
            "min_client_ping_interval_s",
            "max_concurrent_streams",
            "health_poll_interval_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_concurrent_rpcs < 0:
            raise ValueError(f"max_concurrent_rpcs must be >= 0, got {self.max_concurrent_rpcs}")

    @property
    def address(self) -> str:
        """host:port as gRPC binds it (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def server_options(self) -> list[tuple[str, int]]:
        """The grpc.aio channel arguments these settings stand for."""
        return [
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            ("grpc.keepalive_time_ms", round(self.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            (
                "grpc.http2.min_ping_interval_without_data_ms",
                round(self.min_client_ping_interval_s * 1000),
            ),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            # gRPC sets SO_REUSEPORT by default: a second gateway on the same port would then
            # silently take half the connections instead of failing to start.
            ("grpc.so_reuseport", 0),
        ]
