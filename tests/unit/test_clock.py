import pytest

from shared.clock import FakeClock, SystemClock


def test_fake_clock_moves_only_when_told() -> None:
    c = FakeClock(wall=100.0, monotonic=5.0)
    assert (c.wall(), c.monotonic()) == (100.0, 5.0)
    c.advance(2.5)
    assert (c.wall(), c.monotonic()) == (102.5, 7.5)
    c.skew_wall(-50)
    assert (c.wall(), c.monotonic()) == (52.5, 7.5)
    with pytest.raises(ValueError):
        c.advance(-1)


def test_system_clock_monotonic_never_goes_back() -> None:
    c = SystemClock()
    a = c.monotonic()
    assert c.monotonic() >= a
    assert c.wall() > 1_600_000_000
