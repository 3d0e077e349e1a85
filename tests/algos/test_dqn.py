"""DQN target/loss math vs. per-sample references, and the behaviour of one update step."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from zrl.algos.apex_dqn.losses import (
    DQNUpdate,
    double_q_targets,
    dqn_loss,
    dqn_update,
    initial_priorities,
    q_targets,
    td_errors,
)
from zrl.algos.kernel.exploration import apex_epsilons
from zrl.algos.kernel.q_learning import soft_update

torch.set_num_threads(1)
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def q_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    batch, num_actions = draw(st.integers(1, 8)), draw(st.integers(1, 5))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    discounts = torch.rand(batch, generator=gen)
    discounts[torch.rand(batch, generator=gen) < 0.3] = 0.0  # some terminal transitions
    return {
        "q": torch.randn(batch, num_actions, generator=gen) * 3,
        "actions": torch.randint(num_actions, (batch,), generator=gen),
        "returns": torch.randn(batch, generator=gen),
        "discounts": discounts,
        "next_online": torch.randn(batch, num_actions, generator=gen),
        "next_target": torch.randn(batch, num_actions, generator=gen),
        "weights": torch.rand(batch, generator=gen),
    }


def huber_ref(x: float, delta: float) -> float:
    return 0.5 * x * x if abs(x) <= delta else delta * (abs(x) - 0.5 * delta)


@SETTINGS
@given(b=q_batches())
def test_targets_match_per_sample_reference(b):
    double = double_q_targets(b["returns"], b["discounts"], b["next_online"], b["next_target"])
    plain = q_targets(b["returns"], b["discounts"], b["next_target"])
    for i in range(len(b["returns"])):
        online_row = b["next_online"][i].tolist()
        target_row = b["next_target"][i].tolist()
        a_star = online_row.index(max(online_row))
        r, d = float(b["returns"][i]), float(b["discounts"][i])
        assert double[i].item() == pytest.approx(r + d * target_row[a_star], abs=1e-5)
        assert plain[i].item() == pytest.approx(r + d * max(target_row), abs=1e-5)


def test_double_differs_from_plain_when_networks_disagree():
    next_online = torch.tensor([[1.0, 0.0]])  # online prefers action 0
    next_target = torch.tensor([[2.0, 5.0]])  # target would pick action 1
    r, d = torch.tensor([1.0]), torch.tensor([0.5])
    assert double_q_targets(r, d, next_online, next_target).item() == pytest.approx(2.0)
    assert q_targets(r, d, next_target).item() == pytest.approx(3.5)
    assert q_targets(r, torch.tensor([0.0]), next_target).item() == pytest.approx(1.0)


@SETTINGS
@given(b=q_batches(), delta=st.sampled_from([0.5, 1.0, 10.0]))
def test_td_and_loss_match_per_sample_reference(b, delta):
    targets = q_targets(b["returns"], b["discounts"], b["next_target"])
    q = b["q"].clone().requires_grad_(True)
    td = td_errors(q, b["actions"], targets)
    loss, td_out = dqn_loss(q, b["actions"], targets, b["weights"], huber_delta=delta)
    batch = len(targets)
    ref_td = [float(targets[i]) - float(b["q"][i, int(b["actions"][i])]) for i in range(batch)]
    ref_loss = sum(float(b["weights"][i]) * huber_ref(ref_td[i], delta) for i in range(batch))
    np.testing.assert_allclose(td.detach().numpy(), ref_td, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(td_out.numpy(), ref_td, rtol=1e-5, atol=1e-5)
    assert not td_out.requires_grad
    assert loss.item() == pytest.approx(ref_loss / batch, rel=1e-4, abs=1e-6)
    # Gradient flows only into the taken action: -w * clip(td, delta) / B.
    loss.backward()
    grad = q.grad.numpy()
    for i in range(batch):
        a = int(b["actions"][i])
        expected = -float(b["weights"][i]) * max(-delta, min(delta, ref_td[i])) / batch
        assert grad[i, a] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        assert np.count_nonzero(np.delete(grad[i], a)) == 0


def test_loss_huber_regions():
    q = torch.zeros(2, 1)
    actions = torch.zeros(2, dtype=torch.long)
    targets = torch.tensor([0.5, 3.0])
    loss, _ = dqn_loss(q, actions, targets, torch.ones(2), huber_delta=1.0)
    assert loss.item() == pytest.approx((0.5 * 0.25 + (3.0 - 0.5)) / 2)


def test_loss_rejects_targets_with_grad_and_bad_delta():
    q = torch.zeros(1, 2, requires_grad=True)
    actions = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="no_grad"):
        dqn_loss(q, actions, q.sum(1), torch.ones(1))
    with pytest.raises(ValueError, match="huber_delta=0"):
        dqn_loss(q, actions, torch.zeros(1), torch.ones(1), huber_delta=0.0)


def test_apex_epsilons():
    eps = apex_epsilons(8, base=0.4, alpha=7.0)
    assert eps.shape == (8,)
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4**8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert np.all(np.diff(eps) < 0)
    assert apex_epsilons(1, base=0.3).tolist() == [0.3]
    with pytest.raises(ValueError, match="num=0"):
        apex_epsilons(0)


def test_initial_priorities_reference():
    rng = np.random.default_rng(0)
    q_taken, returns = rng.normal(size=5), rng.normal(size=5)
    discounts = np.array([0.9, 0.0, 0.81, 0.5, 1.0])
    next_q = rng.normal(size=(5, 3))
    got = initial_priorities(q_taken, returns, discounts, next_q)
    assert got.dtype == np.float32
    for i in range(5):
        expected = abs(returns[i] + discounts[i] * max(next_q[i]) - q_taken[i])
        assert got[i] == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- update step


def tiny_setup(seed: int = 0, batch: int = 16):
    torch.manual_seed(seed)
    online = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    target = copy.deepcopy(online)
    data = {
        "obs": torch.randn(batch, 4),
        "action": torch.randint(3, (batch,)),
        "reward": torch.randn(batch),
        "discount": torch.full((batch,), 0.9),
        "next_obs": torch.randn(batch, 4),
        "weight": torch.rand(batch) + 0.5,
    }
    return online, target, data


def eval_loss(online, target, data, double=True):
    with torch.no_grad():
        nq = target(data["next_obs"])
        y = (
            double_q_targets(data["reward"], data["discount"], online(data["next_obs"]), nq)
            if double
            else q_targets(data["reward"], data["discount"], nq)
        )
        return dqn_loss(online(data["obs"]), data["action"], y, data["weight"])[0].item()


@pytest.mark.parametrize("double", [True, False])
def test_dqn_update_reduces_loss(double):
    online, target, data = tiny_setup()
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-2)
    before = eval_loss(online, target, data, double)
    results = [
        dqn_update(online, target, optimizer, data, double=double, huber_delta=1.0, grad_clip=10.0)
        for _ in range(30)
    ]
    after = eval_loss(online, target, data, double)
    assert results[0].loss == pytest.approx(before, rel=1e-5)
    assert after < 0.6 * before
    first = results[0]
    assert isinstance(first, DQNUpdate)
    assert first.td.dtype == np.float32 and first.td.shape == (16,)
    assert np.all(first.td >= 0)


def test_dqn_update_td_are_new_priorities():
    online, target, data = tiny_setup(seed=1)
    optimizer = torch.optim.SGD(online.parameters(), lr=0.0)
    out = dqn_update(online, target, optimizer, data, double=True, huber_delta=1.0, grad_clip=1.0)
    with torch.no_grad():
        y = double_q_targets(
            data["reward"], data["discount"], online(data["next_obs"]), target(data["next_obs"])
        )
        q = online(data["obs"])
        expected = td_errors(q, data["action"], y).abs().numpy()
        q_mean = q.gather(1, data["action"][:, None]).mean().item()
    np.testing.assert_allclose(out.td, expected, rtol=1e-6)
    assert out.q_mean == pytest.approx(q_mean)


def test_dqn_update_respects_grad_clip():
    online, target, data = tiny_setup(seed=2)
    data["reward"] = data["reward"] * 50  # big errors -> big gradients
    # Reference pre-clip gradient norm from an identical copy.
    ref = copy.deepcopy(online)
    with torch.no_grad():
        y = double_q_targets(
            data["reward"], data["discount"], ref(data["next_obs"]), target(data["next_obs"])
        )
    loss, _ = dqn_loss(ref(data["obs"]), data["action"], y, data["weight"], huber_delta=1.0)
    loss.backward()
    ref_norm = math.sqrt(sum(float(p.grad.square().sum()) for p in ref.parameters()))

    clip, lr = 0.01, 1.0
    params_before = torch.cat([p.detach().flatten().clone() for p in online.parameters()])
    optimizer = torch.optim.SGD(online.parameters(), lr=lr)
    out = dqn_update(online, target, optimizer, data, double=True, huber_delta=1.0, grad_clip=clip)
    params_after = torch.cat([p.detach().flatten() for p in online.parameters()])

    assert out.grad_norm == pytest.approx(ref_norm, rel=1e-4)
    assert out.grad_norm > 10 * clip
    step = (params_after - params_before).norm().item()
    assert step <= lr * clip * (1 + 1e-3)
    assert step > 0.5 * lr * clip


def test_dqn_update_rejects_bad_input():
    online, target, data = tiny_setup()
    optimizer = torch.optim.SGD(online.parameters(), lr=0.1)
    del data["weight"]
    with pytest.raises(ValueError, match="weight"):
        dqn_update(online, target, optimizer, data, double=True, huber_delta=1.0, grad_clip=1.0)
    _, _, data = tiny_setup()
    with pytest.raises(ValueError, match="grad_clip=0"):
        dqn_update(online, target, optimizer, data, double=True, huber_delta=1.0, grad_clip=0.0)


def test_soft_update():
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    o = online.state_dict()  # shares storage with the module
    o["1.running_mean"].fill_(1.0)
    o["1.num_batches_tracked"].fill_(7)
    t0 = {k: v.clone() for k, v in target.state_dict().items()}

    soft_update(target, online, tau=0.25)
    for k, v in target.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v, 0.25 * o[k] + 0.75 * t0[k])
    assert target.state_dict()["1.num_batches_tracked"].item() == 7

    soft_update(target, online, tau=1.0)
    for k, v in target.state_dict().items():
        assert torch.equal(v, o[k]), k
    assert target.state_dict()["1.running_mean"].data_ptr() != o["1.running_mean"].data_ptr()

    with pytest.raises(ValueError, match="tau=0"):
        soft_update(target, online, tau=0.0)
    with pytest.raises(ValueError, match="differ in keys"):
        soft_update(nn.Linear(3, 4), nn.Sequential(nn.Linear(3, 4)), tau=1.0)
