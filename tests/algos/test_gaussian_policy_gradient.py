"""PPO, IMPALA and APPO with the diagonal Gaussian policy (Box actions): the losses on
continuous log-densities against per-step reference loops written from the papers (V-trace,
Espeholt et al. 2018; the clipped surrogate, Schulman et al. 2017), the actor's Gaussian
policy, and its unrolls through the replay layout into the learners."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Normal

from tests.helpers.updates import batch, config, layout, setup, trained
from zrl.algos.appo.losses import appo_loss
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.impala.losses import impala_loss
from zrl.algos.impala.update import ImpalaUpdate
from zrl.algos.kernel.sampling import GaussianPolicy, make_categorical_policy, sample_gaussian
from zrl.algos.kernel.vtrace import unroll_forward, vtrace
from zrl.algos.models import experiment_model
from zrl.algos.ppo.policy import GaussianPPOPolicy, make_policy
from zrl.algos.ppo.update import PPOUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.nets.gaussian import DIAG_GAUSSIAN, GaussianActorCritic
from zrl.replay.layout import experience_layout
from zrl.testing.fakes import actor_setup, as_message, learner_setup, unroll_trajectory
from zrl.transport import messages as M
from zrl.transport import protocol as P

torch.set_num_threads(1)
SETTINGS = settings(max_examples=30, deadline=None)
F64 = torch.float64
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)  # Pendulum's
ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def density(params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``log pi(a|x)`` of one step from the definition of the normal density, one dim at a
    time: ``sum_j log(1 / (s_j sqrt(2 pi)) exp(-(a_j - m_j)^2 / (2 s_j^2)))``."""
    A = action.shape[0]
    total = torch.zeros((), dtype=params.dtype)
    for j in range(A):
        m, s = params[j], torch.exp(params[A + j])
        total = total - torch.log(s) - HALF_LOG_2PI - (action[j] - m) ** 2 / (2 * s**2)
    return total


def entropy_of(params: torch.Tensor) -> torch.Tensor:
    A = params.shape[0] // 2
    return sum(0.5 + HALF_LOG_2PI + params[A + j] for j in range(A))  # type: ignore[return-value]


@st.composite
def minibatches(draw: st.DrawFn) -> dict[str, Any]:
    """A time-major ``[T, B]`` float64 minibatch of a Gaussian policy: the learner's params
    (mean, log-std) and values with gradients, the actors' unclipped actions and behaviour
    log-densities, episode ends and valid flags as an autoresetting actor records them."""
    B, T, A = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    term, trunc, valid = layout(rng, B, T, draw(st.sampled_from([0.0, 0.3])), 0.2)
    mean = rng.normal(size=(T, B, A))
    log_std = np.broadcast_to(rng.normal(size=A) * 0.5, (T, B, A))  # state-independent
    params = torch.from_numpy(np.concatenate([mean, log_std], -1))
    actions = torch.from_numpy(mean + rng.normal(size=(T, B, A)) * np.exp(log_std) * 1.3)
    pi = Normal(params[..., :A], params[..., A:].exp()).log_prob(actions).sum(-1)
    rewards = torch.from_numpy(rng.normal(size=(T, B)))
    rewards[torch.from_numpy(~valid.T)] = 0.0
    return {
        "logits": params.requires_grad_(True),
        "values": torch.from_numpy(rng.normal(size=(T, B))).requires_grad_(True),
        "actions": actions,
        "behaviour_logp": pi + torch.from_numpy(rng.normal(size=(T, B)) * 0.3),
        "rewards": rewards,
        "terminated": torch.from_numpy(term.T.copy()),
        "valid": torch.from_numpy(valid.T.copy()),
        "bootstrap": torch.from_numpy(rng.normal(size=B)),
        "gamma": draw(st.sampled_from([0.0, 0.9, 1.0])),
    }


def vtrace_of(mb: dict[str, Any], rho_bar: float, c_bar: float) -> Any:
    valid = mb["valid"].to(F64)
    return vtrace(
        mb["behaviour_logp"],
        DIAG_GAUSSIAN.log_prob(mb["logits"].detach(), mb["actions"]),
        mb["rewards"],
        mb["gamma"] * (1.0 - mb["terminated"].to(F64)) * valid,
        mb["values"].detach(),
        mb["bootstrap"],
        rho_bar=rho_bar,
        c_bar=c_bar,
        valid=valid,
    )


def reference(mb: dict[str, Any], rho_bar: float, c_bar: float, clip: float | None) -> Any:
    """The loss written from the papers, one step at a time: V-trace's backward recursion
    per trajectory (Espeholt et al. 2018, Sec. 4.1: ``v_s = V(x_s) + delta_s + gamma c_s
    (v_{s+1} - V(x_{s+1}))``), the pg advantage ``rho_s (r_s + gamma v_{s+1} - V(x_s))``,
    then IMPALA's ``-log pi * A`` (``clip`` None) or APPO's clipped surrogate (unnormalized
    advantages), the value and entropy terms, each averaged over the valid steps."""
    logits, values = mb["logits"], mb["values"]
    T, B, _ = logits.shape
    valid, term, gamma = mb["valid"], mb["terminated"], mb["gamma"]
    steps = [(t, b) for b in range(B) for t in range(T) if valid[t, b]]
    adv: dict[tuple[int, int], float] = {}
    vs: dict[tuple[int, int], float] = {}
    logp: dict[tuple[int, int], torch.Tensor] = {}
    for b in range(B):
        next_v = float(mb["bootstrap"][b])
        next_vs = next_v
        for t in reversed(range(T)):
            v = float(values[t, b].detach())
            if not valid[t, b]:
                vs[t, b], next_v, next_vs = v, v, v
                continue
            logp[t, b] = density(logits[t, b], mb["actions"][t, b])
            r = math.exp(float(logp[t, b].detach()) - float(mb["behaviour_logp"][t, b]))
            g = 0.0 if term[t, b] else gamma
            rew = float(mb["rewards"][t, b])
            delta = min(rho_bar, r) * (rew + g * next_v - v)
            adv[t, b] = min(rho_bar, r) * (rew + g * next_vs - v)
            vs[t, b] = v + delta + g * min(c_bar, r) * (next_vs - next_v)
            next_v, next_vs = v, vs[t, b]
    n = max(1, len(steps))
    policy = value = entropy = torch.zeros((), dtype=F64)
    for t, b in steps:
        if clip is None:
            policy = policy - logp[t, b] * adv[t, b] / n
        else:
            ratio = torch.exp(logp[t, b] - mb["behaviour_logp"][t, b])
            a = adv[t, b]
            policy = policy - torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a) / n
        value = value + 0.5 * (values[t, b] - vs[t, b]) ** 2 / n
        entropy = entropy + entropy_of(logits[t, b]) / n
    return policy + 0.7 * value - 0.03 * entropy, {
        "policy_loss": policy,
        "value_loss": value,
        "entropy": entropy,
    }


def check_against(loss: torch.Tensor, parts: dict[str, Any], mb: dict[str, Any], ref: Any) -> None:
    ref_loss, ref_parts = ref
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-9, abs=1e-9)
    for name, value in ref_parts.items():
        assert float(parts[name]) == pytest.approx(float(value), rel=1e-9, abs=1e-9), name
    if not mb["valid"].any():
        return
    got = torch.autograd.grad(loss, [mb["logits"], mb["values"]])
    want = torch.autograd.grad(ref_loss, [mb["logits"], mb["values"]], allow_unused=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w)


@SETTINGS
@given(mb=minibatches(), rho_bar=st.sampled_from([0.5, 1.0, math.inf]), c_bar=st.just(1.0))
def test_impala_loss_on_gaussian_log_densities_matches_the_reference(mb, rho_bar, c_bar):
    loss, parts = impala_loss(
        mb["logits"],
        mb["values"],
        mb["actions"],
        vtrace_of(mb, rho_bar, c_bar),
        entropy_coef=0.03,
        value_coef=0.7,
        valid=mb["valid"],
        distribution=DIAG_GAUSSIAN,
    )
    check_against(loss, parts, mb, reference(mb, rho_bar, c_bar, clip=None))


@SETTINGS
@given(
    mb=minibatches(),
    rho_bar=st.sampled_from([0.5, 1.0, math.inf]),
    c_bar=st.sampled_from([0.5, 1.0]),
    clip=st.sampled_from([0.1, 0.3]),
)
def test_appo_loss_on_gaussian_log_densities_matches_the_reference(mb, rho_bar, c_bar, clip):
    loss, parts = appo_loss(
        mb["logits"],
        mb["values"],
        mb["actions"],
        mb["behaviour_logp"],
        vtrace_of(mb, rho_bar, c_bar),
        clip=clip,
        entropy_coef=0.03,
        value_coef=0.7,
        normalize_advantages=False,
        valid=mb["valid"],
        distribution=DIAG_GAUSSIAN,
    )
    check_against(loss, parts, mb, reference(mb, rho_bar, c_bar, clip=clip))


# ----------------------------------------------------------------------------- the actor side


def ppo_config(**ppo: Any) -> ExperimentConfig:
    return ExperimentConfig(
        algo="ppo",
        seed=1,
        env={"id": "Pendulum-v1", "num_envs": 4},
        roles={"actors": 1, "learners": 1, "replay": 0, "params": 1, "evaluator": 0},
        model={"hidden": [16], "normalize_input": True},
        actor={"trajectory_length": 8},
        ppo={"epochs": 2, "minibatch_size": 8, "normalize_returns": True, **ppo},
    )


def collect(policy: GaussianPolicy, rng: np.random.Generator, E: int, T: int) -> Any:
    """A trajectory as the actor records it for ``policy`` on random observations: the
    clipped actions it steps the envs with, the extras it asked to record."""
    obs = rng.normal(size=(E, T, 3)).astype(np.float32)
    policy.begin(T, 0)
    acted, extras = [], []
    for t in range(T):
        a, x = policy.act(obs[:, t], t)
        acted.append(a)
        extras.append(x)
    arrays = {
        "obs": obs,
        "action": np.stack(acted, 1),
        "reward": rng.normal(size=(E, T)).astype(np.float32),
        "terminated": np.zeros((E, T), bool),
        "truncated": np.zeros((E, T), bool),
        "valid": np.ones((E, T), bool),
        "bootstrap_obs": rng.normal(size=(E, 3)).astype(np.float32),
    }
    trajectory = unroll_trajectory(arrays)
    trajectory.extras = {k: np.stack([x[k] for x in extras], 1) for k in extras[0]}
    return trajectory


def test_the_gaussian_policy_records_the_unclipped_sample_and_its_density() -> None:
    cfg = ppo_config()
    torch.manual_seed(0)
    model = experiment_model(cfg, OBS, ACT)
    with torch.no_grad():
        model.log_std.fill_(1.0)  # std e: many samples fall outside [-2, 2]
    policy = make_policy(actor_setup(cfg, model, OBS, ACT, 4))
    assert type(policy) is GaussianPPOPolicy
    assert policy.action_shape == (1,) and policy.action_dtype is np.float32
    tr = collect(policy, np.random.default_rng(0), 4, 8)
    sample, logp = tr.extras["sample"], tr.extras["logp"]
    assert np.all(np.abs(tr.action) <= 2.0) and np.any(np.abs(sample) > 2.0)
    np.testing.assert_array_equal(tr.action, np.clip(sample, -2.0, 2.0))
    with torch.no_grad():
        params = model.policy_logits(torch.from_numpy(tr.obs.reshape(-1, 3)))
    want = Normal(params[:, :1], params[:, 1:].exp()).log_prob(
        torch.from_numpy(sample.reshape(-1, 1))
    )
    np.testing.assert_allclose(logp.reshape(-1), want.numpy().reshape(-1), rtol=1e-5, atol=1e-5)
    out = policy.finish(tr)
    assert out.kind == P.TRAJECTORY
    np.testing.assert_array_equal(out.arrays["action"], sample)  # what logp is the density of
    # The replay layout and the PPO learner take it as it is; the layout fixes A from the env.
    replay = experience_layout(
        "unroll",
        actions="any",
        observation_space=OBS,
        action_space=ACT,
        num_envs=4,
        trajectory_length=8,
    )
    assert replay.schema is M.CONTINUOUS_UNROLL and replay.sizes["A"] == 1
    replay.check(as_message(out.arrays, weights_version=1))
    PPOUpdate(learner_setup(cfg, model, OBS, ACT)).validate(
        as_message(out.arrays, weights_version=1, actor=0)
    )
    # IMPALA's and APPO's actors take the same Gaussian policy.
    impala_cfg = config("impala")
    assert type(make_categorical_policy(actor_setup(impala_cfg, model, OBS, ACT, 4))) is (
        GaussianPolicy
    )


def test_sample_gaussian_is_mean_plus_std_noise() -> None:
    params = np.array([[0.5, -1.0, np.log(2.0), 0.0]], np.float32)
    noise = np.array([[1.0, -2.0]], np.float32)
    sample, logp = sample_gaussian(params, noise)
    np.testing.assert_allclose(sample, [[2.5, -3.0]])
    want = Normal(torch.tensor([0.5, -1.0]), torch.tensor([2.0, 1.0])).log_prob(
        torch.tensor([2.5, -3.0])
    )
    np.testing.assert_allclose(logp, [float(want.sum())], rtol=1e-6)


def test_the_gaussian_policy_has_no_random_mode() -> None:
    cfg = ppo_config().model_copy(deep=True)
    cfg.actor.random_policy = True
    model = experiment_model(ppo_config(), OBS, ACT)
    with pytest.raises(ValueError, match="actor.random_policy"):
        GaussianPolicy(actor_setup(cfg, model, OBS, ACT, 2))


def test_a_box_layout_refuses_discrete_and_accepts_out_of_bounds_samples() -> None:
    replay = experience_layout(
        "unroll",
        actions="any",
        observation_space=OBS,
        action_space=ACT,
        num_envs=1,
        trajectory_length=2,
    )
    msg = replay.example()
    arrays = dict(msg.arrays)
    arrays["action"] = np.full((1, 2, 1), 7.5, np.float32)  # an unclipped sample
    replay.check(as_message(arrays, weights_version=0))
    arrays["action"] = np.zeros((1, 2), np.int64)
    with pytest.raises(P.ProtocolError):
        replay.check(as_message(arrays, weights_version=0))


# ----------------------------------------------------------------------------- the learners


def test_ppo_trains_a_gaussian_round_as_the_reference_loss_says() -> None:
    cfg = ppo_config()
    torch.manual_seed(0)
    model = experiment_model(cfg, OBS, ACT)
    assert isinstance(model, GaussianActorCritic)
    update = PPOUpdate(learner_setup(cfg, model, OBS, ACT))
    policy = make_policy(actor_setup(cfg, model, OBS, ACT, 4))
    rng = np.random.default_rng(3)
    out = policy.finish(collect(policy, rng, 4, 8))
    rollout = update.validate(as_message(out.arrays, weights_version=1, actor=0))

    # One minibatch's loss against the per-sample reference (density from the definition).
    from zrl.algos.ppo.rounds import round_tensors

    data = round_tensors(model, [rollout], 0.98, 0.8, value_normalizer=update.value_normalizer)
    mb = {k: v[:8] for k, v in data.items()}
    mb["advantage"] = mb["advantage"].to(torch.float32)
    loss, parts = update.sample_loss(mb)
    adv = mb["advantage"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    params, values = model(mb["obs"])
    ref_policy = ref_entropy = torch.zeros(())
    for i in range(8):
        ratio = torch.exp(density(params[i], mb["action"][i]) - mb["logp"][i])
        ref_policy = ref_policy - torch.min(ratio * adv[i], ratio.clamp(0.8, 1.2) * adv[i]) / 8
        ref_entropy = ref_entropy + entropy_of(params[i]) / 8
    ref_value = 0.5 * ((values - mb["return"]) ** 2).mean()
    assert parts["policy_loss"] == pytest.approx(float(ref_policy), abs=1e-5)
    assert parts["entropy"] == pytest.approx(float(ref_entropy), abs=1e-5)
    assert parts["value_loss"] == pytest.approx(float(ref_value), abs=1e-5)
    assert parts["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # the weights that acted

    # A whole round: trained, the statistics moved after it, the weights changed.
    before = {k: v.clone() for k, v in model.state_dict().items()}
    update.receive(as_message(out.arrays, weights_version=1, actor=0), 1)
    result = update.train(1)
    assert result is not None and result.updates == 2 * 4 and math.isfinite(result.loss)
    assert model.normalizer is not None and float(model.normalizer.count) == 32
    assert update.value_normalizer is not None and update.value_normalizer.count == 32
    assert not torch.equal(before["log_std"], model.log_std.detach())


def continuous_unroll_batch(rng: np.random.Generator, n: int, T: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(n, T, 3)).astype(np.float32),
        "action": (rng.normal(size=(n, T, 1)) * 3).astype(np.float32),
        "logp": np.full((n, T), -1.5, np.float32),
        "reward": rng.normal(size=(n, T)).astype(np.float32),
        "terminated": np.zeros((n, T), bool),
        "truncated": np.zeros((n, T), bool),
        "valid": np.ones((n, T), bool),
        "bootstrap_obs": rng.normal(size=(n, 3)).astype(np.float32),
        "weights_version": np.zeros(n, np.int64),
        "weight": np.ones(n, np.float32),
        "key": np.arange(n, dtype=np.int64),
    }


@pytest.mark.parametrize(("algo", "cls"), [("impala", ImpalaUpdate), ("appo", AppoUpdate)])
def test_impala_and_appo_learners_train_on_continuous_unroll_batches(algo, cls) -> None:
    cfg = config(algo, env={"id": "Pendulum-v1"}, model={"normalize_input": True})
    s = setup(cfg)
    update = cls(s)
    assert update.schema is M.CONTINUOUS_UNROLL_BATCH
    rng = np.random.default_rng(0)
    arrays = continuous_unroll_batch(rng, 4, cfg.actor.trajectory_length)
    # V-trace on the model's densities: target log-probs are Normal's of the samples.
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    f = unroll_forward(s.model, tensors, gamma=0.99, rho_bar=1.0, c_bar=1.0)
    params = f.logits.detach()
    want = Normal(params[..., :1], params[..., 1:].exp()).log_prob(f.actions).sum(-1)
    torch.testing.assert_close(f.target_logp, want)
    result = trained(update, batch(arrays))
    assert result.updates >= 1 and math.isfinite(float(result.loss))
    assert (
        s.model.normalizer is not None
        and float(s.model.normalizer.count) == arrays["obs"].shape[0] * arrays["obs"].shape[1]
    )
    bad = dict(arrays, action=np.zeros((4, cfg.actor.trajectory_length), np.int64))
    with pytest.raises(P.ProtocolError):
        update.receive(batch(bad), 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("algo", "cls"), [("impala", ImpalaUpdate), ("appo", AppoUpdate)])
def test_gaussian_learners_train_on_the_gpu_without_host_syncs(algo, cls) -> None:
    """On a GPU the Gaussian densities, the observation statistics and the checks stay on the
    device: an update of a batch already there reads nothing back."""
    own = {"appo": {"normalize_returns": True, "epochs": 2, "minibatches": 2}}
    own = own if algo == "appo" else {}
    cfg = config(algo, env={"id": "Pendulum-v1"}, model={"normalize_input": True}, **own)
    s = setup(cfg)
    s.model.cuda()
    s.device = torch.device("cuda")
    update = cls(s)
    assert update.defer_checks
    T = cfg.actor.trajectory_length
    msgs = [batch(continuous_unroll_batch(np.random.default_rng(i), 4, T)) for i in range(2)]
    update.receive(msgs[0], 0)
    first = update.train(0)  # the optimizer's state is made here
    update.receive(msgs[1], 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the update raises
    try:
        second = update.train(0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert first is not None and second is not None and second.finite is not None
    assert bool(second.finite) and s.model.normalizer is not None
    assert float(s.model.normalizer.count) == 2 * 4 * T
