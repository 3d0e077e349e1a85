"""RateLimiter: Reverb SampleToInsertRatio semantics."""

from __future__ import annotations

import numpy as np
import pytest

from zrl.replay.rate_limiter import RateLimiter


def test_min_size_gate_blocks_sampling_until_reached():
    rl = RateLimiter(min_size_to_sample=1000, samples_per_insert=0.0, error_buffer=0.0)
    assert not rl.can_sample(1, size=120)
    assert rl.why_blocked(1, size=120) == "replay has 120 items, needs 1000 to start sampling"
    assert not rl.can_sample(1, size=999)
    assert rl.can_sample(1, size=1000)
    assert rl.why_blocked(256, size=5000) is None


def test_no_ratio_mode_never_blocks_inserts_or_large_samples():
    rl = RateLimiter(min_size_to_sample=10, samples_per_insert=-1.0, error_buffer=0.0)
    rl.on_insert(10)
    rl.on_sample(10**9)
    assert rl.can_insert(1, size=10)
    assert rl.can_sample(10**6, size=10)


def test_ratio_blocks_sampling_when_learner_is_ahead():
    # offset = 2 * 10 = 20, min_diff = 16, max_diff = 24
    rl = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=4.0)
    assert (rl.min_diff, rl.max_diff) == (16.0, 24.0)
    rl.on_insert(10)  # diff = 20
    assert rl.can_sample(4, size=10)  # 20 - 4 = 16 >= 16
    assert not rl.can_sample(5, size=10)
    rl.on_sample(4)
    assert not rl.can_sample(1, size=10)
    reason = rl.why_blocked(1, size=10)
    assert reason is not None and "above target 2 +- 4" in reason
    assert "needs 1 more inserts" in reason
    rl.on_insert(1)  # diff = 22 - 4 = 18
    assert rl.can_sample(2, size=11) and not rl.can_sample(3, size=11)


def test_why_blocked_reports_ratio_and_inserts_needed():
    rl = RateLimiter(min_size_to_sample=100, samples_per_insert=8.0, error_buffer=80.0)
    rl.on_insert(160)  # 60 inserts past warm-up
    rl.on_sample(520)
    # diff = 1280 - 520 = 760 ; sampling 64 -> 696 < min_diff = 720
    reason = rl.why_blocked(64, size=160)
    assert reason == (
        "samples/insert ratio 9.7 above target 8 +- 80 samples "
        "(520 sampled + 64 requested vs 160 inserted); needs 3 more inserts"
    )
    rl.on_insert(3)
    assert rl.can_sample(64, size=163)


def test_ratio_blocks_inserts_when_learner_falls_behind():
    rl = RateLimiter(min_size_to_sample=10, samples_per_insert=2.0, error_buffer=4.0)
    for _ in range(11):
        assert rl.can_insert(1, size=rl.inserts)
        rl.on_insert(1)
    # (11 + 1) * 2 - 0 = 24 <= 24 still fine, (12 + 1) * 2 = 26 > 24 is not
    assert rl.can_insert(1, size=11)
    rl.on_insert(1)
    assert not rl.can_insert(1, size=12)
    rl.on_sample(2)
    assert rl.can_insert(1, size=12)


def test_inserts_never_blocked_during_warm_up():
    # size can stay below min_size (e.g. a FIFO being drained) while counters say "too many
    # inserts"; warm-up must still let actors fill the table.
    rl = RateLimiter(min_size_to_sample=100, samples_per_insert=1.0, error_buffer=1.0)
    rl.on_insert(10_000)
    assert not rl.can_insert(1, size=100)
    assert rl.can_insert(1, size=99)


def test_big_batch_insert_is_judged_by_its_first_item():
    rl = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=1.0)
    rl.on_insert(1)
    rl.on_sample(1)  # diff = 0, max_diff = 2
    # a 64-item batch would push diff to 64 > max_diff, but its first item fits
    assert rl.can_insert(64, size=1)
    rl.on_insert(64)
    assert not rl.can_insert(1, size=65)


def test_no_deadlock_with_rollout_sized_inserts():
    """Actors insert 64-item rollouts, the learner samples 8 at a time; both must progress."""
    rl = RateLimiter(min_size_to_sample=64, samples_per_insert=1.0, error_buffer=1.0)
    size = 0
    for _ in range(200):
        progressed = False
        if rl.can_insert(64, size):
            rl.on_insert(64)
            size += 64
            progressed = True
        while rl.can_sample(8, size):
            rl.on_sample(8)
            progressed = True
        assert progressed, rl
        diff = rl.inserts * rl.samples_per_insert - rl.samples
        assert rl.min_diff <= diff <= rl.max_diff + 63 * rl.samples_per_insert
    assert rl.inserts >= 64 * 100 and rl.samples >= rl.inserts - 64 * 2


def test_long_run_ratio_converges_to_target():
    rng = np.random.default_rng(0)
    spi = 4.0
    rl = RateLimiter(min_size_to_sample=100, samples_per_insert=spi, error_buffer=40.0)
    size = 0
    for _ in range(20_000):
        if rng.random() < 0.5:
            if rl.can_insert(1, size):
                rl.on_insert(1)
                size += 1
        elif rl.can_sample(2, size):
            rl.on_sample(2)
    assert rl.inserts > 1000
    ratio = rl.samples / (rl.inserts - 100)
    assert ratio == pytest.approx(spi, rel=0.05)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_size_to_sample": 0}, "min_size_to_sample.*0"),
        ({"min_size_to_sample": 1.5}, "min_size_to_sample.*1.5"),
        ({"samples_per_insert": float("nan")}, "samples_per_insert.*nan"),
        ({"error_buffer": -1.0}, "error_buffer.*-1.0"),
        ({"error_buffer": float("inf")}, "error_buffer.*inf"),
        ({"samples_per_insert": 8.0, "error_buffer": 4.0}, r"max\(1.0, samples_per_insert\)=8"),
        ({"samples_per_insert": 0.5, "error_buffer": 0.5}, "error_buffer.*0.5"),
    ],
)
def test_bad_constructor_args(kwargs, match):
    args = {"min_size_to_sample": 10, "samples_per_insert": 1.0, "error_buffer": 2.0} | kwargs
    with pytest.raises(ValueError, match=match):
        RateLimiter(**args)


def test_bad_counts():
    rl = RateLimiter(10, 1.0, 2.0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        rl.can_sample(0, size=10)
    with pytest.raises(ValueError, match="n must be >= 1"):
        rl.can_insert(0, size=10)
    with pytest.raises(ValueError, match="n must be >= 0"):
        rl.on_insert(-1)


def test_state_dict_round_trip():
    rl = RateLimiter(10, 2.0, 4.0)
    rl.on_insert(37)
    rl.on_sample(51)
    other = RateLimiter(10, 2.0, 4.0)
    other.load_state_dict(rl.state_dict())
    assert (other.inserts, other.samples) == (37, 51)
    for n in (1, 8, 60):
        assert other.can_sample(n, 37) == rl.can_sample(n, 37)
        assert other.why_blocked(n, 37) == rl.why_blocked(n, 37)
    assert other.can_insert(1, 37) == rl.can_insert(1, 37)
