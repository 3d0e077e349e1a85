"""V-trace and the IMPALA loss vs. plain-loop references written from the paper's definitions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.algos.impala.losses import impala_loss
from zrl.algos.kernel.returns import discounted_returns
from zrl.algos.kernel.vtrace import VTraceReturns, vtrace
from zrl.nets.gaussian import categorical_entropy

torch.set_num_threads(1)
SETTINGS = settings(max_examples=60, deadline=None)

thresholds = st.sampled_from([0.5, 1.0, 2.0, math.inf])


@st.composite
def trajectories(draw: st.DrawFn, on_policy: bool = False) -> dict[str, torch.Tensor]:
    """Time-major [T, B] float64 batches; ratios pi/mu roughly in [0.1, 10]."""
    horizon, batch = draw(st.integers(1, 8)), draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    p_done = draw(st.sampled_from([0.0, 0.2, 0.5]))
    shape = (horizon, batch)
    dones = torch.rand(shape, generator=gen, dtype=torch.float64) < p_done
    behaviour = torch.log(torch.rand(shape, generator=gen, dtype=torch.float64) * 0.9 + 0.1)
    target = (
        behaviour
        if on_policy
        else behaviour + torch.randn(shape, generator=gen, dtype=torch.float64)
    )
    return {
        "behaviour_logp": behaviour,
        "target_logp": target,
        "rewards": torch.randn(shape, generator=gen, dtype=torch.float64),
        "discounts": gamma * (~dones).to(torch.float64),
        "values": torch.randn(shape, generator=gen, dtype=torch.float64),
        "bootstrap_value": torch.randn(batch, generator=gen, dtype=torch.float64),
    }


def vtrace_reference(tr, rho_bar, c_bar, pg_rho_bar, lam=1.0):
    """Eq. (1) summed explicitly (no recursion), per trajectory and start step s:

    v_s = V_s + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) rho_t (r_t + gamma_t V_{t+1} - V_t)
    A_s = min(pg_rho_bar, ratio_s) (r_s + gamma_s v_{s+1} - V_s), with V_T = v_T = bootstrap,
    and c_i = lam * min(c_bar, ratio_i).
    """
    b_logp, t_logp = tr["behaviour_logp"].tolist(), tr["target_logp"].tolist()
    rewards, discounts = tr["rewards"].tolist(), tr["discounts"].tolist()
    values, boot = tr["values"].tolist(), tr["bootstrap_value"].tolist()
    horizon, batch = len(rewards), len(boot)
    vs = [[0.0] * batch for _ in range(horizon)]
    adv = [[0.0] * batch for _ in range(horizon)]
    for b in range(batch):

        def value(t: int, b: int = b) -> float:
            return boot[b] if t == horizon else values[t][b]

        def ratio(t: int, b: int = b) -> float:
            return math.exp(t_logp[t][b] - b_logp[t][b])

        for s in range(horizon):
            total = 0.0
            for t in range(s, horizon):
                trace = 1.0
                for i in range(s, t):
                    trace *= discounts[i][b] * lam * min(c_bar, ratio(i))
                rho = min(rho_bar, ratio(t))
                total += trace * rho * (rewards[t][b] + discounts[t][b] * value(t + 1) - value(t))
            vs[s][b] = value(s) + total
        for s in range(horizon):
            next_vs = boot[b] if s == horizon - 1 else vs[s + 1][b]
            pg_rho = min(rho_bar if pg_rho_bar is None else pg_rho_bar, ratio(s))
            adv[s][b] = pg_rho * (rewards[s][b] + discounts[s][b] * next_vs - value(s))
    return np.array(vs), np.array(adv)


# ----------------------------------------------------------------------------- vtrace


@SETTINGS
@given(
    tr=trajectories(),
    rho_bar=thresholds,
    c_bar=thresholds,
    pg_rho_bar=st.one_of(st.none(), thresholds),
    lam=st.sampled_from([1.0, 0.9, 0.5, 0.0]),
)
def test_vtrace_matches_reference(tr, rho_bar, c_bar, pg_rho_bar, lam):
    out = vtrace(**tr, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lam)
    ref_vs, ref_adv = vtrace_reference(tr, rho_bar, c_bar, pg_rho_bar, lam)
    assert isinstance(out, VTraceReturns)
    assert out.vs.shape == out.pg_advantages.shape == tr["rewards"].shape
    assert out.vs.dtype == out.pg_advantages.dtype == torch.float64
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(tr=trajectories(on_policy=True), rho_bar=st.sampled_from([1.0, 2.0, math.inf]))
def test_vtrace_on_policy_is_nstep_return(tr, rho_bar):
    out = vtrace(**tr, rho_bar=rho_bar, c_bar=rho_bar)
    # discounts = gamma * (1 - done); recover gamma and dones for the [E, T] numpy version.
    disc = tr["discounts"].numpy()
    gamma = float(disc.max()) if disc.max() > 0 else 0.0
    dones = disc == 0.0
    expected = discounted_returns(
        tr["rewards"].numpy().T, dones.T, tr["bootstrap_value"].numpy(), gamma
    ).T
    np.testing.assert_allclose(out.vs.numpy(), expected, rtol=1e-5, atol=1e-5)
    # pg advantage on-policy: r_s + gamma_s v_{s+1} - V(x_s).
    next_vs = torch.cat([out.vs[1:], tr["bootstrap_value"][None]])
    td = tr["rewards"] + tr["discounts"] * next_vs - tr["values"]
    torch.testing.assert_close(out.pg_advantages, td)


def test_vtrace_hand_example():
    # T=2, B=1, ratio 2 at t=0 and 0.5 at t=1; rho_bar = c_bar = 1 -> rho = c = (1, 0.5).
    b_logp = torch.log(torch.tensor([[0.25], [0.5]], dtype=torch.float64))
    t_logp = torch.log(torch.tensor([[0.5], [0.25]], dtype=torch.float64))
    rewards = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    discounts = torch.tensor([[0.5], [0.5]], dtype=torch.float64)
    values = torch.tensor([[3.0], [4.0]], dtype=torch.float64)
    boot = torch.tensor([6.0], dtype=torch.float64)
    out = vtrace(b_logp, t_logp, rewards, discounts, values, boot)
    d0 = 1.0 * (1 + 0.5 * 4 - 3)  # 0
    d1 = 0.5 * (2 + 0.5 * 6 - 4)  # 0.5
    v1 = 4 + d1  # 4.5
    v0 = 3 + d0 + 0.5 * 1.0 * d1  # 3.25
    np.testing.assert_allclose(out.vs.numpy(), [[v0], [v1]])
    np.testing.assert_allclose(
        out.pg_advantages.numpy(), [[1.0 * (1 + 0.5 * v1 - 3)], [0.5 * (2 + 0.5 * 6 - 4)]]
    )


def big_ratio_batch(horizon: int, ratio: float) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    behaviour = torch.full((horizon, 2), math.log(0.05), dtype=torch.float64)
    return {
        "behaviour_logp": behaviour,
        "target_logp": behaviour + math.log(ratio),
        "rewards": torch.randn(horizon, 2, generator=gen, dtype=torch.float64),
        "discounts": torch.full((horizon, 2), 0.9, dtype=torch.float64),
        "values": torch.randn(horizon, 2, generator=gen, dtype=torch.float64),
        "bootstrap_value": torch.randn(2, generator=gen, dtype=torch.float64),
    }


def test_vtrace_clipping_clips_large_ratios():
    tr = big_ratio_batch(horizon=4, ratio=10.0)
    on_policy = {**tr, "target_logp": tr["behaviour_logp"]}
    clipped = vtrace(**tr, rho_bar=1.0, c_bar=1.0)
    # Every ratio (10) is above the thresholds, so the result is the on-policy one.
    same = vtrace(**on_policy, rho_bar=1.0, c_bar=1.0)
    torch.testing.assert_close(clipped.vs, same.vs)
    torch.testing.assert_close(clipped.pg_advantages, same.pg_advantages)
    # Without clipping the ratio 10 is used in full.
    raw = vtrace(**tr, rho_bar=math.inf, c_bar=math.inf)
    assert not torch.allclose(raw.vs, clipped.vs)
    last_td = tr["rewards"][-1] + 0.9 * tr["bootstrap_value"] - tr["values"][-1]
    torch.testing.assert_close(raw.vs[-1], tr["values"][-1] + 10.0 * last_td)
    torch.testing.assert_close(raw.pg_advantages[-1], 10.0 * last_td)


def test_vtrace_thresholds_act_separately():
    tr = big_ratio_batch(horizon=2, ratio=10.0)
    r, g, v, boot = tr["rewards"], 0.9, tr["values"], tr["bootstrap_value"]
    d0 = r[0] + g * v[1] - v[0]
    d1 = r[1] + g * boot - v[1]
    # c_bar only limits the trace: v_0 = V_0 + rho_0 d_0 + g c_0 rho_1 d_1.
    out = vtrace(**tr, rho_bar=math.inf, c_bar=1.0)
    torch.testing.assert_close(out.vs[0], v[0] + 10 * d0 + g * 1.0 * 10 * d1)
    # rho_bar limits the TD terms but not the trace.
    out = vtrace(**tr, rho_bar=2.0, c_bar=math.inf)
    torch.testing.assert_close(out.vs[0], v[0] + 2 * d0 + g * 10.0 * 2 * d1)
    # pg_rho_bar clips only the policy-gradient weight; None falls back to rho_bar.
    out = vtrace(**tr, rho_bar=math.inf, c_bar=math.inf, pg_rho_bar=3.0)
    torch.testing.assert_close(out.pg_advantages[1], 3.0 * d1)
    torch.testing.assert_close(out.vs[1], v[1] + 10.0 * d1)
    out = vtrace(**tr, rho_bar=2.0, c_bar=math.inf)
    torch.testing.assert_close(out.pg_advantages[1], 2.0 * d1)


def test_vtrace_episode_end_cuts_the_trace():
    tr = big_ratio_batch(horizon=3, ratio=1.0)
    tr["discounts"][1] = 0.0  # episode ends at t=1
    out = vtrace(**tr)
    r, v = tr["rewards"], tr["values"]
    torch.testing.assert_close(out.vs[1], r[1])  # nothing bootstrapped past the end
    torch.testing.assert_close(out.vs[0], r[0] + 0.9 * r[1])
    torch.testing.assert_close(out.pg_advantages[1], r[1] - v[1])


def test_vtrace_is_detached_and_keeps_float32():
    tr: dict[str, Any] = {k: v.float() for k, v in big_ratio_batch(horizon=3, ratio=1.5).items()}
    tr["values"].requires_grad_(True)
    tr["target_logp"].requires_grad_(True)
    out = vtrace(**tr)
    assert out.vs.dtype == out.pg_advantages.dtype == torch.float32
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    ref = vtrace(**{k: v.detach().double() for k, v in tr.items()})
    torch.testing.assert_close(out.vs.double(), ref.vs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"values": torch.zeros(3, 3)}, "values"),
        ({"discounts": torch.zeros(3)}, "discounts"),
        ({"target_logp": torch.zeros(2, 2)}, "target_logp"),
        ({"behaviour_logp": torch.zeros(3, 2, 1)}, "behaviour_logp"),
        ({"bootstrap_value": torch.zeros(3)}, "bootstrap_value"),
        ({"bootstrap_value": torch.zeros(1, 2)}, "bootstrap_value"),
        ({"rewards": torch.zeros(6)}, "rewards"),
        ({"rho_bar": 0.0}, "rho_bar=0.0"),
        ({"c_bar": -1.0}, "c_bar=-1.0"),
        ({"c_bar": math.nan}, "c_bar=nan"),
        ({"pg_rho_bar": 0.0}, "pg_rho_bar=0.0"),
        ({"lambda_": 1.5}, "lambda_=1.5"),
        ({"lambda_": -0.1}, "lambda_=-0.1"),
        ({"lambda_": math.nan}, "lambda_=nan"),
    ],
)
def test_vtrace_validation(kwargs, match):
    args: dict[str, Any] = {
        "behaviour_logp": torch.zeros(3, 2),
        "target_logp": torch.zeros(3, 2),
        "rewards": torch.zeros(3, 2),
        "discounts": torch.zeros(3, 2),
        "values": torch.zeros(3, 2),
        "bootstrap_value": torch.zeros(2),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        vtrace(**args)


# ----------------------------------------------------------------------------- impala loss


@st.composite
def impala_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    horizon, batch, num_actions = (
        draw(st.integers(1, 5)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
    )
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = (horizon, batch)
    return {
        "logits": torch.randn(*shape, num_actions, generator=gen, dtype=torch.float64) * 2,
        "values": torch.randn(shape, generator=gen, dtype=torch.float64),
        "actions": torch.randint(num_actions, shape, generator=gen),
        "vs": torch.randn(shape, generator=gen, dtype=torch.float64),
        "pg_adv": torch.randn(shape, generator=gen, dtype=torch.float64),
    }


@SETTINGS
@given(
    b=impala_batches(),
    entropy_coef=st.sampled_from([0.0, 0.01, 0.5]),
    value_coef=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_impala_loss_matches_per_sample_reference(b, entropy_coef, value_coef):
    logits = b["logits"].clone().requires_grad_(True)
    values = b["values"].clone().requires_grad_(True)
    returns = VTraceReturns(vs=b["vs"], pg_advantages=b["pg_adv"])
    loss, parts = impala_loss(logits, values, b["actions"], returns, entropy_coef, value_coef)
    loss.backward()
    assert logits.grad is not None and values.grad is not None

    horizon, batch, num_actions = b["logits"].shape
    n = horizon * batch
    pg = vl = ent = 0.0
    for t in range(horizon):
        for j in range(batch):
            z = b["logits"][t, j].tolist()
            m = max(z)
            log_norm = m + math.log(sum(math.exp(x - m) for x in z))
            logp = [x - log_norm for x in z]
            p = [math.exp(x) for x in logp]
            h = -sum(pk * lk for pk, lk in zip(p, logp, strict=True))
            a = int(b["actions"][t, j])
            adv, vs, v = float(b["pg_adv"][t, j]), float(b["vs"][t, j]), float(b["values"][t, j])
            pg += -logp[a] * adv
            vl += 0.5 * (vs - v) ** 2
            ent += h
            # d loss / d z_k = -(adv / n) (1[k=a] - p_k) + (entropy_coef / n) p_k (log p_k + H)
            for k in range(num_actions):
                expected = -(adv / n) * ((k == a) - p[k]) + entropy_coef / n * p[k] * (logp[k] + h)
                assert logits.grad[t, j, k].item() == pytest.approx(expected, abs=1e-10)
            # d loss / d V = -value_coef (v_s - V) / n
            assert values.grad[t, j].item() == pytest.approx(-value_coef * (vs - v) / n, abs=1e-10)
    pg, vl, ent = pg / n, vl / n, ent / n
    assert float(parts["policy_loss"]) == pytest.approx(pg, abs=1e-10)
    assert float(parts["value_loss"]) == pytest.approx(vl, abs=1e-10)
    assert float(parts["entropy"]) == pytest.approx(ent, abs=1e-10)
    total = pg + value_coef * vl - entropy_coef * ent
    assert float(parts["loss"]) == pytest.approx(total, abs=1e-10)
    assert loss.item() == pytest.approx(total, abs=1e-10)


def test_impala_loss_gradient_signs():
    # One step, two actions, action 0 taken with a positive advantage; V below its target.
    logits = torch.zeros(1, 1, 2, requires_grad=True)
    values = torch.zeros(1, 1, requires_grad=True)
    returns = VTraceReturns(vs=torch.ones(1, 1), pg_advantages=torch.ones(1, 1))
    loss, _ = impala_loss(logits, values, torch.zeros(1, 1, dtype=torch.long), returns, 0.0, 1.0)
    loss.backward()
    assert logits.grad is not None and values.grad is not None
    assert logits.grad[0, 0, 0] < 0 < logits.grad[0, 0, 1]  # descent raises pi(a_taken)
    assert values.grad.item() < 0  # descent raises V towards v_s
    # A negative advantage pushes the other way.
    logits.grad = None
    returns = VTraceReturns(vs=torch.ones(1, 1), pg_advantages=-torch.ones(1, 1))
    loss, _ = impala_loss(logits, values, torch.zeros(1, 1, dtype=torch.long), returns, 0.0, 1.0)
    loss.backward()
    assert logits.grad is not None
    assert logits.grad[0, 0, 0] > 0 > logits.grad[0, 0, 1]
    # The entropy bonus alone pulls a peaked policy towards uniform.
    peaked = torch.tensor([[[2.0, 0.0]]], requires_grad=True)
    zero = VTraceReturns(vs=torch.zeros(1, 1), pg_advantages=torch.zeros(1, 1))
    loss, _ = impala_loss(
        peaked, torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.long), zero, 1.0, 0.0
    )
    loss.backward()
    assert peaked.grad is not None
    assert peaked.grad[0, 0, 0] > 0 > peaked.grad[0, 0, 1]


def test_impala_loss_with_vtrace_end_to_end():
    tr = big_ratio_batch(horizon=4, ratio=2.0)
    out = vtrace(**tr)
    logits = torch.zeros(4, 2, 3, dtype=torch.float64, requires_grad=True)
    values = tr["values"].clone().requires_grad_(True)
    loss, parts = impala_loss(logits, values, torch.zeros(4, 2, dtype=torch.long), out, 0.01, 0.5)
    loss.backward()
    assert set(parts) == {"loss", "policy_loss", "value_loss", "entropy"}
    assert float(parts["entropy"]) == pytest.approx(math.log(3))
    # Detached 0-d tensors: nothing read back to the host until a report asks.
    assert all(v.dim() == 0 and not v.requires_grad for v in parts.values())
    assert tr["values"].grad is None  # vtrace inputs are not part of the graph


def test_categorical_entropy_masked_actions():
    logits = torch.tensor([[0.0, 0.0, -math.inf]], requires_grad=True)
    h = categorical_entropy(logits)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_impala_loss_validation():
    logits = torch.zeros(3, 2, 4)
    values = torch.zeros(3, 2)
    actions = torch.zeros(3, 2, dtype=torch.long)
    ok = VTraceReturns(vs=torch.zeros(3, 2), pg_advantages=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="require grad"):
        bad = VTraceReturns(vs=torch.zeros(3, 2, requires_grad=True), pg_advantages=ok.vs)
        impala_loss(logits, values, actions, bad, 0.01, 0.5)
    with pytest.raises(ValueError, match="logits"):
        impala_loss(torch.zeros(3, 2), values, actions, ok, 0.01, 0.5)
    with pytest.raises(ValueError, match="values"):
        impala_loss(logits, torch.zeros(3, 2, 1), actions, ok, 0.01, 0.5)
    with pytest.raises(ValueError, match="actions"):
        impala_loss(logits, values, torch.zeros(2, 3, dtype=torch.long), ok, 0.01, 0.5)
    with pytest.raises(ValueError, match="pg_advantages"):
        short = VTraceReturns(vs=ok.vs, pg_advantages=torch.zeros(2, 2))
        impala_loss(logits, values, actions, short, 0.01, 0.5)
    with pytest.raises(ValueError, match="entropy_coef=-0.1"):
        impala_loss(logits, values, actions, ok, -0.1, 0.5)
    with pytest.raises(ValueError, match="value_coef=inf"):
        impala_loss(logits, values, actions, ok, 0.01, math.inf)
