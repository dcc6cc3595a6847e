from __future__ import annotations

from gateway.shared_state.link import Lateness


def test_a_run_of_timeouts_is_down_only_once_it_lasts_the_grace() -> None:
    late = Lateness(1.0)
    assert not late.late(10.0) and not late.late(10.9)
    assert late.late(11.0)


def test_an_answer_ends_the_run() -> None:
    late = Lateness(1.0)
    assert not late.late(10.0)
    late.answered()
    assert not late.late(10.5) and not late.late(11.2)  # a new run, from 10.5
    assert late.late(11.5)


def test_no_grace_is_down_at_the_first_timeout() -> None:
    assert Lateness(0.0).late(5.0)
