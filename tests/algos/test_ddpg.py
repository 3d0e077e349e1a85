"""Ape-X DDPG / TD3 math vs. per-sample references, and the behaviour of one update step."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.algos.apex_ddpg.losses import (
    DDPGUpdate,
    critic_targets,
    ddpg_update,
    target_policy_smoothing,
)
from zrl.algos.api.learner import NonFiniteLossError
from zrl.algos.kernel.continuous import initial_priorities
from zrl.algos.kernel.q_learning import huber
from zrl.nets.continuous import DDPGModel

torch.set_num_threads(1)
SETTINGS = settings(max_examples=60, deadline=None)
LOW = np.array([-2.0, 0.0], dtype=np.float32)
HIGH = np.array([2.0, 1.0], dtype=np.float32)


@st.composite
def target_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    batch = draw(st.integers(1, 8))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    discounts = torch.rand(batch, generator=gen)
    discounts[torch.rand(batch, generator=gen) < 0.3] = 0.0  # some terminal transitions
    return {
        "returns": torch.randn(batch, generator=gen),
        "discounts": discounts,
        "q1": torch.randn(batch, generator=gen) * 3,
        "q2": torch.randn(batch, generator=gen) * 3,
    }


@SETTINGS
@given(b=target_batches())
def test_critic_targets_match_per_sample_reference(b):
    twin = critic_targets(b["returns"], b["discounts"], b["q1"], b["q2"])
    single = critic_targets(b["returns"], b["discounts"], b["q1"])
    for i in range(len(b["returns"])):
        r, d = float(b["returns"][i]), float(b["discounts"][i])
        q1, q2 = float(b["q1"][i]), float(b["q2"][i])
        assert twin[i].item() == pytest.approx(r + d * min(q1, q2), abs=1e-5)
        assert single[i].item() == pytest.approx(r + d * q1, abs=1e-5)


def test_initial_priorities_reference():
    rng = np.random.default_rng(0)
    q_taken, returns, next_q = rng.normal(size=5), rng.normal(size=5), rng.normal(size=5)
    discounts = np.array([0.9, 0.0, 0.81, 0.5, 1.0])
    got = initial_priorities(q_taken, returns, discounts, next_q)
    assert got.dtype == np.float32 and got.shape == (5,)
    for i in range(5):
        expected = abs(returns[i] + discounts[i] * next_q[i] - q_taken[i])
        assert got[i] == pytest.approx(expected, rel=1e-5)


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    noise_std=st.sampled_from([0.1, 0.2, 1.0, 10.0]),
    noise_clip=st.sampled_from([0.0, 0.25, 0.5, 3.0]),
)
def test_smoothing_matches_reference_and_stays_in_bounds(seed, noise_std, noise_clip):
    gen = torch.Generator().manual_seed(seed)
    # Actions inside, on and (for the clip) outside the bounds.
    actions = torch.rand(6, 2, generator=gen) * torch.tensor([5.0, 1.6]) - torch.tensor([2.5, 0.3])
    got = target_policy_smoothing(
        actions, noise_std, noise_clip, LOW, HIGH, generator=torch.Generator().manual_seed(seed)
    )
    eps = torch.randn(actions.shape, generator=torch.Generator().manual_seed(seed))
    for i in range(6):
        for j in range(2):
            scale = (float(HIGH[j]) - float(LOW[j])) / 2
            noise = noise_std * scale * float(eps[i, j])
            noise = max(-noise_clip * scale, min(noise_clip * scale, noise))
            expected = max(float(LOW[j]), min(float(HIGH[j]), float(actions[i, j]) + noise))
            assert got[i, j].item() == pytest.approx(expected, abs=1e-5)
            assert LOW[j] <= got[i, j].item() <= HIGH[j]
            # Inside the box, the perturbation never exceeds the noise clip.
            if LOW[j] <= actions[i, j] <= HIGH[j]:
                assert abs(got[i, j].item() - actions[i, j].item()) <= noise_clip * scale + 1e-5


def test_smoothing_noise_statistics_and_zero_noise():
    actions = torch.zeros(20000, 2) + torch.tensor([0.0, 0.5])
    gen = torch.Generator().manual_seed(0)
    got = target_policy_smoothing(actions, 0.1, 10.0, LOW, HIGH, generator=gen)
    noise = got - actions
    np.testing.assert_allclose(noise.std(0).numpy(), [0.2, 0.05], rtol=0.05)
    np.testing.assert_allclose(noise.mean(0).numpy(), [0.0, 0.0], atol=0.01)
    outside = torch.tensor([[3.0, -1.0], [0.5, 0.5]])
    torch.testing.assert_close(
        target_policy_smoothing(outside, 0.0, 0.5, LOW, HIGH),
        torch.tensor([[2.0, 0.0], [0.5, 0.5]]),
    )
    with pytest.raises(ValueError, match="noise_std=-0.1"):
        target_policy_smoothing(actions, -0.1, 0.5, LOW, HIGH)
    with pytest.raises(ValueError, match="noise_clip=nan"):
        target_policy_smoothing(actions, 0.1, math.nan, LOW, HIGH)


# ----------------------------------------------------------------------------- update step


def tiny_setup(seed: int = 0, batch: int = 16, twin: bool = True):
    torch.manual_seed(seed)
    model = DDPGModel(3, 2, LOW, HIGH, hidden=(32, 32), twin=twin)
    target = copy.deepcopy(model)
    critic_params = list(model.q1.parameters())
    if model.q2 is not None:
        critic_params += list(model.q2.parameters())
    data = {
        "obs": torch.randn(batch, 3),
        "action": torch.rand(batch, 2) * torch.tensor([4.0, 1.0]) + torch.tensor([-2.0, 0.0]),
        "reward": torch.randn(batch),
        "discount": torch.full((batch,), 0.9),
        "next_obs": torch.randn(batch, 3),
        "weight": torch.rand(batch) + 0.5,
    }
    return model, target, critic_params, data


def ref_critic_loss(model, target, data, huber_delta=None):
    """Critic loss straight from the definitions (no smoothing), per sample."""
    with torch.no_grad():
        next_a = target.policy(data["next_obs"])
        nq1, nq2 = target.q_values(data["next_obs"], next_a)
        q1, q2 = model.q_values(data["obs"], data["action"])
    total = 0.0
    for i in range(len(data["reward"])):
        bootstrap = float(nq1[i]) if nq2 is None else min(float(nq1[i]), float(nq2[i]))
        y = float(data["reward"][i]) + float(data["discount"][i]) * bootstrap
        for q in [q1] if q2 is None else [q1, q2]:
            x = y - float(q[i])
            per = 0.5 * x * x if huber_delta is None else float(huber(torch.tensor(x), huber_delta))
            total += float(data["weight"][i]) * per / len(data["reward"])
    return total


def run(model, target, actor_opt, critic_opt, data, **overrides):
    kwargs: dict[str, Any] = dict(
        update_actor=True,
        target_noise=0.0,
        target_noise_clip=0.5,
        grad_clip=10.0,
        huber_delta=None,
    )
    kwargs.update(overrides)
    return ddpg_update(model, target, actor_opt, critic_opt, data, **kwargs)


@pytest.mark.parametrize("twin,huber_delta", [(True, None), (False, 1.0)])
def test_ddpg_update_reduces_critic_loss(twin, huber_delta):
    model, target, critic_params, data = tiny_setup(twin=twin)
    actor_opt = torch.optim.Adam(model.policy.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(critic_params, lr=3e-3)
    before = ref_critic_loss(model, target, data, huber_delta)
    results = [
        run(
            model,
            target,
            actor_opt,
            critic_opt,
            data,
            update_actor=i % 2 == 0,
            huber_delta=huber_delta,
        )
        for i in range(200)
    ]
    after = ref_critic_loss(model, target, data, huber_delta)
    assert results[0].critic_loss == pytest.approx(before, rel=1e-4)
    assert after < 0.1 * before
    first = results[0]
    assert isinstance(first, DDPGUpdate)
    assert first.td.dtype == np.float32 and first.td.shape == (16,) and np.all(first.td >= 0)
    assert math.isnan(results[1].actor_loss) and math.isnan(results[1].actor_grad_norm)
    assert math.isfinite(first.actor_loss) and first.grad_norm > 0


def test_actor_step_ascends_q_and_leaves_critics_alone():
    model, target, critic_params, data = tiny_setup(seed=1)
    actor_opt = torch.optim.Adam(model.policy.parameters(), lr=1e-2)
    critic_opt = torch.optim.SGD(critic_params, lr=0.0)
    critic_before = [p.detach().clone() for p in critic_params]
    with torch.no_grad():
        q_before = model.q1(data["obs"], model.policy(data["obs"])).mean().item()
    out = run(model, target, actor_opt, critic_opt, data, grad_clip=math.inf)
    # The critic grads are exactly those of the critic loss: the actor step added nothing.
    reference = copy.deepcopy(model)  # critics unchanged (lr 0); critic loss ignores policy
    ref_out = run(
        reference,
        target,
        torch.optim.SGD(reference.policy.parameters(), lr=0.0),
        torch.optim.SGD([*reference.q1.parameters(), *reference.q2.parameters()], lr=0.0),
        data,
        update_actor=False,
        grad_clip=math.inf,
    )
    ref_critic = [*reference.q1.parameters(), *reference.q2.parameters()]
    for p, p0, ref in zip(critic_params, critic_before, ref_critic, strict=True):
        assert torch.equal(p.detach(), p0)
        torch.testing.assert_close(p.grad, ref.grad)
        assert p.requires_grad
    assert out.critic_loss == pytest.approx(ref_out.critic_loss)
    assert out.actor_loss == pytest.approx(-q_before, rel=1e-5)
    for _ in range(20):
        run(model, target, actor_opt, critic_opt, data)
    with torch.no_grad():
        q_after = model.q1(data["obs"], model.policy(data["obs"])).mean().item()
    assert q_after > q_before


def test_ddpg_update_td_are_new_priorities_and_no_actor_update():
    model, target, critic_params, data = tiny_setup(seed=2, twin=False)
    policy_before = [p.detach().clone() for p in model.policy.parameters()]
    actor_opt = torch.optim.SGD(model.policy.parameters(), lr=1.0)
    out = run(
        model,
        target,
        actor_opt,
        torch.optim.SGD(critic_params, lr=0.0),
        data,
        update_actor=False,
    )
    with torch.no_grad():
        y = data["reward"] + data["discount"] * target.q1(
            data["next_obs"], target.policy(data["next_obs"])
        )
        q = model.q1(data["obs"], data["action"])
    np.testing.assert_allclose(out.td, (y - q).abs().numpy(), rtol=1e-5, atol=1e-6)
    assert out.q_mean == pytest.approx(q.mean().item(), rel=1e-6)
    assert math.isnan(out.actor_loss)
    for p, p0 in zip(model.policy.parameters(), policy_before, strict=True):
        assert torch.equal(p.detach(), p0)


def test_ddpg_update_target_smoothing_uses_generator():
    model, target, critic_params, data = tiny_setup(seed=3)
    outs = []
    for _ in range(2):
        m = copy.deepcopy(model)
        critic = torch.optim.SGD([*m.q1.parameters(), *m.q2.parameters()], lr=0.0)
        actor = torch.optim.SGD(m.policy.parameters(), lr=0.0)
        gen = torch.Generator().manual_seed(7)
        outs.append(run(m, target, actor, critic, data, target_noise=0.2, generator=gen))
    np.testing.assert_array_equal(outs[0].td, outs[1].td)
    plain = run(
        copy.deepcopy(model),
        target,
        torch.optim.SGD(model.policy.parameters(), lr=0.0),
        torch.optim.SGD(critic_params, lr=0.0),
        data,
    )
    assert not np.array_equal(plain.td, outs[0].td)


def test_ddpg_update_non_finite_leaves_weights_untouched():
    model, target, critic_params, data = tiny_setup(seed=4)
    data["reward"][3] = math.nan
    state = {k: v.clone() for k, v in model.state_dict().items()}
    actor_opt = torch.optim.Adam(model.policy.parameters(), lr=1e-2)
    critic_opt = torch.optim.Adam(critic_params, lr=1e-2)
    with pytest.raises(NonFiniteLossError):
        run(model, target, actor_opt, critic_opt, data)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert all(p.requires_grad for p in model.parameters())


def test_ddpg_update_rejects_bad_input():
    model, target, critic_params, data = tiny_setup()
    opts = (
        torch.optim.SGD(model.policy.parameters(), lr=0.1),
        torch.optim.SGD(critic_params, lr=0.1),
    )
    bad = dict(data)
    del bad["weight"]
    with pytest.raises(ValueError, match="weight"):
        run(model, target, *opts, bad)
    with pytest.raises(ValueError, match="grad_clip=0"):
        run(model, target, *opts, data, grad_clip=0.0)
    with pytest.raises(ValueError, match="huber_delta=0"):
        run(model, target, *opts, data, huber_delta=0.0)
    with pytest.raises(ValueError, match="target_noise=-1"):
        run(model, target, *opts, data, target_noise=-1.0)
    single = DDPGModel(3, 2, LOW, HIGH, hidden=(32, 32), twin=False)
    with pytest.raises(ValueError, match="twin"):
        run(model, single, *opts, data)
