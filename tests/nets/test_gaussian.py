"""The diagonal Gaussian actor-critic (``zrl.nets.gaussian``): its log-densities, entropies and
KL against ``torch.distributions.Normal``, its actions, its builder, and the observation
normalizer's statistics through the shipped weights and a learner checkpoint."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from zrl.algos.models import experiment_model
from zrl.algos.ppo.update import PPOUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.config.sections import ModelConfig
from zrl.nets.discrete import ActorCritic, greedy_actions
from zrl.nets.encoders import InputNormalizer, NatureCNN, add_input_normalizers, observe_inputs
from zrl.nets.gaussian import (
    CATEGORICAL,
    DIAG_GAUSSIAN,
    GaussianActorCritic,
    check_distribution,
    distribution_of,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
    policy_model_for,
    split_params,
)
from zrl.nets.wire import load_arrays, model_to_arrays
from zrl.testing.fakes import learner_setup

torch.set_num_threads(1)
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)  # Pendulum's
ACT = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
F64 = torch.float64


def params_of(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    mean = rng.normal(size=shape) * 2.0
    log_std = rng.normal(size=shape) * 0.7
    return torch.from_numpy(np.concatenate([mean, log_std], axis=-1))


def normal(params: torch.Tensor) -> Independent:
    mean, log_std = params.chunk(2, dim=-1)
    return Independent(Normal(mean, log_std.exp()), 1)


@pytest.mark.parametrize("seed", range(5))
def test_log_prob_entropy_and_kl_match_torch_distributions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p, q = params_of(rng, 4, 5, 3), params_of(rng, 4, 5, 3)
    actions = torch.from_numpy(rng.normal(size=(4, 5, 3)) * 3.0)
    torch.testing.assert_close(gaussian_log_prob(p, actions), normal(p).log_prob(actions))
    torch.testing.assert_close(gaussian_entropy(p), normal(p).entropy())
    torch.testing.assert_close(gaussian_kl(p, q), kl_divergence(normal(p), normal(q)))
    torch.testing.assert_close(gaussian_kl(p, p), torch.zeros(4, 5, dtype=F64))
    assert DIAG_GAUSSIAN.log_prob(p, actions).shape == (4, 5)
    torch.testing.assert_close(DIAG_GAUSSIAN.entropy(p), normal(p).entropy())


def test_gradients_of_the_log_prob_match_torch_distributions() -> None:
    rng = np.random.default_rng(7)
    p = params_of(rng, 6, 2).requires_grad_(True)
    a = torch.from_numpy(rng.normal(size=(6, 2)))
    (got,) = torch.autograd.grad(gaussian_log_prob(p, a).sum(), p)
    (want,) = torch.autograd.grad(normal(p).log_prob(a).sum(), p)
    torch.testing.assert_close(got, want)


def test_params_need_an_even_width() -> None:
    with pytest.raises(ValueError, match="even last dim"):
        split_params(torch.zeros(2, 3))


def test_the_model_gives_mean_and_a_state_independent_log_std() -> None:
    torch.manual_seed(0)
    model = policy_model_for(OBS, ACT, ModelConfig(hidden=[16, 16]))
    assert isinstance(model, GaussianActorCritic)
    assert distribution_of(model) is DIAG_GAUSSIAN
    obs = torch.randn(5, 3)
    params, value = model(obs)
    assert params.shape == (5, 4) and value.shape == (5,)
    mean, log_std = split_params(params)
    torch.testing.assert_close(log_std, torch.zeros(5, 2))  # CleanRL's initial log-std 0
    torch.testing.assert_close(model.policy_logits(obs), params)
    torch.testing.assert_close(model.value(obs), value)
    with torch.no_grad():
        model.log_std.fill_(-30.0)  # a near-deterministic policy: samples are the mean
        model.policy_head.bias.fill_(10.0)  # a mean far above the Box
    acted = model.act(obs)
    assert torch.all(acted == 2.0), acted  # clipped to the bounds
    assert torch.all(greedy_actions(model, obs) == 2.0)
    assert model.action_low.tolist() == [-2.0, -2.0]


def test_discrete_spaces_keep_the_categorical_actor_critic() -> None:
    model = policy_model_for(OBS, gym.spaces.Discrete(3), ModelConfig())
    assert isinstance(model, ActorCritic)
    assert distribution_of(model) is CATEGORICAL


@pytest.mark.parametrize(
    ("space", "model_cfg", "match"),
    [
        (gym.spaces.Box(-np.inf, np.inf, (1,)), {}, "finite bounds"),
        (gym.spaces.Box(-1, 1, (2, 2)), {}, "1-D Box"),
        (ACT, {"core": "lstm"}, "model.core: lstm"),
        (ACT, {"encoder": "nature_cnn"}, r"model.encoder: nature_cnn: .* through MLPs"),
    ],
)
def test_the_builder_refuses_what_it_cannot_build(space, model_cfg, match) -> None:
    with pytest.raises(ValueError, match=match):
        policy_model_for(OBS, space, ModelConfig(**model_cfg))


PIXELS = gym.spaces.Box(0, 255, (9, 64, 64), np.uint8)  # dm_control's 3 stacked RGB frames


def test_on_images_a_cnn_reads_them_for_both_torsos_and_normalizes_them() -> None:
    model = policy_model_for(PIXELS, ACT, ModelConfig(hidden=[16]))
    assert isinstance(model, GaussianActorCritic) and isinstance(model.encoder, NatureCNN)
    obs = torch.randint(0, 256, (4, 9, 64, 64), dtype=torch.uint8)
    params, value = model(obs)
    assert params.shape == (4, 2 * ACT.shape[0]) and value.shape == (4,)
    (params.sum() + value.sum()).backward()  # the encoder learns from both losses
    assert all(p.grad is not None for p in model.encoder.parameters())
    actions = model.act(obs)
    assert actions.shape == (4, ACT.shape[0])
    assert torch.all(actions >= model.action_low) and torch.all(actions <= model.action_high)
    assert add_input_normalizers(model)  # the image encoder's, not a flat one
    assert model.normalizer is None and model.encoder.normalizer is not None
    observe_inputs(model, obs)
    assert int(model.encoder.normalizer.count) == 4
    resnet = policy_model_for(PIXELS, ACT, ModelConfig(encoder="impala_resnet", hidden=[16]))
    assert isinstance(resnet, GaussianActorCritic) and resnet.encoder is not None
    with pytest.raises(ValueError, match=r"reads \(9, 64, 64\) observations through a CNN"):
        policy_model_for(PIXELS, ACT, ModelConfig(encoder="mlp"))


def pendulum_config(**model: object) -> ExperimentConfig:
    return ExperimentConfig(
        algo="ppo",
        env={"id": "Pendulum-v1", "num_envs": 2},
        roles={"actors": 1, "learners": 1, "replay": 0, "params": 1, "evaluator": 0},
        model={"hidden": [8], **model},
        ppo={"normalize_returns": True},
    )


def test_observation_normalization_round_trips_through_the_weights_and_a_checkpoint() -> None:
    cfg = pendulum_config(normalize_input=True)
    torch.manual_seed(0)
    learner = experiment_model(cfg, OBS, ACT)
    assert isinstance(learner, GaussianActorCritic)
    assert isinstance(learner.normalizer, InputNormalizer)
    rng = np.random.default_rng(0)
    obs = torch.from_numpy(rng.normal(5.0, 3.0, size=(400, 3)).astype(np.float32))
    observe_inputs(learner, obs.reshape(20, 20, 3))  # an unroll batch's [B, T, O]
    norm = learner.normalizer
    torch.testing.assert_close(norm.mean, obs.mean(0))
    torch.testing.assert_close(norm.var, obs.var(0, unbiased=False), rtol=1e-4, atol=1e-4)
    assert float(norm.count) == 400
    # Normalized inputs: what the torsos read has mean ~0 and std ~1.
    x = learner.features(obs)
    torch.testing.assert_close(x.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(x.std(0), torch.ones(3), atol=1e-2, rtol=0)

    # The shipped weights carry the statistics: an actor's model acts as the learner's.
    actor = experiment_model(cfg, OBS, ACT)
    arrays = model_to_arrays(learner)
    assert {"normalizer.mean", "normalizer.var", "normalizer.count"} <= set(arrays)
    load_arrays(actor, arrays)
    with torch.no_grad():
        torch.testing.assert_close(actor(obs)[0], learner(obs)[0])

    # A learner's checkpoint state restores them, and the return statistics beside them.
    update = PPOUpdate(learner_setup(cfg, learner, OBS, ACT))
    assert update.value_normalizer is not None
    update.value_normalizer.update(torch.tensor([1.0, 2.0, 6.0]))
    state = update.state_dict()
    restored = PPOUpdate(learner_setup(cfg, experiment_model(cfg, OBS, ACT), OBS, ACT))
    restored.load_state_dict(state)
    fresh = restored.model
    assert isinstance(fresh, GaussianActorCritic) and fresh.normalizer is not None
    torch.testing.assert_close(fresh.normalizer.mean, norm.mean)
    torch.testing.assert_close(fresh.normalizer.var, norm.var)
    assert restored.value_normalizer is not None
    assert restored.value_normalizer.mean == pytest.approx(3.0)
    assert restored.value_normalizer.count == 3
    with torch.no_grad():
        torch.testing.assert_close(fresh(obs)[1], learner(obs)[1])


def test_without_normalize_input_there_is_no_normalizer() -> None:
    model = experiment_model(pendulum_config(), OBS, ACT)
    assert isinstance(model, GaussianActorCritic) and model.normalizer is None
    assert not any("normalizer" in k for k in model.state_dict())


def test_a_model_must_score_actions_of_the_envs_action_space() -> None:
    gaussian = policy_model_for(OBS, ACT, ModelConfig())
    categorical = policy_model_for(OBS, gym.spaces.Discrete(3), ModelConfig())
    check_distribution(gaussian, ACT)
    check_distribution(categorical, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="categorical policy .* a Box needs distribution"):
        check_distribution(categorical, ACT)
    with pytest.raises(ValueError, match="diag_gaussian policy"):
        check_distribution(gaussian, gym.spaces.Discrete(3))
