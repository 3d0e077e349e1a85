"""PPO / A2C losses vs. per-sample references, and the cross-worker gradient reduction."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zrl.algos.kernel.policy_gradient import a2c_loss, normalize, ppo_loss, reduce_gradients

torch.set_num_threads(1)
SETTINGS = settings(max_examples=60, deadline=None)
F64 = torch.float64


@st.composite
def ppo_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    n = draw(st.integers(1, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old_logp = torch.log(torch.rand(n, generator=gen, dtype=F64) * 0.9 + 0.1)
    old_values = torch.randn(n, generator=gen, dtype=F64)
    return {
        "new_logp": old_logp + 0.4 * torch.randn(n, generator=gen, dtype=F64),
        "old_logp": old_logp,
        "advantages": torch.randn(n, generator=gen, dtype=F64),
        "new_values": old_values + 0.5 * torch.randn(n, generator=gen, dtype=F64),
        "old_values": old_values,
        "returns": torch.randn(n, generator=gen, dtype=F64),
        "entropy": torch.rand(n, generator=gen, dtype=F64),
    }


def normalize_reference(adv: list[float]) -> list[float]:
    n = len(adv)
    if n == 1:
        return adv
    mean = sum(adv) / n
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))
    return [(a - mean) / (std + 1e-8) for a in adv]


def ppo_reference(b, clip, value_clip, entropy_coef, value_coef, normalize_advantages):
    """Per-sample L^CLIP = min(r A, clip(r, 1-eps, 1+eps) A), PPO2 value clipping, and the
    analytic gradients of the loss wrt new_logp and new_values."""
    new_logp, old_logp = b["new_logp"].tolist(), b["old_logp"].tolist()
    adv = b["advantages"].tolist()
    if normalize_advantages:
        adv = normalize_reference(adv)
    v, v_old, ret = b["new_values"].tolist(), b["old_values"].tolist(), b["returns"].tolist()
    n = len(adv)
    pg = vl = kl = clipped = 0.0
    grad_logp, grad_v = [], []
    for i in range(n):
        r = math.exp(new_logp[i] - old_logp[i])
        unclipped_obj = r * adv[i]
        clipped_obj = min(max(r, 1 - clip), 1 + clip) * adv[i]
        pg -= min(unclipped_obj, clipped_obj)
        # d(-r A)/d logp = -r A where the unclipped term is the min, else 0 (clip is constant).
        grad_logp.append(-unclipped_obj / n if unclipped_obj <= clipped_obj else 0.0)
        err = (v[i] - ret[i]) ** 2
        if value_clip is None:
            vl += 0.5 * err
            grad_v.append(value_coef * (v[i] - ret[i]) / n)
        else:
            v_clip = v_old[i] + min(max(v[i] - v_old[i], -value_clip), value_clip)
            err_clip = (v_clip - ret[i]) ** 2
            vl += 0.5 * max(err, err_clip)
            inside = abs(v[i] - v_old[i]) < value_clip
            if err >= err_clip or inside:
                grad_v.append(value_coef * (v[i] - ret[i]) / n)
            else:
                grad_v.append(0.0)
        kl += (r - 1) - math.log(r)
        clipped += abs(r - 1) > clip
    pg, vl = pg / n, vl / n
    ent = sum(b["entropy"].tolist()) / n
    return {
        "loss": pg + value_coef * vl - entropy_coef * ent,
        "policy_loss": pg,
        "value_loss": vl,
        "entropy": ent,
        "approx_kl": kl / n,
        "clip_fraction": clipped / n,
        "grad_logp": grad_logp,
        "grad_v": grad_v,
    }


def with_grads(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in b.items()}
    for k in ("new_logp", "new_values", "entropy"):
        out[k].requires_grad_(True)
    return out


# ----------------------------------------------------------------------------- ppo


@SETTINGS
@given(
    b=ppo_batches(),
    clip=st.sampled_from([0.1, 0.2, 0.3]),
    value_clip=st.sampled_from([None, 0.2, 1.0]),
    entropy_coef=st.sampled_from([0.0, 0.01]),
    value_coef=st.sampled_from([0.5, 1.0]),
    normalize_advantages=st.booleans(),
)
def test_ppo_loss_matches_per_sample_reference(
    b, clip, value_clip, entropy_coef, value_coef, normalize_advantages
):
    t = with_grads(b)
    loss, parts = ppo_loss(
        **t,
        clip=clip,
        value_clip=value_clip,
        entropy_coef=entropy_coef,
        value_coef=value_coef,
        normalize_advantages=normalize_advantages,
    )
    ref = ppo_reference(b, clip, value_clip, entropy_coef, value_coef, normalize_advantages)
    for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        assert parts[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-9), key
    assert loss.item() == pytest.approx(ref["loss"], rel=1e-9, abs=1e-9)
    loss.backward()
    assert t["new_logp"].grad is not None and t["new_values"].grad is not None
    assert t["entropy"].grad is not None
    np.testing.assert_allclose(t["new_logp"].grad.numpy(), ref["grad_logp"], atol=1e-9)
    np.testing.assert_allclose(t["new_values"].grad.numpy(), ref["grad_v"], atol=1e-9)
    n = len(b["entropy"])
    np.testing.assert_allclose(t["entropy"].grad.numpy(), np.full(n, -entropy_coef / n))


def ppo_policy_only(new_logp, old_logp, advantages, clip=0.2):
    n = len(new_logp)
    zeros = torch.zeros(n, dtype=F64)
    return ppo_loss(
        new_logp,
        old_logp,
        advantages,
        zeros,
        zeros,
        zeros,
        zeros,
        clip=clip,
        value_clip=None,
        entropy_coef=0.0,
        value_coef=0.0,
        normalize_advantages=False,
    )


def test_ppo_unclipped_region_is_plain_surrogate():
    ratios = torch.tensor([0.85, 0.95, 1.0, 1.1, 1.19], dtype=F64)
    adv = torch.tensor([1.0, -2.0, 0.5, -0.3, 3.0], dtype=F64)
    old_logp = torch.log(torch.full((5,), 0.4, dtype=F64))
    new_logp = (old_logp + ratios.log()).requires_grad_(True)
    loss, parts = ppo_policy_only(new_logp, old_logp, adv)
    expected = -(ratios * adv).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert parts["clip_fraction"] == 0.0
    loss.backward()
    assert new_logp.grad is not None
    torch.testing.assert_close(new_logp.grad, -(ratios * adv) / 5)


def test_ppo_clipped_region_has_zero_gradient():
    # ratio above 1+eps with A > 0 and below 1-eps with A < 0: the clipped term is the min,
    # so these samples push no gradient. The other two stay unclipped (pessimistic bound).
    ratios = torch.tensor([1.5, 0.5, 1.5, 0.5], dtype=F64)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=F64)
    old_logp = torch.zeros(4, dtype=F64)
    new_logp = ratios.log().requires_grad_(True)
    loss, parts = ppo_policy_only(new_logp, old_logp, adv)
    loss.backward()
    grad = new_logp.grad
    assert grad is not None
    assert grad[0].item() == 0.0 and grad[1].item() == 0.0
    assert grad[2].item() == pytest.approx(1.5 / 4) and grad[3].item() == pytest.approx(-0.5 / 4)
    expected = -(1.2 * 1.0 + 0.8 * -1.0 + 1.5 * -1.0 + 0.5 * 1.0) / 4
    assert loss.item() == pytest.approx(expected)
    assert parts["clip_fraction"] == 1.0
    assert parts["approx_kl"] == pytest.approx(
        np.mean([(r - 1) - math.log(r) for r in (1.5, 0.5, 1.5, 0.5)])
    )


def test_ppo_value_clipping_formula():
    zeros = torch.zeros(3, dtype=F64)
    old_v = torch.tensor([0.0, 0.0, 0.0], dtype=F64)
    new_v = torch.tensor([1.0, 1.0, 0.1], dtype=F64, requires_grad=True)
    returns = torch.tensor([2.0, -1.0, 1.0], dtype=F64)
    loss, parts = ppo_loss(
        zeros,
        zeros,
        zeros,
        new_v,
        old_v,
        returns,
        zeros,
        clip=0.2,
        value_clip=0.5,
        entropy_coef=0.0,
        value_coef=1.0,
        normalize_advantages=False,
    )
    # sample 0: unclipped (1-2)^2=1, clipped (0.5-2)^2=2.25 -> 2.25, no gradient (clip const)
    # sample 1: unclipped (1+1)^2=4, clipped (0.5+1)^2=2.25 -> 4, gradient 2 * (1 + 1) / 2 / 3
    # sample 2: inside the clip range, both equal (0.1-1)^2=0.81
    expected = 0.5 * (2.25 + 4.0 + 0.81) / 3
    assert parts["value_loss"] == pytest.approx(expected)
    loss.backward()
    assert new_v.grad is not None
    np.testing.assert_allclose(new_v.grad.numpy(), [0.0, 2.0 / 3, -0.9 / 3])
    _, unclipped = ppo_loss(
        zeros,
        zeros,
        zeros,
        new_v,
        old_v,
        returns,
        zeros,
        clip=0.2,
        value_clip=None,
        entropy_coef=0.0,
        value_coef=1.0,
        normalize_advantages=False,
    )
    assert unclipped["value_loss"] == pytest.approx(0.5 * (1.0 + 4.0 + 0.81) / 3)


def test_ppo_normalizes_advantages():
    old_logp = torch.zeros(4, dtype=F64)
    new_logp = torch.full((4,), math.log(1.1), dtype=F64)
    adv = torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=F64)
    _, parts = ppo_policy_only(new_logp, old_logp, adv)
    n = len(adv)
    zeros = torch.zeros(n, dtype=F64)
    _, normed = ppo_loss(
        new_logp,
        old_logp,
        adv,
        zeros,
        zeros,
        zeros,
        zeros,
        clip=0.2,
        value_clip=None,
        entropy_coef=0.0,
        value_coef=0.0,
    )
    assert parts["policy_loss"] == pytest.approx(-1.1 * 4.0)
    # Normalized advantages have zero mean, so a constant ratio gives zero loss.
    assert normed["policy_loss"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(normalize(adv).numpy(), normalize_reference(adv.tolist()))
    single = torch.tensor([5.0], dtype=F64)
    assert normalize(single).tolist() == [5.0]  # std undefined: left as is, no NaN


def test_ppo_constants_get_no_gradient():
    gen = torch.Generator().manual_seed(0)
    b: dict[str, Any] = {
        k: torch.randn(6, generator=gen, dtype=F64).requires_grad_(True)
        for k in ("new_logp", "old_logp", "advantages", "new_values", "old_values", "returns")
    }
    b["entropy"] = torch.rand(6, generator=gen, dtype=F64)
    loss, _ = ppo_loss(**b, clip=0.2, value_clip=0.2, entropy_coef=0.01, value_coef=0.5)
    loss.backward()
    for k in ("old_logp", "advantages", "old_values", "returns"):
        assert b[k].grad is None, k
    assert b["new_logp"].grad is not None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"old_logp": torch.zeros(5)}, "old_logp"),
        ({"advantages": torch.zeros(4, 1)}, "advantages"),
        ({"new_values": torch.zeros(4, 1)}, "old_values"),
        ({"returns": torch.zeros(3)}, "returns"),
        ({"clip": 0.0}, "clip=0.0"),
        ({"value_clip": -0.1}, "value_clip=-0.1"),
        ({"entropy_coef": -1.0}, "entropy_coef=-1.0"),
        ({"value_coef": math.nan}, "value_coef=nan"),
    ],
)
def test_ppo_validation(kwargs, match):
    args: dict[str, Any] = {
        "new_logp": torch.zeros(4),
        "old_logp": torch.zeros(4),
        "advantages": torch.zeros(4),
        "new_values": torch.zeros(4),
        "old_values": torch.zeros(4),
        "returns": torch.zeros(4),
        "entropy": torch.zeros(4),
        "clip": 0.2,
        "value_clip": 0.2,
        "entropy_coef": 0.01,
        "value_coef": 0.5,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ppo_loss(**args)


# ----------------------------------------------------------------------------- a2c


@SETTINGS
@given(
    b=ppo_batches(),
    entropy_coef=st.sampled_from([0.0, 0.01, 0.5]),
    value_coef=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_a2c_loss_matches_per_sample_reference(b, entropy_coef, value_coef):
    logp = b["new_logp"].clone().requires_grad_(True)
    values = b["new_values"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    returns = b["returns"]
    # Advantages from the same forward pass: must not leak gradient into the critic.
    advantages = returns - values
    loss, parts = a2c_loss(logp, values, returns, advantages, entropy, entropy_coef, value_coef)
    n = len(returns)
    lp, v, ret, h = logp.tolist(), b["new_values"].tolist(), returns.tolist(), entropy.tolist()
    adv = [ret[i] - v[i] for i in range(n)]
    pg = -sum(lp[i] * adv[i] for i in range(n)) / n
    vl = sum(0.5 * (ret[i] - v[i]) ** 2 for i in range(n)) / n
    ent = sum(h) / n
    total = pg + value_coef * vl - entropy_coef * ent
    assert parts["policy_loss"] == pytest.approx(pg, rel=1e-9, abs=1e-12)
    assert parts["value_loss"] == pytest.approx(vl, rel=1e-9, abs=1e-12)
    assert parts["entropy"] == pytest.approx(ent, rel=1e-9)
    assert parts["loss"] == pytest.approx(total, rel=1e-9, abs=1e-12)
    assert loss.item() == pytest.approx(total, rel=1e-9, abs=1e-12)
    loss.backward()
    assert logp.grad is not None and values.grad is not None and entropy.grad is not None
    np.testing.assert_allclose(logp.grad.numpy(), [-a / n for a in adv], atol=1e-12)
    np.testing.assert_allclose(
        values.grad.numpy(), [value_coef * (v[i] - ret[i]) / n for i in range(n)], atol=1e-12
    )
    np.testing.assert_allclose(entropy.grad.numpy(), np.full(n, -entropy_coef / n))


def test_a2c_gradient_signs_and_validation():
    logp = torch.zeros(1, requires_grad=True)
    values = torch.zeros(1, requires_grad=True)
    loss, _ = a2c_loss(logp, values, torch.ones(1), torch.ones(1), torch.zeros(1), 0.0, 0.5)
    loss.backward()
    assert logp.grad is not None and values.grad is not None
    assert logp.grad.item() < 0  # positive advantage: descent raises log pi(a)
    assert values.grad.item() < 0  # V below the return: descent raises V
    with pytest.raises(ValueError, match="returns"):
        a2c_loss(torch.zeros(3), torch.zeros(3, 1), torch.zeros(3), torch.zeros(3), logp, 0, 0)
    with pytest.raises(ValueError, match="advantages"):
        a2c_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(2), logp, 0, 0)
    with pytest.raises(ValueError, match="entropy_coef=-0.5"):
        a2c_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), logp, -0.5, 0)


# ----------------------------------------------------------------------------- reduce


def worker_grads(num_workers: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(num_workers)
    return [
        {"w": torch.randn(3, 2, generator=gen), "b": torch.randn(2, generator=gen)}
        for _ in range(num_workers)
    ]


@pytest.mark.parametrize("num_workers", [1, 2, 5])
def test_reduce_gradients_sum_and_mean(num_workers):
    grads = worker_grads(num_workers)
    before = [{k: v.clone() for k, v in g.items()} for g in grads]
    summed = reduce_gradients(grads, "sum")
    mean = reduce_gradients(grads, "mean")
    assert list(summed) == list(mean) == ["w", "b"]
    for name in ("w", "b"):
        expected = torch.zeros_like(grads[0][name])
        for g in grads:
            expected += g[name]
        torch.testing.assert_close(summed[name], expected)
        torch.testing.assert_close(mean[name], expected / num_workers)
    # Inputs untouched and not aliased by the result.
    for g, ref in zip(grads, before, strict=True):
        for name in g:
            assert torch.equal(g[name], ref[name])
    summed["w"].add_(100.0)
    assert torch.equal(grads[0]["w"], before[0]["w"])


def test_reduce_gradients_errors():
    grads = worker_grads(2)
    with pytest.raises(ValueError, match="mode='avg'"):
        reduce_gradients(grads, "avg")
    with pytest.raises(ValueError, match="empty"):
        reduce_gradients([], "sum")
    with pytest.raises(ValueError, match=r"worker 1 .*missing \['b'\]"):
        reduce_gradients([grads[0], {"w": grads[1]["w"]}], "sum")
    with pytest.raises(ValueError, match=r"extra \['c'\]"):
        reduce_gradients([grads[0], {**grads[1], "c": torch.zeros(1)}], "mean")
    with pytest.raises(ValueError, match="'b' of worker 1 has shape"):
        reduce_gradients([grads[0], {**grads[1], "b": torch.zeros(3)}], "sum")
