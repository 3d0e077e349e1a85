"""``rollout_gae`` (GAE over NEXT_STEP-autoreset vector-env rollouts) vs. a plain-loop reference
written from the definition: A_t = sum_l (gamma lam)^l delta_{t+l}, the sum ending at the step
where the episode ends (terminated or truncated) or at the end of the row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.algos.kernel.returns import discounted_returns, gae, rollout_gae

SETTINGS = settings(max_examples=60, deadline=None)
gammas = st.sampled_from([0.0, 0.5, 0.9, 1.0])


def rollout_gae_reference(rewards, values, terminated, truncated, valid, bootstrap, gamma, lam):
    """Per valid step t of env e, the explicit sum (no recursion)::

        A_t = sum_{i=t}^{j} (gamma lam)^(i - t) delta_i,   j = first step >= t where the episode
                                                             ends, else the row's last step
        delta_i = r_i + gamma * V'_i - V_i,  V'_i = 0 if terminated at i, else the value of the
                  observation after step i: values[i + 1] (after a truncation that is the reset
                  step's observation, the episode's final one) or bootstrap after the last step.

    Invalid (reset-only) steps: A = 0, return = V.
    """
    num_envs, horizon = rewards.shape
    adv = np.zeros((num_envs, horizon))
    for e in range(num_envs):
        for t in range(horizon):
            if not valid[e, t]:
                continue
            for i in range(t, horizon):
                if terminated[e, i]:
                    next_value = 0.0
                elif i == horizon - 1:
                    next_value = float(bootstrap[e])
                else:
                    next_value = float(values[e, i + 1])
                delta = float(rewards[e, i]) + gamma * next_value - float(values[e, i])
                adv[e, t] += (gamma * lam) ** (i - t) * delta
                if terminated[e, i] or truncated[e, i]:
                    break
    return adv, adv + values


def handmade() -> dict[str, np.ndarray]:
    """E=3, T=6.

    env 0: terminated at t=1, t=2 is the reset step (invalid), runs on to the row's end.
    env 1: truncated at t=2 (t=3 invalid, its obs is the final one), truncated again at t=5,
           the last step (bootstrap_value is then V(final obs)).
    env 2: t=0 invalid (the previous rollout ended on its last step), terminated at t=5.
    """
    rng = np.random.default_rng(7)
    E, T = 3, 6
    terminated = np.zeros((E, T), bool)
    truncated = np.zeros((E, T), bool)
    valid = np.ones((E, T), bool)
    terminated[0, 1] = True
    valid[0, 2] = False
    truncated[1, 2] = True
    valid[1, 3] = False
    truncated[1, 5] = True
    valid[2, 0] = False
    terminated[2, 5] = True
    rewards = rng.uniform(-1, 2, (E, T)).astype(np.float32)
    rewards[~valid] = 0.0
    return {
        "rewards": rewards,
        "values": rng.normal(size=(E, T)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "valid": valid,
        "bootstrap_value": rng.normal(size=E).astype(np.float32),
    }


@st.composite
def rollouts(draw: st.DrawFn, endings: bool = True, gaps: bool = True) -> dict[str, np.ndarray]:
    """Consistent layouts: a step is invalid exactly when the previous one ended an episode
    (or, for t=0, at random: the previous rollout ended on its last step)."""
    num_envs, horizon = draw(st.integers(1, 3)), draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_term = draw(st.sampled_from([0.0, 0.2, 0.5])) if endings else 0.0
    p_trunc = draw(st.sampled_from([0.0, 0.2, 0.5])) if endings and gaps else 0.0
    gaps = gaps and endings
    terminated = np.zeros((num_envs, horizon), bool)
    truncated = np.zeros((num_envs, horizon), bool)
    valid = np.ones((num_envs, horizon), bool)
    for e in range(num_envs):
        for t in range(horizon):
            if t == 0:
                valid[e, t] = not gaps or rng.random() < 0.7
            else:
                valid[e, t] = not gaps or not (terminated[e, t - 1] or truncated[e, t - 1])
            if valid[e, t]:  # a reset step is no episode end
                terminated[e, t] = rng.random() < p_term
                truncated[e, t] = not terminated[e, t] and rng.random() < p_trunc
    rewards = rng.normal(size=(num_envs, horizon)).astype(np.float32)
    rewards[~valid] = 0.0
    return {
        "rewards": rewards,
        "values": rng.normal(size=(num_envs, horizon)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "valid": valid,
        "bootstrap_value": rng.normal(size=num_envs).astype(np.float32),
    }


def reference(b: dict[str, np.ndarray], gamma: float, lam: float):
    return rollout_gae_reference(
        b["rewards"],
        b["values"],
        b["terminated"],
        b["truncated"],
        b["valid"],
        b["bootstrap_value"],
        gamma,
        lam,
    )


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize(("gamma", "lam"), [(0.9, 0.5), (0.99, 0.95), (1.0, 1.0), (0.5, 0.0)])
def test_rollout_gae_handmade_matches_reference(gamma, lam):
    b = handmade()
    adv, ret = rollout_gae(**b, gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference(b, gamma, lam)
    assert adv.dtype == ret.dtype == np.float32
    assert adv.shape == ret.shape == (3, 6)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_rollout_gae_handmade_spot_checks():
    """Entries written out by hand, independent of the reference loop."""
    b = handmade()
    g, lam = 0.9, 0.5
    r, v, boot = b["rewards"], b["values"], b["bootstrap_value"]
    adv, ret = rollout_gae(**b, gamma=g, lam=lam)

    def close(got: float, want: float) -> None:
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)

    # Termination: nothing bootstrapped, the trace stops there.
    close(adv[0, 1], r[0, 1] - v[0, 1])
    d00 = r[0, 0] + g * v[0, 1] - v[0, 0]
    close(adv[0, 0], d00 + g * lam * (r[0, 1] - v[0, 1]))
    # The invalid reset steps: zero advantage, return = V.
    for e, t in [(0, 2), (1, 3), (2, 0)]:
        assert adv[e, t] == 0.0
        assert ret[e, t] == v[e, t]
    # The row's end continues the episode: bootstrap_value.
    close(adv[0, 5], r[0, 5] + g * boot[0] - v[0, 5])
    # Truncation: bootstrap from the next (invalid) step's value, the final observation's.
    close(adv[1, 2], r[1, 2] + g * v[1, 3] - v[1, 2])
    d11 = r[1, 1] + g * v[1, 2] - v[1, 1]
    close(adv[1, 1], d11 + g * lam * adv[1, 2])
    # Truncation on the last step: bootstrap_value is V(final obs).
    close(adv[1, 5], r[1, 5] + g * boot[1] - v[1, 5])
    # Termination on the last step: bootstrap_value is ignored.
    close(adv[2, 5], r[2, 5] - v[2, 5])
    np.testing.assert_allclose(ret, adv + v, rtol=1e-6, atol=1e-6)


def test_rollout_gae_nothing_flows_across_episode_ends():
    b = handmade()
    adv, _ = rollout_gae(**b, gamma=0.9, lam=0.95)
    # The next episode's rewards/values and the reset steps' rewards do not reach back.
    changed = {k: v.copy() for k, v in b.items()}
    changed["rewards"][0, 2:] += 5.0  # env 0: the reset step and the next episode
    changed["values"][0, 3:] -= 3.0
    changed["rewards"][1, 3:] += 5.0  # env 1: after the truncation at t=2
    changed["values"][1, 4:] -= 3.0
    changed["bootstrap_value"][2] = 100.0  # env 2 terminated on its last step
    adv2, _ = rollout_gae(**changed, gamma=0.9, lam=0.95)
    np.testing.assert_array_equal(adv2[0, :2], adv[0, :2])
    np.testing.assert_array_equal(adv2[1, :3], adv[1, :3])
    np.testing.assert_array_equal(adv2[2], adv[2])
    assert adv2[0, 2] == 0.0 and adv2[1, 3] == 0.0
    # ...but the value held by the reset step after a truncation is the bootstrap.
    changed["values"][1, 3] += 1.0
    adv3, _ = rollout_gae(**changed, gamma=0.9, lam=0.95)
    assert adv3[1, 2] == pytest.approx(adv[1, 2] + 0.9, rel=1e-5)
    # whereas after a termination it is not used.
    changed["values"][0, 2] += 1.0
    adv4, _ = rollout_gae(**changed, gamma=0.9, lam=0.95)
    np.testing.assert_array_equal(adv4[0, :2], adv[0, :2])


@SETTINGS
@given(b=rollouts(), gamma=gammas, lam=gammas)
def test_rollout_gae_matches_reference(b, gamma, lam):
    adv, ret = rollout_gae(**b, gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference(b, gamma, lam)
    assert adv.dtype == ret.dtype == np.float32
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-4, atol=1e-4)
    assert np.all(adv[~b["valid"]] == 0.0)
    np.testing.assert_array_equal(ret[~b["valid"]], b["values"][~b["valid"]])


# ----------------------------------------------------------------------------- special cases


@SETTINGS
@given(b=rollouts(), gamma=gammas)
def test_rollout_gae_lambda_one_is_nstep_return_minus_value(b, gamma):
    """lam = 1: returns are the discounted returns up to the episode end, bootstrapped with
    gamma * V(final obs) after a truncation and with bootstrap_value at the row's end."""
    adv, ret = rollout_gae(**b, gamma=gamma, lam=1.0)
    values, boot = b["values"], b["bootstrap_value"]
    next_value = np.concatenate([values[:, 1:], boot[:, None]], axis=1)
    # A truncation's bootstrap folded into its reward, as discounted_returns expects.
    folded = b["rewards"] + gamma * b["truncated"] * next_value
    disc = discounted_returns(folded, b["terminated"] | b["truncated"], boot, gamma)
    valid = b["valid"]
    np.testing.assert_allclose(ret[valid], disc[valid], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv[valid], (disc - values)[valid], rtol=1e-4, atol=1e-4)


@SETTINGS
@given(b=rollouts(endings=False), gamma=gammas, lam=gammas)
def test_rollout_gae_without_episode_ends_is_gae(b, gamma, lam):
    assert b["valid"].all()
    got = rollout_gae(**b, gamma=gamma, lam=lam)
    want = gae(b["rewards"], b["values"], b["terminated"], b["bootstrap_value"], gamma, lam)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@SETTINGS
@given(b=rollouts(gaps=False), gamma=gammas, lam=gammas)
def test_rollout_gae_terminations_only_is_gae(b, gamma, lam):
    """All steps valid and no truncation: the same as gae() with dones = terminated."""
    assert b["valid"].all() and not b["truncated"].any()
    got = rollout_gae(**b, gamma=gamma, lam=lam)
    want = gae(b["rewards"], b["values"], b["terminated"], b["bootstrap_value"], gamma, lam)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_rollout_gae_single_row_equals_batched_row():
    b = handmade()
    adv, ret = rollout_gae(**b, gamma=0.9, lam=0.8)
    row = {k: v[1] for k, v in b.items()}
    adv1, ret1 = rollout_gae(**row, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv1, adv[1], rtol=1e-6)
    np.testing.assert_allclose(ret1, ret[1], rtol=1e-6)


# ----------------------------------------------------------------------------- validation


def _args(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "rewards": np.zeros((2, 3), np.float32),
        "values": np.zeros((2, 3), np.float32),
        "terminated": np.zeros((2, 3), bool),
        "truncated": np.zeros((2, 3), bool),
        "valid": np.ones((2, 3), bool),
        "bootstrap_value": np.zeros(2, np.float32),
        "gamma": 0.9,
        "lam": 0.95,
    }
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"values": np.zeros((2, 4), np.float32)}, "values"),
        ({"values": np.zeros(3, np.float32)}, "values"),
        ({"terminated": np.zeros(3, bool)}, "terminated"),
        ({"valid": np.ones((2, 2), bool)}, "valid"),
        ({"bootstrap_value": np.zeros(3, np.float32)}, "bootstrap_value"),
        ({"bootstrap_value": np.zeros((2, 1), np.float32)}, "bootstrap_value"),
        ({"rewards": np.zeros((2, 3, 1), np.float32)}, "rewards"),
        ({"gamma": 1.5}, "gamma=1.5"),
        ({"lam": -0.1}, "lam=-0.1"),
    ],
)
def test_rollout_gae_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        rollout_gae(**_args(**changes))


@pytest.mark.parametrize("name", ["terminated", "truncated"])
def test_rollout_gae_episode_ends_of_another_shape_raise(name):
    # Not broadcastable together: numpy's own ValueError from `terminated | truncated`, raised
    # before the shape check (so the message does not name the argument).
    with pytest.raises(ValueError):
        rollout_gae(**_args(**{name: np.zeros((2, 4), bool)}))


@pytest.mark.parametrize("shape", [(3,), (1, 3)])
def test_rollout_gae_rejects_broadcastable_truncated(shape):
    with pytest.raises(ValueError, match="truncated"):
        rollout_gae(**_args(truncated=np.zeros(shape, bool)))


def negamax_reference(rewards, values, terminated, truncated, valid, bootstrap, passes, gamma, lam):
    """``rollout_gae_reference`` for a slot that plays both seats of a two-player zero-sum game:
    every value and reward after a pass is the other player's, so from step t's mover each term
    i enters with the sign of the passes between t and i, and the bootstrap after a pass is
    negated: delta_i = r_i + gamma * (-1 if passes_i else 1) * V'_i - V_i."""
    num_envs, horizon = rewards.shape
    adv = np.zeros((num_envs, horizon))
    for e in range(num_envs):
        for t in range(horizon):
            if not valid[e, t]:
                continue
            sign = 1.0  # the mover of step i seen from the mover of step t
            for i in range(t, horizon):
                if terminated[e, i]:
                    next_value = 0.0
                elif i == horizon - 1:
                    next_value = float(bootstrap[e])
                else:
                    next_value = float(values[e, i + 1])
                flip = -1.0 if passes[e, i] else 1.0
                delta = float(rewards[e, i]) + gamma * flip * next_value - float(values[e, i])
                adv[e, t] += sign * (gamma * lam) ** (i - t) * delta
                if terminated[e, i] or truncated[e, i]:
                    break
                sign *= flip
    return adv, adv + values


def test_a_game_played_from_both_seats_is_scored_by_negamax():
    """x, o, x: x wins on its second move. With lam 1 the return of each move is the
    discounted outcome from its mover's side: +1, -gamma, +gamma^2, whatever the values."""
    gamma = 0.9
    rewards = np.array([[0.0, 0.0, 1.0]])
    terminated = np.array([[False, False, True]])
    values = np.array([[0.3, -0.2, 0.5]])
    passes = np.ones((1, 3), bool)
    _, returns = rollout_gae(
        rewards,
        values,
        terminated,
        np.zeros_like(terminated),
        np.ones_like(terminated),
        np.zeros(1),
        gamma,
        1.0,
        passes=passes,
    )
    np.testing.assert_allclose(returns[0], [gamma**2, -gamma, 1.0], rtol=1e-6)
    # Without passes the same rewards would credit o's move with x's win.
    _, same_side = rollout_gae(
        rewards,
        values,
        terminated,
        np.zeros_like(terminated),
        np.ones_like(terminated),
        np.zeros(1),
        gamma,
        1.0,
    )
    assert same_side[0, 1] > 0


@SETTINGS
@given(st.integers(0, 2**32 - 1), gammas, st.sampled_from([0.0, 0.5, 0.95, 1.0]))
def test_rollout_gae_with_passes_matches_the_negamax_reference(seed, gamma, lam):
    rng = np.random.default_rng(seed)
    E, T = 3, 7
    rewards = rng.normal(size=(E, T))
    values = rng.normal(size=(E, T))
    terminated = rng.random((E, T)) < 0.15
    truncated = ~terminated & (rng.random((E, T)) < 0.1)
    done = terminated | truncated
    valid = np.ones((E, T), bool)
    valid[:, 1:] = ~done[:, :-1]
    bootstrap = rng.normal(size=E)
    passes = rng.random((E, T)) < 0.7
    adv, ret = rollout_gae(
        rewards, values, terminated, truncated, valid, bootstrap, gamma, lam, passes=passes
    )
    ref_adv, ref_ret = negamax_reference(
        rewards, values, terminated, truncated, valid, bootstrap, passes, gamma, lam
    )
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, np.where(valid, ref_ret, values), rtol=1e-5, atol=1e-5)
