"""Phi-accrual timing, driven by a fake clock."""

from __future__ import annotations

import math

import pytest

from daemon.cluster.detector import PhiAccrualDetector, phi
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import DetectorConfig

pytestmark = pytest.mark.timeout(30)


def steady(det: PhiAccrualDetector, clock: FakeClock, node: str, n: int, every: float) -> None:
    for _ in range(n):
        det.heartbeat(node)
        clock.advance(every)
    clock.advance(-every)  # leave the clock at the last heartbeat


def time_to_suspect(det: PhiAccrualDetector, clock: FakeClock, node: str) -> float:
    waited = 0.0
    while det.is_alive(node):
        clock.advance(0.01)
        waited += 0.01
        assert waited < 60, "never suspected"
    return waited


def test_default_detects_silence_within_a_few_seconds() -> None:
    clock = FakeClock()
    det = PhiAccrualDetector(DetectorConfig(), clock)
    steady(det, clock, "a", 50, 0.5)
    waited = time_to_suspect(det, clock, "a")
    # Not before the acceptable pause, and well inside SIGSTOP's 3 s goal.
    assert 1.5 < waited < 3.0


def test_detection_time_does_not_depend_on_cluster_size() -> None:
    times = []
    for size in (3, 12, 48):
        clock = FakeClock()
        det = PhiAccrualDetector(DetectorConfig(), clock)
        for _ in range(40):
            for i in range(size):
                det.heartbeat(f"n{i}")
            clock.advance(0.5)
        clock.advance(-0.5)
        times.append(time_to_suspect(det, clock, "n0"))
        assert set(det.suspects()) == {f"n{i}" for i in range(size)}
    assert max(times) - min(times) < 0.02


def test_jittery_sender_gets_more_slack() -> None:
    clock = FakeClock()
    det = PhiAccrualDetector(DetectorConfig(), clock)
    for i in range(60):
        det.heartbeat("j")
        clock.advance(0.2 if i % 2 else 0.8)
    clock2 = FakeClock()
    regular = PhiAccrualDetector(DetectorConfig(), clock2)
    steady(regular, clock2, "r", 60, 0.5)
    assert time_to_suspect(det, clock, "j") > time_to_suspect(regular, clock2, "r")


def test_reset_all_forgives_our_own_outage() -> None:
    clock = FakeClock()
    det = PhiAccrualDetector(DetectorConfig(), clock)
    steady(det, clock, "a", 10, 0.5)
    clock.advance(30)
    assert det.suspects() == ["a"]
    det.reset_all()
    assert det.is_alive("a")
    assert det.age("a") == 0.0
    assert det.age("nobody") is None


@pytest.mark.parametrize("elapsed", [-1e9, -5.0, 0.0, 1.0, 2.0, 10.0, 1e6, 1e12])
def test_phi_is_finite_and_monotone(elapsed: float) -> None:
    value = phi(elapsed, 1.5, 0.1)
    assert math.isfinite(value) and value >= 0
    assert phi(elapsed + 0.1, 1.5, 0.1) >= value


def test_a_seed_starts_the_clock_but_teaches_no_rhythm() -> None:
    clock = FakeClock()
    det = PhiAccrualDetector(DetectorConfig(), clock)
    det.heartbeat("a", seed=True)  # seen "up"
    clock.advance(0.05)
    steady(det, clock, "a", 6, 0.5)  # the first real heartbeat 50 ms later
    fresh_clock = FakeClock()
    fresh = PhiAccrualDetector(DetectorConfig(), fresh_clock)
    steady(fresh, fresh_clock, "a", 6, 0.5)
    assert time_to_suspect(det, clock, "a") == pytest.approx(
        time_to_suspect(fresh, fresh_clock, "a"), abs=0.02)
    silent = PhiAccrualDetector(DetectorConfig(), clock)
    silent.heartbeat("b", seed=True)
    assert 1.5 < time_to_suspect(silent, clock, "b") < 3.0  # never heard: still caught


def test_silence_counts_only_up_to_the_horizon_the_caller_vouches_for() -> None:
    """A node cut off from the broker must not blame its peers for silence after its own
    heartbeats stopped coming back (the simulator's seed 6355: it elected itself)."""
    clock = FakeClock()
    det = PhiAccrualDetector(DetectorConfig(), clock)
    steady(det, clock, "a", 10, 0.5)
    last_echo = clock.monotonic()  # our own heartbeat came back with a's last one
    clock.advance(30)
    assert det.suspects() == ["a"]  # judged up to now: dead
    assert det.is_alive("a", until=last_echo)  # judged up to our last echo: nothing missed
    assert det.phi("a", until=last_echo + 30) == det.phi("a")  # never past now
    # A horizon before a's last beat counts no silence at all.
    assert det.phi("a", until=last_echo - 5) == det.phi("a", until=last_echo)
