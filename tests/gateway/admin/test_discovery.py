"""DNS discovery: the name's addresses become replicas, added and removed as the answer changes."""

from __future__ import annotations

import contextlib
import socket
import socketserver
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

from gateway.admin import dns
from gateway.admin.config import DiscoveryConfig, nameserver_address
from gateway.admin.discovery import DnsDiscovery
from gateway.config import parse_config
from gateway.config_loader import ConfigError
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.admin.conftest import SLOW, fleet_config, removed_while_busy, started
from tests.gateway.admin.load import StreamingLoad
from tests.gateway.conftest import eventually


async def test_a_name_resolved_by_the_system_resolver_becomes_a_replica(
    fleet3: SimFleet,
) -> None:
    port = fleet3.replicas[2].port
    discovery = DiscoveryConfig(
        mode="dns", hostname="localhost", port=port, family="ipv4", interval_s=0.1
    )
    async with running_gateway(fleet_config(fleet3, first=1, discovery=discovery)) as gw:
        name = f"127.0.0.1:{port}"
        pool = gw.runtime.pool
        # Its origin is recorded once the add has returned (the replica may be healthy first).
        await eventually(lambda: gw.runtime.fleet.origins.get(name) == "dns", timeout=5.0)
        assert pool[name].healthy
        assert pool[name].config.url == f"http://127.0.0.1:{port}"
        # Re-resolved every round: still one replica for the one address.
        rounds = pool[name].scrapes_total
        await eventually(lambda: pool[name].scrapes_total > rounds, timeout=10.0)
        assert sorted(pool.replicas) == sorted(["sim-0", name])


def _port_free_on(hosts: list[str]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            with contextlib.ExitStack() as stack:
                for host in hosts[1:]:
                    t = stack.enter_context(socket.socket())
                    t.bind((host, port))
            return port
        except OSError:
            continue
    raise AssertionError("no port free on every host")


@contextlib.asynccontextmanager
async def _two_hosts() -> AsyncIterator[int]:
    """One simulated replica on 127.0.0.2 and one on 127.0.0.3, on the same port."""
    port = _port_free_on(["127.0.0.2", "127.0.0.3"])
    async with (
        SimFleet(SLOW, replicas=1, host="127.0.0.2", base_port=port),
        SimFleet(SLOW, replicas=1, host="127.0.0.3", base_port=port),
    ):
        yield port


class Answers:
    """The name's answer, changed by the test; an OSError stands for a failed lookup."""

    def __init__(self) -> None:
        self.addresses: list[str] | OSError = []
        self.asked: list[tuple[str, int, str]] = []

    async def __call__(self, hostname: str, port: int, family: str) -> list[str]:
        self.asked.append((hostname, port, family))
        if isinstance(self.addresses, OSError):
            raise self.addresses
        return list(self.addresses)


async def test_changing_answers_add_and_remove_replicas_under_load(fleet3: SimFleet) -> None:
    async with _two_hosts() as port:
        # Static sim-0 beside the discovered ones; the loop is driven round by round here.
        cfg = fleet_config(fleet3, first=1)
        cfg = replace(cfg, discovery=replace(cfg.discovery, slow_start=False))
        async with running_gateway(cfg) as gw:
            pool, fleet = gw.runtime.pool, gw.runtime.fleet
            answers = Answers()
            dns = DnsDiscovery(
                DiscoveryConfig(mode="dns", hostname="vllm.svc", port=port), fleet, answers
            )
            two, three = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
            answers.addresses = ["127.0.0.2"]
            assert await dns.sync_once() == ([two], [])
            assert answers.asked == [("vllm.svc", port, "any")]
            async with StreamingLoad(gw.url, clients=9) as load:
                answers.addresses = ["127.0.0.2", "127.0.0.3"]
                assert await dns.sync_once() == ([three], [])
                assert await dns.sync_once() == ([], [])  # the same answer changes nothing
                await eventually(lambda: started(pool[three]) > 5, timeout=10.0)
                # A failed lookup changes nothing.
                answers.addresses = OSError("Temporary failure in name resolution")
                assert await dns.sync_once() == ([], [])
                assert sorted(pool.replicas) == sorted(["sim-0", two, three])
                # .2 leaves the answer: drained, removed once its streams are done.
                answers.addresses = ["127.0.0.3"]
                await eventually(lambda: pool[two].in_flight > 0, what="streams on .2")
                leaving = pool[two]
                assert await dns.sync_once() == ([], [two])
                assert two not in pool.replicas and leaving.in_flight == 0
                assert leaving.drained
                await load.wait_for(20)
            load.check()
            assert {n: fleet.origins[n] for n in pool.replicas} == {
                "sim-0": "config",
                three: "dns",
            }


def test_dns_mode_needs_a_hostname_and_valid_keys() -> None:
    with pytest.raises(ConfigError, match="discovery: hostname is required"):
        parse_config({"discovery": {"mode": "dns"}})
    with pytest.raises(ConfigError, match=r"discovery\.mode"):
        parse_config({"discovery": {"mode": 3}})
    with pytest.raises(ConfigError, match="mode must be one of static, dns"):
        parse_config({"discovery": {"mode": "k8s"}})
    with pytest.raises(ConfigError, match=r"discovery\.hostnme: unknown key"):
        parse_config({"discovery": {"hostnme": "x"}})
    cfg = parse_config({"discovery": {"mode": "dns", "hostname": "x", "family": "ipv6"}})
    assert DnsDiscovery(cfg.discovery, None).replica_config("fd00::5").url == (  # type: ignore[arg-type]
        "http://[fd00::5]:8000"
    )


class Zone(BaseResolver):  # type: ignore[misc]
    """A real DNS server on 127.0.0.1 (UDP and TCP, one port) answering from `records`."""

    def __init__(self) -> None:
        # name -> addresses; a name missing here is NXDOMAIN. Replaced whole by the test.
        self.records: dict[str, list[str]] = {}
        self.asked: list[tuple[str, str, str]] = []

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        q = request.q
        name = str(q.qname).rstrip(".")
        self.asked.append((name, QTYPE[q.qtype], handler.protocol))
        addresses = self.records.get(name)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for address in addresses:
            v6 = ":" in address
            if q.qtype == (QTYPE.AAAA if v6 else QTYPE.A):
                rdata = AAAA(address) if v6 else A(address)
                reply.add_answer(RR(q.qname, q.qtype, rdata=rdata, ttl=1))
        return reply


class _Truncating(DNSHandler):  # type: ignore[misc]
    udplen = 512  # as a server without EDNS would: a large answer says "ask over TCP"


@pytest.fixture
def zone(request: pytest.FixtureRequest) -> Iterator[tuple[Zone, int]]:
    """The zone and its port; the UDP side truncates past 512 bytes when parametrized so."""
    resolver = Zone()
    quiet = DNSLogger(logf=lambda _line: None)
    handler = _Truncating if getattr(request, "param", "") == "truncating" else DNSHandler
    # The UDP port's TCP twin may be taken by another socket: try another pair, leaking none.
    for _ in range(20):
        udp = DNSServer(resolver, "127.0.0.1", 0, logger=quiet, handler=handler)
        port = int(udp.server.server_address[1])
        try:
            tcp = DNSServer(resolver, "127.0.0.1", port, tcp=True, logger=quiet)
            break
        except OSError:
            udp.server.server_close()
    else:
        raise AssertionError("no port free for both UDP and TCP")
    servers: list[socketserver.BaseServer] = [udp.server, tcp.server]
    udp.start_thread()
    tcp.start_thread()
    try:
        yield resolver, port
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


async def test_the_resolver_asks_a_real_dns_server_for_each_family(zone: tuple[Zone, int]) -> None:
    records, port = zone
    server = ("127.0.0.1", port)
    records.records = {"vllm.svc.test": ["127.0.0.3", "127.0.0.2", "fd00::7"]}
    assert await dns.resolve(server, "vllm.svc.test", "any", 2.0) == [
        "127.0.0.2",
        "127.0.0.3",
        "fd00::7",
    ]
    assert await dns.resolve(server, "vllm.svc.test.", "ipv4", 2.0) == ["127.0.0.2", "127.0.0.3"]
    assert await dns.resolve(server, "vllm.svc.test", "ipv6", 2.0) == ["fd00::7"]
    assert {(n, t) for n, t, _ in records.asked} == {
        ("vllm.svc.test", "A"),
        ("vllm.svc.test", "AAAA"),
    }
    with pytest.raises(OSError, match="NXDOMAIN"):
        await dns.resolve(server, "gone.svc.test", "any", 2.0)
    records.records = {"v6only.svc.test": ["fd00::7"]}
    with pytest.raises(OSError, match="has no address"):  # as getaddrinfo: nothing to use
        await dns.resolve(server, "v6only.svc.test", "ipv4", 2.0)


@pytest.mark.parametrize("zone", ["truncating"], indirect=True)
async def test_a_truncated_udp_answer_is_asked_again_over_tcp(zone: tuple[Zone, int]) -> None:
    records, port = zone
    many = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(120)]  # ~2 KB: over 512 bytes
    records.records = {"big.svc.test": many}
    got = await dns.resolve(("127.0.0.1", port), "big.svc.test", "ipv4", 2.0)
    assert got == sorted(many)
    assert [p for _, _, p in records.asked] == ["udp", "tcp"]


async def test_a_silent_or_absent_server_is_a_failed_lookup_within_the_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))  # bound, never answers
        with pytest.raises(OSError, match="no answer"):
            await dns.resolve(silent.getsockname(), "vllm.svc.test", "ipv4", 0.2)
    # Nothing bound there now: refused (ICMP) or timed out, an OSError either way.
    with pytest.raises(OSError):
        await dns.resolve(silent.getsockname(), "vllm.svc.test", "ipv4", 0.2)


async def test_discovery_follows_a_real_dns_servers_changing_answers_under_load(
    fleet3: SimFleet, zone: tuple[Zone, int]
) -> None:
    records, dns_port = zone
    name = "vllm.headless.test"
    async with _two_hosts() as port:
        discovery = DiscoveryConfig(
            mode="dns",
            hostname=name,
            port=port,
            family="ipv4",
            interval_s=0.05,
            resolve_timeout_s=1.0,
            nameserver=f"127.0.0.1:{dns_port}",
            slow_start=False,
        )
        async with running_gateway(fleet_config(fleet3, first=1, discovery=discovery)) as gw:
            pool, fleet = gw.runtime.pool, gw.runtime.fleet
            two, three = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
            records.records = {name: ["127.0.0.2"]}
            await eventually(lambda: fleet.origins.get(two) == "dns", 10.0, ".2 added")
            assert pool[two].healthy
            async with StreamingLoad(gw.url, clients=9) as load:
                records.records = {name: ["127.0.0.2", "127.0.0.3"]}
                await eventually(lambda: fleet.origins.get(three) == "dns", 10.0, ".3 added")
                await eventually(lambda: started(pool[three]) > 5, 10.0, "streams on .3")
                # The name vanishes (NXDOMAIN): a failed lookup, nothing changes.
                asked = len(records.asked)
                records.records = {}
                await eventually(lambda: len(records.asked) > asked + 2, 10.0, "lookups")
                assert sorted(pool.replicas) == sorted(["sim-0", two, three])
                # .2 leaves the answer while streams run on it: drained, then removed.
                async with removed_while_busy(pool, two):
                    records.records = {name: ["127.0.0.3"]}
                await load.wait_for(20)
            load.check()
            assert {n: fleet.origins[n] for n in pool.replicas} == {
                "sim-0": "config",
                three: "dns",
            }
            assert all(p == "udp" for _, _, p in records.asked)


def test_the_nameserver_key_takes_host_and_port() -> None:
    assert nameserver_address("10.96.0.10") == ("10.96.0.10", 53)
    assert nameserver_address("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert nameserver_address("[fd00::a]:5353") == ("fd00::a", 5353)
    assert nameserver_address("fd00::a") == ("fd00::a", 53)
    for bad in ("127.0.0.1:0", "127.0.0.1:x", ":53", "[fd00::a]x"):
        with pytest.raises(ConfigError, match="nameserver"):
            parse_config({"discovery": {"nameserver": bad}})
    cfg: dict[str, Any] = {"discovery": {"mode": "dns", "hostname": "x", "nameserver": "[::1]:53"}}
    assert parse_config(cfg).discovery.nameserver == "[::1]:53"
