"""Continuous-control networks: bounds, squashed-Gaussian log-density, builders, serialization."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from zrl.nets.continuous import (
    DDPGModel,
    DeterministicPolicy,
    QCritic,
    SACModel,
    SquashedGaussianPolicy,
    build_continuous_model,
    clip_to_bounds,
    squashed_gaussian_logp,
    tanh_log_det_jacobian,
)
from zrl.nets.wire import load_arrays, model_to_arrays

torch.set_num_threads(1)
LOW = np.array([-2.0, 0.0, -0.3], dtype=np.float32)
HIGH = np.array([1.0, 3.0, 0.7], dtype=np.float32)


def test_shapes_and_buffers():
    ddpg = DDPGModel(4, 3, LOW, HIGH, hidden=(16, 16), twin=True)
    sac = SACModel(4, 3, LOW, HIGH, hidden=(16,))
    obs, actions = torch.randn(5, 4), torch.randn(5, 3)
    assert ddpg.act(obs).shape == (5, 3)
    q1, q2 = ddpg.q_values(obs, actions)
    assert q1.shape == (5,) and q2 is not None and q2.shape == (5,)
    assert DDPGModel(4, 3, LOW, HIGH, hidden=(8,)).q_values(obs, actions)[1] is None
    a, logp = sac.sample(obs)
    assert a.shape == (5, 3) and logp.shape == (5,)
    assert sac.act(obs).shape == (5, 3) and sac.act(obs, deterministic=True).shape == (5, 3)
    assert [t.shape for t in sac.q_values(obs, actions)] == [(5,), (5,)]
    assert (ddpg.obs_dim, ddpg.act_dim, sac.obs_dim, sac.act_dim) == (4, 3, 4, 3)
    for policy in (ddpg.policy, sac.policy):
        assert policy.action_scale.dtype == torch.float32
        np.testing.assert_allclose(policy.action_scale.numpy(), (HIGH - LOW) / 2, rtol=1e-6)
        np.testing.assert_allclose(policy.action_bias.numpy(), (HIGH + LOW) / 2, rtol=1e-6)
        assert "action_scale" in policy.state_dict() and "action_bias" in policy.state_dict()
    assert QCritic(4, 3, hidden=()).forward(obs, actions).shape == (5,)


def test_deterministic_policy_starts_near_the_centre():
    torch.manual_seed(0)
    policy = DeterministicPolicy(4, 3, (32, 32), action_low=LOW, action_high=HIGH)
    with torch.no_grad():
        actions = policy(torch.randn(64, 4))
    centre = torch.as_tensor((HIGH + LOW) / 2)
    assert torch.all((actions - centre).abs() < 0.05 * torch.as_tensor(HIGH - LOW))


@pytest.mark.parametrize("scale", [1e6, -1e6])
def test_actions_inside_bounds_for_extreme_observations(scale):
    torch.manual_seed(1)
    ddpg = DDPGModel(4, 3, LOW, HIGH, hidden=(32, 32))
    sac = SACModel(4, 3, LOW, HIGH, hidden=(32, 32))
    obs = torch.randn(256, 4) * scale
    low, high = torch.as_tensor(LOW), torch.as_tensor(HIGH)
    with torch.no_grad():
        batches = [ddpg.act(obs), sac.act(obs), sac.act(obs, deterministic=True)]
        a, logp = sac.sample(obs)
    for actions in [*batches, a]:
        assert torch.isfinite(actions).all()
        assert torch.all(actions >= low) and torch.all(actions <= high)
    assert torch.isfinite(logp).all()
    # Almost all saturated, and a saturated action sits exactly on the bound (no overshoot).
    on_bound = (batches[0] == low) | (batches[0] == high)
    assert on_bound.float().mean() > 0.9


def test_tanh_log_det_jacobian_is_stable():
    u = torch.tensor([-30.0, -5.0, -0.3, 0.0, 0.7, 5.0, 30.0], dtype=torch.float64)
    expected = torch.log(1 - torch.tanh(u) ** 2)
    got = tanh_log_det_jacobian(u)
    torch.testing.assert_close(got[1:-1], expected[1:-1])
    # Far in the tails: log(1 - tanh^2) = log(4) - 2|u| + O(e^{-2|u|}), finite in float32 too.
    assert got[0].item() == pytest.approx(math.log(4) - 60, abs=1e-9)
    assert torch.isfinite(tanh_log_det_jacobian(u.float() * 100)).all()


def reference_dist(mu, log_std, policy):
    return TransformedDistribution(
        Normal(mu, log_std.exp()),
        [
            TanhTransform(cache_size=1),
            AffineTransform(policy.action_bias, policy.action_scale, cache_size=1),
        ],
    )


def test_squashed_gaussian_logp_matches_transformed_distribution():
    torch.manual_seed(2)
    policy = SquashedGaussianPolicy(4, 3, (16,), action_low=LOW, action_high=HIGH)
    obs = torch.randn(32, 4)
    torch.manual_seed(3)
    actions, logp = policy(obs)
    assert logp is not None
    with torch.no_grad():
        mu, log_std = policy.dist_params(obs)
    torch.manual_seed(3)
    u = mu + log_std.exp() * torch.randn_like(mu)  # the same draw as inside the policy
    dist = reference_dist(mu, log_std, policy)
    y = u
    for transform in dist.transforms:
        y = transform(y)  # fills the caches, so log_prob inverts exactly to u
    torch.testing.assert_close(actions.detach(), y)
    torch.testing.assert_close(logp.detach(), dist.log_prob(y).sum(-1), rtol=1e-5, atol=1e-4)


def test_squashed_gaussian_logp_reference_loop_in_saturation():
    rng = np.random.default_rng(0)
    mu = rng.normal(scale=3, size=(6, 2))
    log_std = rng.uniform(-2, 1, size=(6, 2))
    u = mu + np.exp(log_std) * rng.normal(size=(6, 2))
    u[0, 0], u[1, 1] = 25.0, -40.0  # tanh saturates; the naive formula would give -inf
    scale = np.array([0.5, 3.0])
    got = squashed_gaussian_logp(
        torch.tensor(u), torch.tensor(mu), torch.tensor(log_std), torch.tensor(scale)
    )
    for b in range(6):
        expected = 0.0
        for j in range(2):
            std = math.exp(log_std[b, j])
            gauss = -0.5 * ((u[b, j] - mu[b, j]) / std) ** 2 - math.log(
                std * math.sqrt(2 * math.pi)
            )
            # log(1 - tanh(u)^2) = log(4) - 2|u| - 2 log(1 + exp(-2|u|))
            jac = math.log(4) - 2 * abs(u[b, j]) - 2 * math.log1p(math.exp(-2 * abs(u[b, j])))
            expected += gauss - jac - math.log(scale[j])
        assert got[b].item() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_deterministic_sac_action_is_scaled_tanh_mu():
    torch.manual_seed(4)
    policy = SquashedGaussianPolicy(4, 3, (16,), action_low=LOW, action_high=HIGH)
    obs = torch.randn(8, 4)
    with torch.no_grad():
        mu, _ = policy.dist_params(obs)
        a1, logp = policy(obs, deterministic=True, with_logp=False)
        a2, _ = policy(obs, deterministic=True)
    assert logp is None
    torch.testing.assert_close(a1, policy.action_bias + policy.action_scale * torch.tanh(mu))
    torch.testing.assert_close(a1, a2)


def test_log_std_stays_in_range():
    torch.manual_seed(5)
    policy = SquashedGaussianPolicy(4, 2, (16,), log_std_min=-5.0, log_std_max=2.0)
    with torch.no_grad():
        _, log_std = policy.dist_params(torch.randn(100, 4) * 1e4)
    assert torch.all(log_std >= -5.0) and torch.all(log_std <= 2.0)
    with pytest.raises(ValueError, match="log_std_min < log_std_max"):
        SquashedGaussianPolicy(4, 2, (16,), log_std_min=1.0, log_std_max=1.0)


def test_reparameterised_sample_has_gradient():
    torch.manual_seed(6)
    model = SACModel(4, 2, np.full(2, -1.0), np.full(2, 1.0), hidden=(8,))
    actions, logp = model.sample(torch.randn(3, 4))
    (actions.sum() + logp.sum()).backward()
    assert all(p.grad is not None for p in model.policy.parameters())


def test_clip_to_bounds():
    low, high = LOW, HIGH
    actions = np.array([[-5.0, 1.0, 0.7], [2.0, -1.0, 0.1]])
    got = clip_to_bounds(actions, low, high)
    assert got.dtype == np.float32
    for i in range(2):
        for j in range(3):
            assert got[i, j] == pytest.approx(min(max(actions[i, j], low[j]), high[j]))
    tiny_above = np.nextafter(np.float64(HIGH[2]), np.inf)
    assert clip_to_bounds(np.array([0.0, 0.0, tiny_above]), low, high)[2] <= HIGH[2]
    with pytest.raises(ValueError, match="non-finite action"):
        clip_to_bounds(np.array([0.0, np.nan, 0.0]), low, high)
    with pytest.raises(ValueError, match="non-finite action"):
        clip_to_bounds(np.array([0.0, np.inf, 0.0]), low, high)
    with pytest.raises(ValueError, match="shape"):
        clip_to_bounds(np.zeros(2), low, high)


def test_build_continuous_model():
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32)
    act_space = gym.spaces.Box(LOW, HIGH, dtype=np.float32)
    ddpg = build_continuous_model(obs_space, act_space, DDPGModel, (8,), twin=True)
    sac = build_continuous_model(obs_space, act_space, SACModel, (8,), twin=False)
    assert isinstance(ddpg, DDPGModel) and ddpg.q2 is not None and ddpg.obs_dim == 6
    assert isinstance(sac, SACModel) and sac.act_dim == 3
    batch = torch.as_tensor(np.stack([obs_space.sample() for _ in range(3)]))
    torch.testing.assert_close(ddpg.act(batch), ddpg.act(batch.reshape(3, 6)))
    np.testing.assert_array_equal(ddpg.policy.action_low.numpy(), LOW)
    assert not build_continuous_model(obs_space, act_space, DDPGModel, (8,), False).twin


def test_build_continuous_model_rejects_unsupported_spaces():
    box = gym.spaces.Box(-1.0, 1.0, shape=(3,))
    with pytest.raises(ValueError, match="action space Discrete\\(2\\).*Box"):
        build_continuous_model(box, gym.spaces.Discrete(2), SACModel, (8,), False)
    with pytest.raises(ValueError, match="observation space Discrete\\(3\\)"):
        build_continuous_model(gym.spaces.Discrete(3), box, SACModel, (8,), False)
    with pytest.raises(ValueError, match="1-D Box"):
        build_continuous_model(box, gym.spaces.Box(-1.0, 1.0, shape=(2, 2)), SACModel, (8,), False)
    with pytest.raises(ValueError, match="finite bounds"):
        build_continuous_model(
            box, gym.spaces.Box(-np.inf, np.inf, shape=(2,)), SACModel, (8,), False
        )
    with pytest.raises(ValueError, match="high > low"):
        DDPGModel(3, 2, np.zeros(2), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="act_dim=0"):
        QCritic(3, 0)
    with pytest.raises(ValueError, match="shape \\(2,\\) for act_dim=2"):
        SACModel(3, 2, np.zeros(3), np.ones(3))


@pytest.mark.parametrize("kind", ["ddpg", "sac"])
def test_model_to_arrays_round_trip(kind):
    def make(seed):
        torch.manual_seed(seed)
        if kind == "ddpg":
            return DDPGModel(4, 3, LOW, HIGH, hidden=(8,), twin=True)
        return SACModel(4, 3, LOW, HIGH, hidden=(8,))

    src, dst = make(0), make(1)
    # The destination starts with other bounds: they must arrive with the weights.
    dst.policy.action_scale.fill_(5.0)
    arrays = model_to_arrays(src)
    assert {"policy.action_scale", "policy.action_bias"} <= set(arrays)
    obs = torch.randn(5, 4)
    actions = torch.randn(5, 3)
    load_arrays(dst, arrays)
    with torch.no_grad():
        torch.testing.assert_close(
            src.act(obs, deterministic=True), dst.act(obs, deterministic=True)
        )
        for a, b in zip(src.q_values(obs, actions), dst.q_values(obs, actions), strict=True):
            torch.testing.assert_close(a, b)
