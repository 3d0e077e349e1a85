"""R2D2 math vs. references written from the paper's definitions: value rescaling, n-step
double-Q targets over padded sequences, sequence priorities, the sequence loss and burn-in."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from zrl.algos.kernel.q_learning import burn_in_unroll, nstep_double_q_targets
from zrl.algos.r2d2.losses import inverse_value_rescale, r2d2_loss, sequence_priority, value_rescale
from zrl.codecs.nstep import nstep_transitions

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- value rescaling


def h_ref(x: float, eps: float) -> float:
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


def h_inv_ref(x: float, eps: float) -> float:
    """Pohlen et al. 2018, Proposition A.2, as printed."""
    root = (math.sqrt(1 + 4 * eps * (abs(x) + 1 + eps)) - 1) / (2 * eps)
    return math.copysign(root**2 - 1, x)


def wide_grid(dtype: torch.dtype) -> Tensor:
    """0, tiny, moderate and large magnitudes up to 1e4, both signs."""
    mags = torch.cat([torch.logspace(-6, 4, 401, dtype=torch.float64), torch.tensor([0.0])])
    mags = torch.cat([mags, torch.linspace(0.0, 1e4, 1001, dtype=torch.float64)])
    return torch.cat([-mags, mags]).unique().to(dtype)


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
def test_value_rescale_matches_definition(eps):
    x = wide_grid(torch.float64)
    got = value_rescale(x, eps)
    expected = torch.tensor([h_ref(v, eps) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("eps", [1e-3, 1e-2])
def test_inverse_matches_printed_closed_form(eps):
    # The printed form cancels near 0, so compare where it is itself accurate in float64.
    y = wide_grid(torch.float64)
    y = y[y.abs() >= 1e-3]
    got = inverse_value_rescale(y, eps)
    expected = torch.tensor([h_inv_ref(v, eps) for v in y.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
def test_value_rescale_round_trip_float64(eps):
    x = wide_grid(torch.float64)
    torch.testing.assert_close(
        inverse_value_rescale(value_rescale(x, eps), eps), x, rtol=1e-10, atol=1e-12
    )
    y = value_rescale(x, eps)  # the rescaled range that Q-values live in
    torch.testing.assert_close(
        value_rescale(inverse_value_rescale(y, eps), eps), y, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("eps", [1e-3, 0.0])
def test_value_rescale_round_trip_float32(eps):
    x = wide_grid(torch.float32)
    h = value_rescale(x, eps)
    assert h.dtype == torch.float32
    back = inverse_value_rescale(h, eps)
    assert back.dtype == torch.float32
    torch.testing.assert_close(back, x, rtol=1e-6, atol=1e-6)


def test_value_rescale_shape_sign_and_monotone():
    x = wide_grid(torch.float64)  # sorted by unique()
    for eps in (1e-3, 0.0):
        h = value_rescale(x, eps)
        assert torch.all(torch.diff(h) > 0)
        assert torch.all(torch.diff(inverse_value_rescale(h, eps)) > 0)
        torch.testing.assert_close(value_rescale(-x, eps), -h, rtol=0, atol=0)
    zero = torch.zeros(3, 2)
    assert torch.equal(value_rescale(zero), zero)
    assert torch.equal(inverse_value_rescale(zero), zero)
    assert value_rescale(torch.randn(4, 5, 6)).shape == (4, 5, 6)
    # eps = 0 is the pure square-root squashing, with inverse (|x| + 1)^2 - 1.
    assert inverse_value_rescale(torch.tensor([3.0, -3.0]), eps=0.0).tolist() == [15.0, -15.0]
    assert value_rescale(torch.tensor([15.0, -15.0]), eps=0.0).tolist() == [3.0, -3.0]


def test_value_rescale_rejects_negative_eps():
    with pytest.raises(ValueError, match="eps=-0.1"):
        value_rescale(torch.ones(1), eps=-0.1)
    with pytest.raises(ValueError, match="eps=-0.1"):
        inverse_value_rescale(torch.ones(1), eps=-0.1)


# ----------------------------------------------------------------------------- priorities


@pytest.mark.parametrize("eta", [0.9, 0.0, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_sequence_priority_matches_loop(eta, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 9, 7
    td_abs = torch.rand(batch, length, generator=gen) * 5
    mask = torch.rand(batch, length, generator=gen) < 0.6
    mask[0] = False  # a row of pure padding
    mask[1] = True
    got = sequence_priority(td_abs, mask, eta)
    assert got.shape == (batch,)
    for b in range(batch):
        real = [float(td_abs[b, t]) for t in range(length) if mask[b, t]]
        expected = eta * max(real) + (1 - eta) * sum(real) / len(real) if real else 0.0
        assert got[b].item() == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_sequence_priority_ignores_padding_values():
    td_abs = torch.tensor([[1.0, 100.0, 3.0]])
    mask = torch.tensor([[True, False, True]])
    assert sequence_priority(td_abs, mask, 0.9).item() == pytest.approx(0.9 * 3 + 0.1 * 2)
    with pytest.raises(ValueError, match="eta=1.5"):
        sequence_priority(td_abs, mask, 1.5)
    with pytest.raises(ValueError, match="mask has shape"):
        sequence_priority(td_abs, mask[:, :2], 0.9)


# ----------------------------------------------------------------------------- n-step targets


def nstep_ref(reward, terminated, mask, boot_value, gamma, n):
    """The walk of the definition, one sequence and one start step at a time."""
    batch, length = len(reward), len(reward[0])
    out = [[0.0] * length for _ in range(batch)]
    for b in range(batch):
        for t in range(length):
            if not mask[b][t]:
                continue
            total, k, stopped_at_terminal = 0.0, 0, False
            for i in range(n):
                j = t + i
                if j >= length or not mask[b][j]:
                    break
                total += gamma**i * reward[b][j]
                k += 1
                if terminated[b][j]:
                    stopped_at_terminal = True
                    break
            if not stopped_at_terminal:
                total += gamma**k * boot_value[b][t + k]
            out[b][t] = total
    return out


def random_sequences(seed: int, batch: int, length: int, mask_kind: str) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    if mask_kind == "random":
        mask = torch.rand(batch, length, generator=gen) < 0.7
    else:
        for b in range(batch):
            front = int(torch.randint(length + 1, (1,), generator=gen))
            end = int(torch.randint(length - front + 1, (1,), generator=gen))
            if mask_kind == "front":
                end = 0
            elif mask_kind == "end":
                front = 0
            mask[b, front : length - end] = True
    return {
        "reward": torch.randn(batch, length, generator=gen),
        "terminated": torch.rand(batch, length, generator=gen) < 0.2,
        "mask": mask,
        "boot_value": torch.randn(batch, length + 1, generator=gen) * 10,
    }


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("length", [1, 5, 12])
@pytest.mark.parametrize("mask_kind", ["front", "end", "both", "random"])
@pytest.mark.parametrize("gamma", [0.97, 1.0, 0.0])
def test_nstep_targets_match_reference_loop(n, length, mask_kind, gamma):
    seed = 1000 * n + 10 * length + len(mask_kind)
    s = random_sequences(seed, batch=16, length=length, mask_kind=mask_kind)
    got = nstep_double_q_targets(s["reward"], s["terminated"], s["mask"], s["boot_value"], gamma, n)
    assert got.shape == (16, length) and got.dtype == torch.float32
    expected = nstep_ref(
        s["reward"].tolist(),
        s["terminated"].tolist(),
        s["mask"].tolist(),
        s["boot_value"].tolist(),
        gamma,
        n,
    )
    np.testing.assert_allclose(got.numpy(), np.array(expected), rtol=1e-5, atol=1e-5)


def test_nstep_targets_worked_example():
    gamma, n = 0.5, 5
    reward = torch.tensor([[1.0, 2.0, 3.0]] * 4)
    boot = torch.tensor([[10.0, 20.0, 30.0, 40.0]] * 4)
    terminated = torch.zeros(4, 3, dtype=torch.bool)
    terminated[1, 1] = True
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[2, 2] = False  # truncated after step 1: bootstrap from the observation at 2
    mask[3, 0] = False  # front padding
    got = nstep_double_q_targets(reward, terminated, mask, boot, gamma, n).tolist()
    assert got[0] == pytest.approx([1 + 1 + 0.75 + 0.125 * 40, 2 + 1.5 + 0.25 * 40, 3 + 0.5 * 40])
    assert got[1] == pytest.approx([1 + 1, 2, 3 + 0.5 * 40])  # terminal at 1: no bootstrap
    assert got[2] == pytest.approx([1 + 1 + 0.25 * 30, 2 + 0.5 * 30, 0.0])
    assert got[3] == pytest.approx([0.0, 2 + 1.5 + 0.25 * 40, 3 + 0.5 * 40])
    one = nstep_double_q_targets(reward, terminated, mask, boot, gamma, 1).tolist()
    assert one[0] == pytest.approx([1 + 0.5 * 20, 2 + 0.5 * 30, 3 + 0.5 * 40])
    assert one[1][1] == pytest.approx(2.0)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_targets_agree_with_flat_nstep_transitions(n):
    # Same convention as the Ape-X transitions: padding is an invalid step, which cuts the
    # walk like a truncation and bootstraps from the observation after the last real step.
    s = random_sequences(7 + n, batch=12, length=10, mask_kind="both")
    gamma = 0.9
    got = nstep_double_q_targets(s["reward"], s["terminated"], s["mask"], s["boot_value"], gamma, n)
    flat = nstep_transitions(
        s["reward"].numpy(),
        s["terminated"].numpy(),
        np.zeros((12, 10), dtype=bool),
        s["mask"].numpy(),
        n,
        gamma,
    )
    expected = flat.returns + flat.discounts * s["boot_value"].numpy()[flat.env, flat.end + 1]
    np.testing.assert_allclose(got.numpy()[flat.env, flat.start], expected, rtol=1e-5, atol=1e-5)
    assert int(s["mask"].sum()) == len(flat)
    assert torch.all(got[~s["mask"]] == 0)


def test_nstep_targets_reject_bad_inputs():
    reward = torch.zeros(2, 3)
    flags = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="boot_value has shape"):
        nstep_double_q_targets(reward, flags, flags, torch.zeros(2, 3), 0.9, 3)
    with pytest.raises(ValueError, match="n=0"):
        nstep_double_q_targets(reward, flags, flags, torch.zeros(2, 4), 0.9, 0)
    with pytest.raises(ValueError, match="gamma=1.5"):
        nstep_double_q_targets(reward, flags, flags, torch.zeros(2, 4), 1.5, 3)
    with pytest.raises(ValueError, match="terminated has shape"):
        nstep_double_q_targets(reward, flags[:, :2], flags, torch.zeros(2, 4), 0.9, 3)


# ----------------------------------------------------------------------------- loss


@pytest.mark.parametrize("seed", range(5))
def test_r2d2_loss_matches_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 6, 8
    q0 = torch.randn(batch, length, generator=gen)
    targets = torch.randn(batch, length, generator=gen)
    mask = torch.rand(batch, length, generator=gen) < 0.7
    mask[0] = False
    weights = torch.rand(batch, generator=gen) + 0.1
    q = q0.clone().requires_grad_(True)
    loss, td_abs = r2d2_loss(q, targets, mask, weights)

    ref_total = 0.0
    for b in range(batch):
        real = [t for t in range(length) if mask[b, t]]
        sq = sum(0.5 * (float(targets[b, t]) - float(q0[b, t])) ** 2 for t in real)
        ref_total += float(weights[b]) * sq / max(1, len(real))
    assert loss.item() == pytest.approx(ref_total / batch, rel=1e-5, abs=1e-7)
    assert not td_abs.requires_grad and td_abs.shape == (batch, length)
    expected_td = torch.where(mask, (targets - q0).abs(), 0.0)
    torch.testing.assert_close(td_abs, expected_td)

    # d loss / d q = -w_b * delta / (B * max(1, count_b)) at real steps, 0 at padding.
    loss.backward()
    for b in range(batch):
        count = max(1, int(mask[b].sum()))
        for t in range(length):
            delta = float(targets[b, t]) - float(q0[b, t])
            expected = -float(weights[b]) * delta / (batch * count) if mask[b, t] else 0.0
            assert q.grad[b, t].item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_r2d2_loss_padding_cannot_poison():
    q = torch.zeros(1, 3, requires_grad=True)
    targets = torch.tensor([[1.0, float("inf"), float("nan")]])
    mask = torch.tensor([[True, False, False]])
    loss, td_abs = r2d2_loss(q, targets, mask, torch.ones(1))
    loss.backward()
    assert loss.item() == pytest.approx(0.5)
    assert torch.isfinite(q.grad).all() and td_abs.tolist() == [[1.0, 0.0, 0.0]]


def test_r2d2_loss_rejects_targets_with_grad_and_bad_shapes():
    q = torch.zeros(2, 3, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="no_grad"):
        r2d2_loss(q, q * 2, mask, torch.ones(2))
    with pytest.raises(ValueError, match="weights has shape"):
        r2d2_loss(q, torch.zeros(2, 3), mask, torch.ones(3))
    with pytest.raises(ValueError, match="train_mask has shape"):
        r2d2_loss(q, torch.zeros(2, 3), mask[:, :1], torch.ones(2))


# ----------------------------------------------------------------------------- burn-in


class ToyRecurrentQ(nn.Module):
    """LSTMCell over time with a linear Q head; state is ``[h, c]`` concatenated, ``[B, 2H]``."""

    def __init__(self, obs_dim: int = 3, hidden: int = 8, num_actions: int = 4) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(obs_dim, hidden)
        self.head = nn.Linear(hidden, num_actions)

    def unroll(self, obs: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        h, c = state.split(self.hidden, dim=1)
        qs = []
        for t in range(obs.shape[1]):
            keep = (~first[:, t]).unsqueeze(1).to(obs.dtype)  # a new episode starts from zeros
            h, c = self.cell(obs[:, t], (h * keep, c * keep))
            qs.append(self.head(h))
        return torch.stack(qs, dim=1), torch.cat([h, c], dim=1)


def burn_in_inputs(
    batch: int = 3, horizon: int = 7
) -> tuple[ToyRecurrentQ, Tensor, Tensor, Tensor]:
    torch.manual_seed(0)
    net = ToyRecurrentQ()
    obs = torch.randn(batch, horizon, 3, requires_grad=True)
    state = torch.randn(batch, 2 * net.hidden, requires_grad=True)
    first = torch.zeros(batch, horizon, dtype=torch.bool)
    first[1, 2] = True  # an episode starts inside the burn-in
    first[2, 5] = True  # and one inside the trained part
    return net, obs, state, first


@pytest.mark.parametrize("burn_in", [0, 1, 4, 6])
def test_burn_in_equals_full_unroll(burn_in):
    net, obs, state, first = burn_in_inputs()
    q_burn, q_train = burn_in_unroll(net.unroll, obs, state, first, burn_in)
    assert q_burn.shape == (3, burn_in, 4) and q_train.shape == (3, 7 - burn_in, 4)
    assert not q_burn.requires_grad and q_train.requires_grad
    with torch.no_grad():
        q_full, _ = net.unroll(obs, state, first)
    torch.testing.assert_close(torch.cat([q_burn, q_train], dim=1), q_full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("burn_in", [0, 1, 4])
def test_burn_in_blocks_gradient_into_burn_in_steps(burn_in):
    net, obs, state, first = burn_in_inputs()
    _, q_train = burn_in_unroll(net.unroll, obs, state, first, burn_in)
    q_train.square().sum().backward()
    assert obs.grad is not None
    per_step = obs.grad.abs().sum(dim=(0, 2))
    assert torch.all(per_step[:burn_in] == 0)
    assert torch.all(per_step[burn_in:] > 0)
    assert state.grad is None  # the replayed state is data, never trained into
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


@pytest.mark.parametrize("burn_in", [0, 3])
def test_burn_in_runs_no_grad_pass_only_when_asked(burn_in):
    net, obs, state, first = burn_in_inputs()
    calls: list[tuple[int, bool]] = []

    def recording(o: Tensor, s: Tensor, f: Tensor) -> tuple[Tensor, Tensor]:
        calls.append((o.shape[1], torch.is_grad_enabled()))
        return net.unroll(o, s, f)

    burn_in_unroll(recording, obs, state, first, burn_in)
    expected = [(7, True)] if burn_in == 0 else [(burn_in, False), (7 - burn_in, True)]
    assert calls == expected


def test_burn_in_rejects_bad_burn_in():
    net, obs, state, first = burn_in_inputs()
    for bad in (-1, 7, 8):
        with pytest.raises(ValueError, match=f"burn_in={bad}"):
            burn_in_unroll(net.unroll, obs, state, first, bad)
    with pytest.raises(ValueError, match="first has shape"):
        burn_in_unroll(net.unroll, obs, state, first[:, :3], 1)
