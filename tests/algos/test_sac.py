"""SAC targets / losses vs. per-sample references, and the behaviour of one update step."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from zrl.algos.api.learner import NonFiniteLossError
from zrl.algos.sac.losses import (
    SACUpdate,
    default_target_entropy,
    sac_actor_loss,
    sac_critic_targets,
    sac_update,
    temperature_loss,
)
from zrl.nets.continuous import SACModel

torch.set_num_threads(1)
SETTINGS = settings(max_examples=60, deadline=None)
LOW = np.array([-1.0, -2.0], dtype=np.float32)
HIGH = np.array([1.0, 2.0], dtype=np.float32)


@st.composite
def sac_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    batch = draw(st.integers(1, 8))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    discounts = torch.rand(batch, generator=gen)
    discounts[torch.rand(batch, generator=gen) < 0.3] = 0.0  # some terminal transitions
    return {
        "returns": torch.randn(batch, generator=gen),
        "discounts": discounts,
        "q1": torch.randn(batch, generator=gen) * 3,
        "q2": torch.randn(batch, generator=gen) * 3,
        "logp": torch.randn(batch, generator=gen) * 2,
    }


@SETTINGS
@given(b=sac_batches(), alpha=st.sampled_from([0.0, 0.05, 0.2, 1.0]))
def test_targets_and_losses_match_per_sample_reference(b, alpha):
    y = sac_critic_targets(b["returns"], b["discounts"], b["q1"], b["q2"], b["logp"], alpha)
    actor = sac_actor_loss(b["q1"], b["q2"], b["logp"], alpha)
    batch = len(b["returns"])
    ref_actor = 0.0
    for i in range(batch):
        r, d = float(b["returns"][i]), float(b["discounts"][i])
        q1, q2, logp = float(b["q1"][i]), float(b["q2"][i]), float(b["logp"][i])
        assert y[i].item() == pytest.approx(r + d * (min(q1, q2) - alpha * logp), abs=1e-5)
        ref_actor += (alpha * logp - min(q1, q2)) / batch
    assert actor.item() == pytest.approx(ref_actor, abs=1e-5)


@SETTINGS
@given(b=sac_batches(), log_alpha=st.floats(-3, 1), target_entropy=st.sampled_from([-2.0, 0.5]))
def test_temperature_loss_reference_and_gradient(b, log_alpha, target_entropy):
    la = torch.tensor(log_alpha, requires_grad=True)
    logp = b["logp"].clone().requires_grad_(True)
    loss = temperature_loss(la, logp, target_entropy)
    batch = len(logp)
    ref = -sum(log_alpha * (float(lp) + target_entropy) for lp in b["logp"]) / batch
    assert loss.item() == pytest.approx(ref, abs=1e-5)
    loss.backward()
    ref_grad = -sum(float(lp) + target_entropy for lp in b["logp"]) / batch
    assert la.grad is not None and la.grad.item() == pytest.approx(ref_grad, abs=1e-5)
    assert logp.grad is None  # the log-probs are constants of the temperature loss


def test_temperature_loss_direction():
    # Entropy -mean(logp) = -1 below the target 0.5: gradient descent must raise log_alpha.
    la = torch.tensor(0.0, requires_grad=True)
    temperature_loss(la, torch.ones(4), target_entropy=0.5).backward()
    assert la.grad is not None and la.grad.item() < 0
    la.grad = None
    temperature_loss(la, torch.full((4,), -3.0), target_entropy=0.5).backward()
    assert la.grad is not None and la.grad.item() > 0


def test_actor_loss_gradient_is_pessimistic():
    q1 = torch.tensor([1.0, 5.0], requires_grad=True)
    q2 = torch.tensor([2.0, 3.0], requires_grad=True)
    logp = torch.tensor([0.5, -1.0], requires_grad=True)
    sac_actor_loss(q1, q2, logp, 0.2).backward()
    assert q1.grad is not None and q2.grad is not None and logp.grad is not None
    # Only the smaller critic of each sample gets gradient -1/B.
    assert q1.grad.tolist() == [-0.5, 0.0] and q2.grad.tolist() == [0.0, -0.5]
    assert logp.grad.tolist() == pytest.approx([0.1, 0.1])


def test_default_target_entropy():
    assert default_target_entropy(3) == -3.0
    with pytest.raises(ValueError, match="act_dim=0"):
        default_target_entropy(0)


# ----------------------------------------------------------------------------- update step


def tiny_setup(seed: int = 0, batch: int = 16):
    torch.manual_seed(seed)
    model = SACModel(3, 2, LOW, HIGH, hidden=(32, 32))
    target = copy.deepcopy(model)
    data = {
        "obs": torch.randn(batch, 3),
        "action": torch.rand(batch, 2) * torch.tensor([2.0, 4.0]) - torch.tensor([1.0, 2.0]),
        "reward": torch.randn(batch),
        "discount": torch.full((batch,), 0.9),
        "next_obs": torch.randn(batch, 3),
        "weight": torch.rand(batch) + 0.5,
    }
    log_alpha = nn.Parameter(torch.tensor(math.log(0.1)))
    return model, target, data, log_alpha


def optimizers(model, log_alpha, lr=3e-3):
    return (
        torch.optim.Adam(model.policy.parameters(), lr=lr),
        torch.optim.Adam([*model.q1.parameters(), *model.q2.parameters()], lr=lr),
        torch.optim.Adam([log_alpha], lr=lr),
    )


def ref_critic_loss(model, target, data, alpha, samples=64):
    """Critic loss from the definitions, averaging the sampled soft target over many a'."""
    with torch.no_grad():
        ys = []
        for _ in range(samples):
            next_a, next_logp = model.sample(data["next_obs"])
            nq1, nq2 = target.q_values(data["next_obs"], next_a)
            ys.append(
                data["reward"] + data["discount"] * (torch.minimum(nq1, nq2) - alpha * next_logp)
            )
        y = torch.stack(ys).mean(0)
        q1, q2 = model.q_values(data["obs"], data["action"])
    total = 0.0
    for i in range(len(y)):
        w = float(data["weight"][i])
        total += w * 0.5 * ((float(y[i]) - float(q1[i])) ** 2 + (float(y[i]) - float(q2[i])) ** 2)
    return total / len(y)


def test_sac_update_reduces_critic_loss():
    model, target, data, log_alpha = tiny_setup()
    actor_opt, critic_opt, alpha_opt = optimizers(model, log_alpha)
    alpha0 = math.exp(log_alpha.item())
    before = ref_critic_loss(model, target, data, alpha0)
    results = [
        sac_update(
            model,
            target,
            actor_opt,
            critic_opt,
            alpha_opt,
            log_alpha,
            data,
            target_entropy=-2.0,
            grad_clip=10.0,
        )
        for _ in range(200)
    ]
    after = ref_critic_loss(model, target, data, math.exp(log_alpha.item()))
    assert after < 0.2 * before
    first = results[0]
    assert isinstance(first, SACUpdate)
    assert first.alpha == pytest.approx(alpha0)
    assert first.td.dtype == np.float32 and first.td.shape == (16,) and np.all(first.td >= 0)
    assert all(math.isfinite(r.actor_loss) and math.isfinite(r.alpha_loss) for r in results)
    assert all(r.alpha > 0 and math.isfinite(r.entropy) for r in results)


@pytest.mark.parametrize("target_entropy,direction", [(5.0, 1), (-50.0, -1)])
def test_sac_alpha_moves_towards_target_entropy(target_entropy, direction):
    model, target, data, log_alpha = tiny_setup(seed=1)
    actor_opt, critic_opt, alpha_opt = optimizers(model, log_alpha, lr=1e-2)
    start = log_alpha.item()
    for _ in range(10):
        out = sac_update(
            model,
            target,
            actor_opt,
            critic_opt,
            alpha_opt,
            log_alpha,
            data,
            target_entropy=target_entropy,
            grad_clip=10.0,
        )
        # target 5 is above any reachable entropy of this box (max ~ log(2 * 4) = 2.1), and
        # -50 far below it.
        assert (out.entropy < target_entropy) == (direction > 0)
    assert direction * (log_alpha.item() - start) > 0.05


def test_sac_update_fixed_alpha_leaves_log_alpha():
    model, target, data, log_alpha = tiny_setup(seed=2)
    actor_opt, critic_opt, _ = optimizers(model, log_alpha)
    before = log_alpha.item()
    out = sac_update(
        model,
        target,
        actor_opt,
        critic_opt,
        None,
        log_alpha,
        data,
        target_entropy=-2.0,
        grad_clip=10.0,
        fixed_alpha=0.3,
    )
    assert out.alpha == 0.3 and math.isnan(out.alpha_loss)
    assert log_alpha.item() == before and log_alpha.grad is None


def test_sac_update_td_and_critic_grads_from_critic_loss_only():
    model, target, data, log_alpha = tiny_setup(seed=3)
    critic_params = [*model.q1.parameters(), *model.q2.parameters()]
    critic_before = [p.detach().clone() for p in critic_params]
    actor_opt = torch.optim.SGD(model.policy.parameters(), lr=0.1)
    critic_opt = torch.optim.SGD(critic_params, lr=0.0)
    torch.manual_seed(11)
    out = sac_update(
        model,
        target,
        actor_opt,
        critic_opt,
        None,
        log_alpha,
        data,
        target_entropy=-2.0,
        grad_clip=math.inf,
        fixed_alpha=0.2,
    )
    # Rebuild the pre-step model (same seed) and recompute the critic loss with the same
    # next-action draw: the critic weights must not have moved (lr 0) and their gradients must
    # be those of the critic loss alone, with nothing added by the actor step.
    fresh, _, _, _ = tiny_setup(seed=3)
    torch.manual_seed(11)
    with torch.no_grad():
        next_a, next_logp = fresh.sample(data["next_obs"])
        nq1, nq2 = target.q_values(data["next_obs"], next_a)
        y = sac_critic_targets(data["reward"], data["discount"], nq1, nq2, next_logp, 0.2)
    q1, q2 = fresh.q_values(data["obs"], data["action"])
    w = data["weight"]
    loss = (w * 0.5 * (y - q1).square()).mean() + (w * 0.5 * (y - q2).square()).mean()
    loss.backward()
    np.testing.assert_allclose(out.td, (y - q1).detach().abs().numpy(), rtol=1e-5, atol=1e-6)
    assert out.critic_loss == pytest.approx(loss.item(), rel=1e-5)
    ref_critic = [*fresh.q1.parameters(), *fresh.q2.parameters()]
    for p, p0, ref in zip(critic_params, critic_before, ref_critic, strict=True):
        assert torch.equal(p.detach(), p0)
        torch.testing.assert_close(p.grad, ref.grad)
        assert p.requires_grad
    moved = zip(model.policy.parameters(), fresh.policy.parameters(), strict=True)
    assert any(not torch.equal(p, p0) for p, p0 in moved)  # the actor did step


def test_sac_update_non_finite_leaves_weights_untouched():
    model, target, data, log_alpha = tiny_setup(seed=4)
    data["reward"][0] = math.nan
    actor_opt, critic_opt, alpha_opt = optimizers(model, log_alpha)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    alpha_before = log_alpha.item()
    with pytest.raises(NonFiniteLossError):
        sac_update(
            model,
            target,
            actor_opt,
            critic_opt,
            alpha_opt,
            log_alpha,
            data,
            target_entropy=-2.0,
            grad_clip=10.0,
        )
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert log_alpha.item() == alpha_before
    assert all(p.requires_grad for p in model.parameters())


def test_sac_update_rejects_bad_input():
    model, target, data, log_alpha = tiny_setup()
    actor_opt, critic_opt, alpha_opt = optimizers(model, log_alpha)

    def call(**kw):
        args = dict(
            model=model,
            target=target,
            actor_optimizer=actor_opt,
            critic_optimizer=critic_opt,
            alpha_optimizer=alpha_opt,
            log_alpha=log_alpha,
            batch=data,
            target_entropy=-2.0,
            grad_clip=1.0,
        )
        args.update(kw)
        return sac_update(**args)

    with pytest.raises(ValueError, match="alpha_optimizer is required"):
        call(alpha_optimizer=None)
    with pytest.raises(ValueError, match="log_alpha must require grad"):
        call(log_alpha=torch.tensor(0.0))
    with pytest.raises(ValueError, match="grad_clip=0"):
        call(grad_clip=0.0)
    with pytest.raises(ValueError, match="fixed_alpha=-1"):
        call(fixed_alpha=-1.0)
    with pytest.raises(ValueError, match="missing keys \\['next_obs'\\]"):
        call(batch={k: v for k, v in data.items() if k != "next_obs"})
