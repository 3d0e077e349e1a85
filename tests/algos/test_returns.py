"""Vectorized return computations vs. plain-loop references written from the definitions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.algos.kernel.returns import discounted_returns, gae
from zrl.codecs.nstep import NStepTransitions, nstep_transitions

SETTINGS = settings(max_examples=150, deadline=None)


# ----------------------------------------------------------------------------- generators


@st.composite
def autoreset_blocks(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """[E, T] steps as gymnasium autoreset produces them.

    NEXT_STEP mode: a step right after an episode end is the reset-only step (invalid, not
    done); the first column may be invalid too (the previous block ended an episode on its last
    step). SAME_STEP mode: every step is valid, episodes end and restart within one step.
    """
    same_step = draw(st.booleans())
    num_envs = draw(st.integers(1, 4))
    horizon = draw(st.integers(1, 12))
    shape = (num_envs, horizon)
    seed = draw(st.integers(0, 2**32 - 1))
    p_end = draw(st.sampled_from([0.0, 0.1, 0.3, 0.6]))
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=shape).astype(np.float32)
    terminated = rng.random(shape) < p_end
    truncated = rng.random(shape) < p_end
    valid = np.ones(shape, dtype=bool)
    if same_step:
        return {
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "valid": valid,
        }
    for e in range(num_envs):
        valid[e, 0] = rng.random() < 0.8
        for t in range(horizon):
            if t > 0:
                valid[e, t] = not (terminated[e, t - 1] or truncated[e, t - 1])
            if not valid[e, t]:
                terminated[e, t] = truncated[e, t] = False
                rewards[e, t] = 0.0
    return {"rewards": rewards, "terminated": terminated, "truncated": truncated, "valid": valid}


gammas = st.one_of(st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.floats(0.0, 1.0))


# ----------------------------------------------------------------------------- n-step


def nstep_reference(rewards, terminated, truncated, valid, n, gamma):
    """One transition per valid (e, t): add gamma^k r_{t+k} until an episode end, n steps or T."""
    num_envs, horizon = rewards.shape
    rows = []
    for e in range(num_envs):
        for t in range(horizon):
            if not valid[e, t]:
                continue
            ret, k, j = 0.0, 0, t
            while True:
                ret += gamma**k * float(rewards[e, j])
                k += 1
                if terminated[e, j]:
                    discount = 0.0
                    break
                if truncated[e, j] or j == horizon - 1 or k == n:
                    discount = gamma**k
                    break
                j += 1
            rows.append((e, t, j, ret, discount))
    return rows


def as_rows(tr: NStepTransitions) -> list[tuple[int, int, int, float, float]]:
    return [
        (int(e), int(s), int(j), float(r), float(d))
        for e, s, j, r, d in zip(tr.env, tr.start, tr.end, tr.returns, tr.discounts, strict=True)
    ]


@SETTINGS
@given(block=autoreset_blocks(), n=st.integers(1, 6), gamma=gammas)
def test_nstep_matches_reference(block, n, gamma):
    tr = nstep_transitions(**block, n=n, gamma=gamma)
    expected = nstep_reference(**block, n=n, gamma=gamma)
    got = as_rows(tr)
    assert [r[:3] for r in got] == [r[:3] for r in expected]
    np.testing.assert_allclose([r[3] for r in got], [r[3] for r in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose([r[4] for r in got], [r[4] for r in expected], rtol=1e-6, atol=1e-7)
    assert len(tr) == int(block["valid"].sum())
    for arr, dtype in [
        (tr.env, np.int64),
        (tr.start, np.int64),
        (tr.end, np.int64),
        (tr.returns, np.float32),
        (tr.discounts, np.float32),
    ]:
        assert arr.dtype == dtype


def test_nstep_hand_example():
    # env 0: r = 1, 2, 3, 4 with a termination at t=1; t=2 is the reset-only step.
    # env 1: r = 1, 1, 1, 1 with a truncation at t=2; t=3 is the reset-only step.
    rewards = np.array([[1, 2, 3, 4], [1, 1, 1, 1]], dtype=np.float32)
    terminated = np.array([[0, 1, 0, 0], [0, 0, 0, 0]], dtype=bool)
    truncated = np.array([[0, 0, 0, 0], [0, 0, 1, 0]], dtype=bool)
    valid = np.array([[1, 1, 0, 1], [1, 1, 1, 0]], dtype=bool)
    tr = nstep_transitions(rewards, terminated, truncated, valid, n=3, gamma=0.5)
    assert tr.env.tolist() == [0, 0, 0, 1, 1, 1]
    assert tr.start.tolist() == [0, 1, 3, 0, 1, 2]
    assert tr.end.tolist() == [1, 1, 3, 2, 2, 2]
    np.testing.assert_allclose(tr.returns, [1 + 0.5 * 2, 2, 4, 1.75, 1.5, 1])
    np.testing.assert_allclose(tr.discounts, [0, 0, 0.5, 0.125, 0.25, 0.5])


def test_nstep_both_flags_means_terminal():
    tr = nstep_transitions(
        np.ones((1, 2), np.float32),
        np.array([[True, False]]),
        np.array([[True, False]]),
        np.array([[True, False]]),
        n=3,
        gamma=0.9,
    )
    assert tr.discounts.tolist() == [0.0]


def test_nstep_stops_before_invalid_padding():
    # A padded tail (invalid without an episode end) is treated as a cut, never summed over.
    rewards = np.array([[1.0, 1.0, 100.0]], np.float32)
    no = np.zeros((1, 3), dtype=bool)
    valid = np.array([[True, True, False]])
    tr = nstep_transitions(rewards, no, no, valid, n=3, gamma=1.0)
    assert tr.end.tolist() == [1, 1]
    np.testing.assert_allclose(tr.returns, [2.0, 1.0])
    np.testing.assert_allclose(tr.discounts, [1.0, 1.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n=0"),
        ({"gamma": 1.5}, "gamma=1.5"),
        ({"gamma": -0.1}, "gamma=-0.1"),
        ({"truncated": np.zeros((2, 4), bool)}, "truncated"),
        ({"rewards": np.zeros(3, np.float32)}, "rewards"),
    ],
)
def test_nstep_validation(kwargs, match):
    args: dict[str, Any] = {
        "rewards": np.zeros((2, 3), np.float32),
        "terminated": np.zeros((2, 3), bool),
        "truncated": np.zeros((2, 3), bool),
        "valid": np.ones((2, 3), bool),
        "n": 3,
        "gamma": 0.9,
    }
    if "rewards" in kwargs:
        args = {**args, "terminated": np.zeros(3, bool)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        nstep_transitions(**args)


# ----------------------------------------------------------------------------- on-policy


@st.composite
def onpolicy_batches(draw: st.DrawFn) -> dict[str, np.ndarray]:
    num_envs = draw(st.integers(1, 3))
    horizon = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_done = draw(st.sampled_from([0.0, 0.2, 0.5]))
    return {
        "rewards": rng.normal(size=(num_envs, horizon)).astype(np.float32),
        "values": rng.normal(size=(num_envs, horizon)).astype(np.float32),
        "dones": rng.random((num_envs, horizon)) < p_done,
        "bootstrap_value": rng.normal(size=num_envs).astype(np.float32),
    }


def discounted_reference(rewards, dones, bootstrap, gamma):
    """G_t = sum_k gamma^k r_{t+k} up to and including the first done, else + gamma^(T-t) * boot."""
    num_envs, horizon = rewards.shape
    out = np.zeros((num_envs, horizon))
    for e in range(num_envs):
        for t in range(horizon):
            total, ended = 0.0, False
            for k in range(horizon - t):
                total += gamma**k * rewards[e, t + k]
                if dones[e, t + k]:
                    ended = True
                    break
            if not ended:
                total += gamma ** (horizon - t) * bootstrap[e]
            out[e, t] = total
    return out


def gae_reference(rewards, values, dones, bootstrap, gamma, lam):
    """Paper form: A_t = sum_l (gamma lam)^l delta_{t+l}, the sum stopping at the episode end."""
    num_envs, horizon = rewards.shape
    adv = np.zeros((num_envs, horizon))
    for e in range(num_envs):
        for t in range(horizon):
            for k in range(horizon - t):
                i = t + k
                next_value = bootstrap[e] if i == horizon - 1 else values[e, i + 1]
                delta = rewards[e, i] + gamma * (not dones[e, i]) * next_value - values[e, i]
                adv[e, t] += (gamma * lam) ** k * delta
                if dones[e, i]:
                    break
    return adv, adv + values


@SETTINGS
@given(batch=onpolicy_batches(), gamma=gammas)
def test_discounted_returns_matches_reference(batch, gamma):
    got = discounted_returns(batch["rewards"], batch["dones"], batch["bootstrap_value"], gamma)
    expected = discounted_reference(
        batch["rewards"], batch["dones"], batch["bootstrap_value"], gamma
    )
    assert got.dtype == np.float32 and got.shape == batch["rewards"].shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # A single [T] row gives the same as its [E, T] counterpart.
    row = discounted_returns(
        batch["rewards"][0], batch["dones"][0], batch["bootstrap_value"][0], gamma
    )
    np.testing.assert_allclose(row, got[0], rtol=1e-6)


@SETTINGS
@given(batch=onpolicy_batches(), gamma=gammas, lam=gammas)
def test_gae_matches_reference(batch, gamma, lam):
    adv, ret = gae(**batch, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(
        batch["rewards"], batch["values"], batch["dones"], batch["bootstrap_value"], gamma, lam
    )
    assert adv.dtype == ret.dtype == np.float32
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(batch=onpolicy_batches(), gamma=gammas)
def test_gae_lambda_one_is_discounted_return_minus_value(batch, gamma):
    adv, ret = gae(**batch, gamma=gamma, lam=1.0)
    disc = discounted_returns(batch["rewards"], batch["dones"], batch["bootstrap_value"], gamma)
    np.testing.assert_allclose(adv, disc - batch["values"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, disc, rtol=1e-4, atol=1e-4)


def test_gae_lambda_zero_is_one_step_td():
    rewards = np.array([[1.0, 2.0]], np.float32)
    values = np.array([[0.5, 0.25]], np.float32)
    adv, _ = gae(rewards, values, np.zeros((1, 2), bool), np.array([4.0]), gamma=0.5, lam=0.0)
    np.testing.assert_allclose(adv, [[1 + 0.5 * 0.25 - 0.5, 2 + 0.5 * 4 - 0.25]])


def test_onpolicy_validation():
    r = np.zeros((2, 3), np.float32)
    d = np.zeros((2, 3), bool)
    with pytest.raises(ValueError, match="bootstrap_value"):
        discounted_returns(r, d, np.zeros(3), 0.9)
    with pytest.raises(ValueError, match="dones"):
        discounted_returns(r, d[:, :2], np.zeros(2), 0.9)
    with pytest.raises(ValueError, match="lam=2"):
        gae(r, r, d, np.zeros(2), 0.9, 2)
    with pytest.raises(ValueError, match="values"):
        gae(r, r[:1], d, np.zeros(2), 0.9, 0.95)
    with pytest.raises(ValueError, match="gamma=-1"):
        gae(r, r, d, np.zeros(2), -1, 0.95)
