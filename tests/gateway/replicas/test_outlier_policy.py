"""The outlier policy alone: detectors, growing ejections, decay, the share cap, the ramp."""

from __future__ import annotations

import itertools

import pytest

from gateway.config import GatewayConfig, HealthCheckConfig, parse_config
from gateway.config_loader import ConfigError
from gateway.replicas.outlier import Ejection, OutlierConfig, OutlierPolicy

NAMES = ("r0", "r1", "r2", "r3")


def policy(n: int = 4, **cfg: object) -> OutlierPolicy:
    return OutlierPolicy(OutlierConfig(**cfg), NAMES[:n])  # type: ignore[arg-type]


def fail(
    p: OutlierPolicy, name: str, now: float, times: int = 1, detail: str = ""
) -> list[Ejection]:
    """`times` failures of `name` at `now`; the ejections they caused."""
    out = []
    for _ in range(times):
        ejection = p.failure(name, now, detail, others_routable=len(NAMES) - 1)
        if ejection is not None:
            out.append(ejection)
    return out


# --- detectors ------------------------------------------------------------------------------


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    p = policy()
    assert fail(p, "r0", 0.0, times=2) == []
    p.success("r0", 0.1)
    assert fail(p, "r0", 0.2, times=2) == []
    [ejection] = fail(p, "r0", 0.3)
    assert ejection == Ejection("r0", "consecutive_failures", 30.0, 30.3, 1)
    assert p.ejected("r0") and not p.ejected("r1")


def test_an_ejected_replicas_late_outcomes_are_ignored() -> None:
    p = policy()
    fail(p, "r0", 0.0, times=3)
    # Requests sent before the ejection end after it: neither extends nor ends it.
    assert fail(p, "r0", 1.0, times=5) == []
    p.success("r0", 1.0)
    assert p.ejected("r0") and p.ejected_count("r0") == 1


def test_a_failure_rate_over_the_window_ejects_once_the_window_holds_enough() -> None:
    p = policy(consecutive_failures=0, failure_rate_min_requests=40)
    # 1 failure in 20: 5%, but the window holds too few requests to judge.
    for i in range(19):
        p.success("r1", i * 0.1)
    assert fail(p, "r1", 1.9) == []
    for i in range(19):
        p.success("r1", 2.0 + i * 0.1)
    # 40 requests, 2 failed: 5%.
    [ejection] = fail(p, "r1", 3.9)
    assert ejection.reason == "failure_rate"


def test_failures_leave_the_window_after_its_length() -> None:
    p = policy(
        consecutive_failures=0,
        failure_rate=0.1,
        failure_rate_min_requests=10,
        failure_rate_window_s=10.0,
    )
    fail(p, "r0", 0.0)
    for i in range(8):
        p.success("r0", 11.0 + i * 0.01)
    # Had the first failure stayed, 2 of 10 would eject; gone, the window holds only 9.
    assert fail(p, "r0", 12.0) == []
    p.success("r0", 12.1)
    [ejection] = fail(p, "r0", 12.2)  # 2 of 11 in the window
    assert ejection.reason == "failure_rate"


@pytest.mark.parametrize(
    "body",
    [
        '{"error": {"message": "CUDA out of memory. Tried to allocate 2.00 GiB"}}',
        "torch.OutOfMemoryError: ...",
        "Insufficient KV cache: the request needs 9 blocks",
    ],
)
def test_an_out_of_memory_body_ejects_at_once(body: str) -> None:
    [ejection] = fail(policy(), "r2", 0.0, detail=body)
    assert ejection.reason == "out_of_memory" and ejection.count == 1


def test_out_of_memory_detection_can_be_turned_off() -> None:
    p = policy(oom_patterns=())
    assert fail(p, "r2", 0.0, detail="CUDA out of memory") == []


# --- how long ---------------------------------------------------------------------------------


def test_each_ejection_lasts_longer_up_to_the_cap() -> None:
    p = policy(base_ejection_s=30.0, max_ejection_s=100.0, decay_s=1000.0)
    now, durations = 0.0, []
    for _ in range(5):
        [ejection] = fail(p, "r0", now, times=3)
        durations.append(ejection.duration_s)
        now = ejection.until
        assert p.tick(now - 0.001) == ([], [])
        assert p.tick(now)[0] == ["r0"] and not p.ejected("r0")
        p.up("r0", now)
    assert durations == [30.0, 60.0, 90.0, 100.0, 100.0]


def test_the_ejection_count_decays_after_a_clean_period() -> None:
    p = policy(base_ejection_s=30.0, decay_s=60.0)
    now = 0.0
    for _ in range(3):
        [ejection] = fail(p, "r0", now, times=3)
        now = ejection.until
        p.tick(now)
    assert ejection.count == 3 and ejection.duration_s == 90.0
    # Two decay periods clean after the last ejection ended: 3 - 2 + 1.
    [again] = fail(p, "r0", ejection.until + 125.0, times=3)
    assert again.count == 2 and again.duration_s == 60.0


# --- how many -------------------------------------------------------------------------------


def test_at_most_the_share_cap_is_ejected_at_once() -> None:
    p = policy(n=4, max_ejected_share=0.5)
    assert fail(p, "r0", 0.0, times=3) and fail(p, "r1", 0.0, times=3)
    assert fail(p, "r2", 0.0, times=10) == []
    # Once one returns, the next failure of the held one ejects it.
    p.tick(30.0)
    assert [e.replica for e in fail(p, "r2", 30.0)] == ["r2"]


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_one_of_two_may_always_be_ejected(share: float) -> None:
    p = OutlierPolicy(OutlierConfig(max_ejected_share=share), ("a", "b"))
    assert p.failure("a", 0.0, "", 1) is None
    assert p.failure("a", 0.0, "", 1) is None
    assert p.failure("a", 0.0, "", 1) is not None
    for _ in range(5):
        assert p.failure("b", 0.0, "", 1) is None


def test_never_the_only_replica_nor_the_last_routable_one() -> None:
    alone = OutlierPolicy(OutlierConfig(), ("a",))
    assert all(alone.failure("a", 0.0, "out of memory", 0) is None for _ in range(5))
    p = policy()
    assert all(p.failure("r0", 0.0, "out of memory", 0) is None for _ in range(5))
    assert p.failure("r0", 0.0, "out of memory", 1) is not None


# --- the ramp ---------------------------------------------------------------------------------


def test_the_first_up_is_no_return_and_needs_no_ramp() -> None:
    p = policy()
    assert p.up("r0", 0.0) is False and p.fraction("r0", 0.0) == 1.0 and not p.ramping


def test_a_return_ramps_by_the_factor_every_step_until_a_full_share() -> None:
    p = policy()
    p.up("r0", 0.0)
    p.down("r0")
    assert p.up("r0", 100.0) is True and p.ramping == {"r0"}
    fractions = [p.fraction("r0", 100.0 + 10.0 * k + 5.0) for k in range(13)]
    assert fractions[:3] == pytest.approx([0.01, 0.015, 0.0225])
    assert fractions[11] == pytest.approx(0.01 * 1.5**11) and fractions[12] == 1.0
    # 0.01 x 1.5^12 > 1: the twelfth step ends it, and tick says so then.
    assert p.next_event == pytest.approx(220.0)
    assert p.tick(219.9) == ([], [])
    assert p.tick(220.0) == ([], ["r0"]) and not p.ramping


def test_an_ejection_ends_in_a_ramp_and_an_ejection_ends_a_ramp() -> None:
    p = policy()
    [ejection] = fail(p, "r0", 0.0, times=3)
    assert p.tick(ejection.until)[0] == ["r0"]
    assert p.up("r0", ejection.until) is True  # ejected: it had been up
    fail(p, "r0", ejection.until + 1.0, times=3)
    assert not p.ramping and p.fraction("r0", ejection.until + 1.0) == 1.0


def test_admission_follows_the_fraction_deterministically() -> None:
    p = policy()
    p.up("r1", 0.0)
    p.down("r1")
    p.up("r1", 0.0)
    admitted = []
    for i in range(1000):
        now = i * 0.001  # all within the first step: fraction 0.01
        if p.admitted("r1"):
            admitted.append(i)
            p.routed("r1", now)
        else:
            p.routed("r0", now)
    # One in every 100 decisions, evenly: the 101st first (the credit starts at 0).
    assert admitted == list(range(100, 1000, 100))
    assert all(b - a == 100 for a, b in itertools.pairwise(admitted))


def test_an_admitted_replica_not_chosen_stays_admitted_until_it_is() -> None:
    p = policy(ramp_start=0.5)
    p.up("r1", 0.0)
    p.down("r1")
    p.up("r1", 0.0)
    p.routed("r0", 0.0)
    p.routed("r0", 0.0)
    assert p.admitted("r1")
    p.routed("r0", 0.0)  # the router chose another: the credit stays (capped)
    assert p.admitted("r1")
    p.routed("r1", 0.0)
    assert not p.admitted("r1")


# --- configuration ------------------------------------------------------------------------


def test_passive_failure_threshold_is_an_alias_that_wins_when_set() -> None:
    assert GatewayConfig().outlier.consecutive_failures == 3
    cfg = GatewayConfig(health_check=HealthCheckConfig(passive_failure_threshold=7))
    assert cfg.outlier.consecutive_failures == 7
    loaded = parse_config({"outlier": {"consecutive_failures": 5, "ramp_start": 1.0}})
    assert loaded.outlier.consecutive_failures == 5 and loaded.outlier.ramp_start == 1.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"ramp_factor": 1.0}, "ramp_factor must be > 1"),
        ({"ramp_start": 0.0}, "ramp_start must be in (0, 1]"),
        ({"max_ejected_share": 1.5}, "max_ejected_share must be in [0, 1]"),
        ({"max_ejection_s": 10.0}, "max_ejection_s must be >= base_ejection_s"),
        ({"oom_patterns": [""]}, "oom_patterns must not hold an empty string"),
        ({"bogus": 1}, "outlier.bogus: unknown key"),
    ],
)
def test_bad_outlier_config_is_refused(table: dict[str, object], message: str) -> None:
    with pytest.raises((ConfigError, ValueError)) as info:
        parse_config({"outlier": table})
    assert message in str(info.value)


def test_a_peers_ejection_is_adopted_for_its_duration_within_this_processs_caps() -> None:
    p = policy(max_ejected_share=0.25)  # 1 of 4 at once
    peer = Ejection("r1", "consecutive_failures", 60.0, 0.0, 2)
    mine = p.adopt("r1", 10.0, peer, others_routable=3)
    assert mine == Ejection("r1", "consecutive_failures", 60.0, 70.0, 2)
    assert p.ejected("r1") and p.adopt("r1", 11.0, peer, others_routable=3) is None
    # The cap holds for adopted ejections too, and the last routable replica stays.
    assert p.adopt("r2", 11.0, peer, others_routable=3) is None
    assert policy().adopt("r2", 0.0, peer, others_routable=0) is None
    assert p.tick(69.9) == ([], []) and p.tick(70.0)[0] == ["r1"]
    # Its next local ejection counts on from the peer's: 30 s x 3.
    [again] = fail(p, "r1", 71.0, times=3)
    assert (again.count, again.duration_s) == (3, 90.0)
    assert policy().adopt("nobody", 0.0, peer, others_routable=3) is None
