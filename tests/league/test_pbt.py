"""PBT's rule: which members exploit which, and explore within the bounds."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.league.pbt import exploit_pairs, explore

SETTINGS = settings(max_examples=200, deadline=None)

fitnesses = st.dictionaries(
    st.sampled_from([f"member_{i}" for i in range(12)]),
    st.floats(-500, 500, allow_nan=False),
    max_size=12,
)


@SETTINGS
@given(fitness=fitnesses, fraction=st.floats(0.01, 0.5), seed=st.integers(0, 2**32))
def test_the_bottom_fraction_copies_the_top_fraction(fitness, fraction, seed):
    pairs = exploit_pairs(fitness, fraction, random.Random(seed))
    n = len(fitness)
    if n < 2:
        assert pairs == []
        return
    k = max(1, min(n // 2, math.floor(fraction * n)))
    ranked = sorted(fitness, key=lambda m: (-fitness[m], m))
    assert [w for w, _ in pairs] == ranked[n - k :]  # every bottom member, in rank order
    for worse, better in pairs:
        assert better in ranked[:k] and worse != better
        assert fitness[better] >= fitness[worse]


def test_ranking_by_fitness_with_ties_by_name():
    fitness = {"member_0": 1.0, "member_1": 5.0, "member_2": 3.0, "member_3": 1.0}
    pairs = exploit_pairs(fitness, 0.25, random.Random(0))
    assert pairs == [("member_3", "member_1")]  # 1 of 4; member_0 < member_3 by name
    pairs = exploit_pairs(fitness, 0.5, random.Random(0))
    assert {w for w, _ in pairs} == {"member_0", "member_3"}
    assert {b for _, b in pairs} <= {"member_1", "member_2"}


bounds_st = st.tuples(st.floats(1e-6, 1.0), st.floats(1.0, 1e3)).map(lambda b: (b[0], b[0] * b[1]))


@SETTINGS
@given(
    low_high=bounds_st,
    value=st.floats(1e-9, 1e6),
    perturb=st.lists(st.floats(0.1, 10), min_size=1, max_size=4),
    p=st.floats(0, 1),
    seed=st.integers(0, 2**32),
)
def test_explore_stays_in_bounds_and_follows_the_perturb_or_resample_rule(
    low_high, value, perturb, p, seed
):
    low, high = low_high
    rng = random.Random(seed)
    out = explore({"learner.lr": value}, {"learner.lr": (low, high)}, perturb, p, rng)
    assert low <= out["learner.lr"] <= high
    # The same draws, replayed: a resample below p, else one of the perturb factors, clipped.
    replay = random.Random(seed)
    if replay.random() < p:
        drawn = math.exp(replay.uniform(math.log(low), math.log(high)))
        assert math.isclose(out["learner.lr"], min(high, max(low, drawn)))
    else:
        factor = replay.choice(list(perturb))
        assert out["learner.lr"] == min(high, max(low, value * factor))


def test_explore_never_resamples_at_probability_zero_and_always_at_one():
    bounds = {"learner.lr": (1e-4, 1e-2), "ppo.entropy_coef": (1e-3, 0.1)}
    values = {"learner.lr": 1e-3, "ppo.entropy_coef": 0.01}
    rng = random.Random(3)
    for _ in range(50):
        out = explore(values, bounds, [0.8, 1.2], 0.0, rng)
        for name, v in out.items():
            assert math.isclose(v, values[name] * 0.8) or math.isclose(v, values[name] * 1.2)
    resampled = [explore(values, bounds, [1.0], 1.0, rng)["learner.lr"] for _ in range(200)]
    assert len(set(resampled)) == 200 and all(1e-4 <= v <= 1e-2 for v in resampled)
