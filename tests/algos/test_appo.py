"""APPO: the loss against a per-step reference loop written from the definitions, its reduction
to PPO on-policy, and ``AppoUpdate`` driven with hand-built unroll batches (what it shares with
IMPALA, receiving, stale unrolls and its state, is tested for both in ``test_updates.py``)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.helpers.updates import (
    batch,
    check_non_finite_batch_is_dropped,
    config,
    layout,
    setup,
    trained,
    unroll_batch,
)
from zrl.algos.appo.losses import appo_loss, masked_normalize
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.kernel.policy_gradient import normalize, ppo_loss
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.kernel.unrolls import FRAME_TRAINED_ARRAYS, TRAINED_ARRAYS
from zrl.algos.kernel.value_normalizer import ValueNormalizer
from zrl.algos.kernel.vtrace import unroll_forward, vtrace
from zrl.algos.registry import get_algorithm
from zrl.nets.gaussian import categorical_entropy
from zrl.testing.fakes import learner_setup
from zrl.transport import messages as M
from zrl.transport import protocol as P

torch.set_num_threads(1)
SETTINGS = settings(max_examples=40, deadline=None)
thresholds = st.sampled_from([0.5, 1.0, 2.0, math.inf])
F64 = torch.float64


@st.composite
def minibatches(draw: st.DrawFn, on_policy: bool = False) -> dict[str, Any]:
    """A time-major [T, B] float64 minibatch as ``AppoUpdate`` hands it to the loss: the
    learner's logits and values (leaf tensors with gradients), the actors' actions and
    behaviour log-probs, episode ends and valid flags as an autoresetting actor records them."""
    B, T, A = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(2, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    term, trunc, valid = layout(rng, B, T, draw(st.sampled_from([0.0, 0.3])), 0.2)
    logits = torch.from_numpy(rng.normal(size=(T, B, A)) * 1.5)
    actions = torch.from_numpy(rng.integers(A, size=(T, B)))
    pi = F.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1))[..., 0]
    mu = pi.clone() if on_policy else pi + torch.from_numpy(rng.normal(size=(T, B)) * 0.3)
    rewards = torch.from_numpy(rng.normal(size=(T, B)))
    rewards[torch.from_numpy(~valid.T)] = 0.0
    return {
        "logits": logits.requires_grad_(True),
        "values": torch.from_numpy(rng.normal(size=(T, B))).requires_grad_(True),
        "old_values": torch.from_numpy(rng.normal(size=(T, B))),
        "actions": actions,
        "behaviour_logp": mu,
        "rewards": rewards,
        "terminated": torch.from_numpy(term.T.copy()),
        "truncated": torch.from_numpy(trunc.T.copy()),
        "valid": torch.from_numpy(valid.T.copy()),
        "bootstrap": torch.from_numpy(rng.normal(size=B)),
        "gamma": draw(st.sampled_from([0.0, 0.9, 1.0])),
    }


def vtrace_of(mb: dict[str, Any], rho_bar: float, c_bar: float) -> Any:
    """V-trace as ``unroll_forward`` calls it, under the minibatch's logits and values."""
    valid = mb["valid"].to(F64)
    target = F.log_softmax(mb["logits"].detach(), -1).gather(-1, mb["actions"].unsqueeze(-1))
    return vtrace(
        mb["behaviour_logp"],
        target[..., 0],
        mb["rewards"],
        mb["gamma"] * (1.0 - mb["terminated"].to(F64)) * valid,
        mb["values"].detach(),
        mb["bootstrap"],
        rho_bar=rho_bar,
        c_bar=c_bar,
        valid=valid,
    )


def reference_appo(mb, rho_bar, c_bar, clip, value_clip, ent_coef, value_coef, norm):
    """APPO's loss written from the definitions, one time step at a time (scalar torch ops, for
    the gradients): V-trace's backward recursion per trajectory, the pg advantage
    rho_t (r_t + gamma_t v_{t+1} - V_t), the ratio pi/mu, the clipped surrogate, the value and
    entropy terms, each averaged over the valid steps."""
    logits, values, old_values = mb["logits"], mb["values"], mb["old_values"]
    T, B, A = logits.shape
    valid, term, gamma = mb["valid"], mb["terminated"], mb["gamma"]
    steps = [(t, b) for b in range(B) for t in range(T) if valid[t, b]]
    adv: dict[tuple[int, int], Any] = {}
    vs: dict[tuple[int, int], Any] = {}
    ratio: dict[tuple[int, int], Any] = {}
    for b in range(B):
        next_v = float(mb["bootstrap"][b])  # V(x_{t+1}), constants
        next_vs = next_v  # v_{t+1}
        for t in reversed(range(T)):
            v = float(values[t, b])
            if not valid[t, b]:  # an autoreset step: v_s = V, and it bootstraps the step before
                vs[t, b], next_v, next_vs = v, v, v
                continue
            logp = torch.log_softmax(logits[t, b], -1)[mb["actions"][t, b]]
            ratio[t, b] = torch.exp(logp - mb["behaviour_logp"][t, b])
            r = float(ratio[t, b])
            g = 0.0 if term[t, b] else gamma
            rew = float(mb["rewards"][t, b])
            delta = min(rho_bar, r) * (rew + g * next_v - v)
            adv[t, b] = min(rho_bar, r) * (rew + g * next_vs - v)
            vs[t, b] = v + delta + g * min(c_bar, r) * (next_vs - next_v)
            next_v, next_vs = v, vs[t, b]
    n = len(steps)
    if norm and n > 1:
        mean = sum(adv[s] for s in steps) / n
        std = math.sqrt(sum((adv[s] - mean) ** 2 for s in steps) / (n - 1))
        adv = {s: (adv[s] - mean) / (std + 1e-8) for s in steps}
    policy = value = entropy = torch.zeros((), dtype=F64)
    for t, b in steps:
        rt, at = ratio[t, b], adv[t, b]
        policy = policy - torch.min(rt * at, rt.clamp(1 - clip, 1 + clip) * at) / n
        err = (values[t, b] - vs[t, b]) ** 2
        if value_clip is not None:
            old = old_values[t, b]
            clipped = old + (values[t, b] - old).clamp(-value_clip, value_clip)
            err = torch.max(err, (clipped - vs[t, b]) ** 2)
        value = value + 0.5 * err / n
        p = torch.softmax(logits[t, b], -1)
        entropy = entropy - (p * torch.log(p)).sum() / n
    loss = policy + value_coef * value - ent_coef * entropy
    return loss, {"policy_loss": policy, "value_loss": value, "entropy": entropy}


# ----------------------------------------------------------------------------- the loss


@SETTINGS
@given(
    mb=minibatches(),
    rho_bar=thresholds,
    c_bar=thresholds,
    clip=st.sampled_from([0.1, 0.3]),
    value_clip=st.sampled_from([None, 0.2]),
    norm=st.booleans(),
)
def test_appo_loss_matches_the_reference_loop(mb, rho_bar, c_bar, clip, value_clip, norm):
    coefs = {"entropy_coef": 0.03, "value_coef": 0.7}
    loss, parts = appo_loss(
        mb["logits"],
        mb["values"],
        mb["actions"],
        mb["behaviour_logp"],
        vtrace_of(mb, rho_bar, c_bar),
        clip=clip,
        value_clip=value_clip,
        old_values=mb["old_values"],
        normalize_advantages=norm,
        valid=mb["valid"],
        **coefs,
    )
    ref, ref_parts = reference_appo(
        mb, rho_bar, c_bar, clip, value_clip, coefs["entropy_coef"], coefs["value_coef"], norm
    )
    assert float(loss) == pytest.approx(float(ref), rel=1e-9, abs=1e-9)
    for name, value in ref_parts.items():
        assert float(parts[name]) == pytest.approx(float(value), rel=1e-9, abs=1e-9), name
    assert all(p.ndim == 0 and not p.requires_grad for p in parts.values())
    got = torch.autograd.grad(loss, [mb["logits"], mb["values"]])
    if not mb["valid"].any():  # no step: a zero loss, no gradient (not NaN)
        assert float(loss) == 0.0 and all(torch.all(g == 0) for g in got)
        return
    want = torch.autograd.grad(ref, [mb["logits"], mb["values"]], allow_unused=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w)


@SETTINGS
@given(
    mb=minibatches(on_policy=True),
    rho_bar=st.sampled_from([1.0, 2.0, math.inf]),
    norm=st.booleans(),
    value_clip=st.sampled_from([None, 0.2]),
)
def test_on_policy_appo_is_ppo_on_nstep_returns(mb, rho_bar, norm, value_clip):
    """mu == pi, rho_bar = c_bar >= 1: the V-trace targets are the n-step returns, and APPO's
    loss (each part, and its gradients) is PPO's with the n-step advantages."""
    returns = vtrace_of(mb, rho_bar, rho_bar)
    v, valid = mb["values"].detach(), mb["valid"]
    adv, ret = rollout_gae(
        mb["rewards"].T.numpy(),
        v.T.numpy(),
        mb["terminated"].T.numpy(),
        mb["truncated"].T.numpy(),
        valid.T.numpy(),
        mb["bootstrap"].numpy(),
        mb["gamma"],
        1.0,
    )
    np.testing.assert_allclose(returns.vs.numpy()[valid.numpy()], ret.T[valid.numpy()], 1e-5, 1e-5)
    np.testing.assert_allclose(returns.pg_advantages.numpy(), adv.T, rtol=1e-5, atol=1e-5)

    coefs = {"clip": 0.2, "entropy_coef": 0.01, "value_coef": 0.5, "value_clip": value_clip}
    loss, parts = appo_loss(
        mb["logits"],
        mb["values"],
        mb["actions"],
        mb["behaviour_logp"],
        returns,
        old_values=mb["old_values"],
        normalize_advantages=norm,
        valid=valid,
        **coefs,
    )
    if not valid.any():  # PPO's mean over no step is NaN; APPO's loss is 0
        assert float(loss) == 0.0
        return
    logp = F.log_softmax(mb["logits"], -1).gather(-1, mb["actions"].unsqueeze(-1))[..., 0]
    ppo, ppo_parts = ppo_loss(
        logp[valid],
        mb["behaviour_logp"][valid],
        torch.from_numpy(adv.T)[valid],
        mb["values"][valid],
        mb["old_values"][valid],
        torch.from_numpy(ret.T)[valid],
        categorical_entropy(mb["logits"])[valid],
        normalize_advantages=norm,
        **coefs,
    )
    # rollout_gae computes in float32; normalizing its advantages scales their rounding up
    # (two near-equal advantages: a policy loss of -1.25e-6 for APPO's float64 -0.0).
    for name, value in ppo_parts.items():
        assert float(parts[name]) == pytest.approx(value, rel=1e-5, abs=1e-5), name
    assert float(parts["mean_rho"]) == pytest.approx(1.0)
    got = torch.autograd.grad(loss, [mb["logits"], mb["values"]])
    want = torch.autograd.grad(ppo, [mb["logits"], mb["values"]])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_masked_normalize_is_normalize_of_the_valid_entries():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=gen, dtype=F64)
    valid = torch.rand(6, 3, generator=gen) < 0.6
    out = masked_normalize(x, valid)
    torch.testing.assert_close(out[valid], normalize(x[valid]))
    one = torch.zeros_like(valid)
    one[2, 1] = True
    torch.testing.assert_close(masked_normalize(x, one), x)  # a single sample: as is


def test_appo_loss_ignores_what_invalid_steps_carry():
    """A huge ratio on an invalid step (its behaviour log-prob is anything) changes nothing and
    puts no NaN into the gradients."""
    gen = torch.Generator().manual_seed(1)
    T, B, A = 4, 2, 3
    logits = torch.randn(T, B, A, generator=gen, dtype=F64, requires_grad=True)
    values = torch.randn(T, B, generator=gen, dtype=F64, requires_grad=True)
    actions = torch.randint(A, (T, B), generator=gen)
    mu = torch.full((T, B), math.log(0.3), dtype=F64)
    valid = torch.ones(T, B, dtype=torch.bool)
    valid[2, 0] = False
    returns = vtrace(
        mu,
        mu,
        torch.ones(T, B, dtype=F64),
        torch.full((T, B), 0.9, dtype=F64),
        values.detach(),
        torch.zeros(B, dtype=F64),
        valid=valid,
    )
    kw = {"clip": 0.1, "entropy_coef": 0.01, "value_coef": 0.5, "valid": valid}
    loss, parts = appo_loss(logits, values, actions, mu, returns, **kw)
    far = mu.clone()
    far[2, 0] = -1000.0  # ratio e^1000 = inf there
    loss2, parts2 = appo_loss(logits, values, actions, far, returns, **kw)
    assert float(loss2) == float(loss)
    assert {k: float(v) for k, v in parts2.items()} == {k: float(v) for k, v in parts.items()}
    g = torch.autograd.grad(loss2, [logits, values])
    assert all(torch.isfinite(x).all() for x in g)


def test_appo_loss_refuses_bad_inputs():
    T, B, A = 3, 2, 2
    logits, values = torch.zeros(T, B, A), torch.zeros(T, B)
    actions, mu = torch.zeros(T, B, dtype=torch.long), torch.zeros(T, B)
    returns = vtrace(mu, mu, mu, mu, values, torch.zeros(B))
    kw: dict[str, Any] = {"clip": 0.1, "entropy_coef": 0.0, "value_coef": 0.5}
    with pytest.raises(ValueError, match="values"):
        appo_loss(logits, values[:, :1], actions, mu, returns, **kw)
    with pytest.raises(ValueError, match="old_values"):
        appo_loss(logits, values, actions, mu, returns, **kw, value_clip=0.2)
    with pytest.raises(ValueError, match="clip"):
        appo_loss(logits, values, actions, mu, returns, **{**kw, "clip": 0.0})
    with pytest.raises(ValueError, match="valid"):
        appo_loss(logits, values, actions, mu, returns, **kw, valid=torch.ones(T, 1, dtype=bool))


# ----------------------------------------------------------------------------- AppoUpdate


def appo_config(**appo: Any) -> Any:
    return config("appo", appo=appo, replay={"batch_size": 8})


def train_on(update: AppoUpdate, versions: list[int], seed: int = 0) -> Any:
    """Receive and train one batch of unrolls collected with ``versions`` (learner at 0)."""
    arrays = unroll_batch(np.random.default_rng(seed), versions)
    return trained(update, batch(arrays))


def adam_steps(update: AppoUpdate) -> int:
    return max(int(s["step"]) for s in update.optimizer.state.values())


def test_appo_is_registered_with_impala_wiring():
    appo, impala = get_algorithm("appo"), get_algorithm("impala")
    assert appo.wiring == impala.wiring
    assert appo.policy == impala.policy and appo.model == impala.model
    assert appo.reads == ("replay", "learner", "appo")
    with pytest.raises(ValueError, match="appo.minibatches"):
        config("appo", appo={"minibatches": 9}, replay={"batch_size": 8})


@pytest.mark.parametrize(
    ("epochs", "minibatches", "fresh", "steps"),
    [(1, 1, 4, 1), (3, 2, 4, 6), (2, 4, 8, 8), (3, 4, 2, 6)],  # last: 2 unrolls, 2 minibatches
)
def test_appo_takes_epochs_times_minibatches_steps(epochs, minibatches, fresh, steps) -> None:
    update = AppoUpdate(setup(appo_config(epochs=epochs, minibatches=minibatches)))
    result = train_on(update, [0] * fresh, seed=0)
    assert result.updates == steps and update.updates == steps
    assert adam_steps(update) == steps
    train_on(update, [0] * fresh, seed=1)
    assert update.updates == adam_steps(update) == 2 * steps


def test_appo_minibatches_hold_whole_unrolls(monkeypatch) -> None:
    """Each unroll is in exactly one minibatch per epoch, whole (all T steps)."""
    seen: list[dict[str, torch.Tensor]] = []

    def spy(model: nn.Module, b: dict[str, torch.Tensor], **kw: Any) -> Any:
        seen.append(b)
        return unroll_forward(model, b, **kw)

    monkeypatch.setattr("zrl.algos.appo.update.unroll_forward", spy)
    update = AppoUpdate(setup(appo_config(epochs=2, minibatches=3)))
    arrays = unroll_batch(np.random.default_rng(0), [0] * 7)
    trained(update, batch(arrays))
    assert [len(b["obs"]) for b in seen] == [3, 2, 2] * 2
    for epoch in (seen[:3], seen[3:]):
        obs = torch.cat([b["obs"] for b in epoch])  # [7, T, 4]: every unroll once, whole
        order = [int(np.flatnonzero((arrays["obs"] == o.numpy()).all(axis=(1, 2)))[0]) for o in obs]
        assert sorted(order) == list(range(7))


def test_appo_non_finite_loss_raises_before_the_step() -> None:
    update = AppoUpdate(setup(appo_config(epochs=2, minibatches=2)))
    arrays = unroll_batch(np.random.default_rng(2), [0, 0, 0, 0])
    # Finite (receive refuses NaN), but the value loss overflows: every minibatch fails.
    arrays["reward"] = np.full_like(arrays["reward"], 3e38)
    check_non_finite_batch_is_dropped(update, arrays)
    assert update.trained_unrolls == 0


def test_appo_value_clip_trains() -> None:
    update = AppoUpdate(setup(appo_config(value_clip=0.2, epochs=2, minibatches=2)))
    result = train_on(update, [0] * 4, seed=3)
    assert result.updates == 4 and np.isfinite(result.loss)


def test_unroll_forward_bootstraps_from_denormalized_values() -> None:
    """With a normalizer, V-trace runs on the denormalized values: the same targets as a model
    whose head outputs raw values; ``values`` stays the (normalized) head output."""
    model = setup(appo_config()).model
    arrays = unroll_batch(np.random.default_rng(4), [0] * 3)
    arrays["reward"] = np.random.default_rng(5).normal(size=arrays["reward"].shape) * 10
    arrays["terminated"][1, 3] = True
    batch = {k: torch.as_tensor(arrays[k]) for k in TRAINED_ARRAYS}
    batch["reward"] = batch["reward"].float()
    norm = ValueNormalizer()
    norm.update(torch.tensor([30.0, -10.0, 80.0]))

    class Raw(nn.Module):
        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits, values = model(obs)
            return logits, norm.denormalize(values)

    kw: dict[str, Any] = {"gamma": 0.9, "rho_bar": 1.0, "c_bar": 1.0, "lambda_": 0.95}
    f = unroll_forward(model, batch, value_normalizer=norm, **kw)
    g = unroll_forward(Raw(), batch, **kw)
    assert torch.allclose(f.returns.vs, g.returns.vs, atol=1e-4)
    assert torch.allclose(f.returns.pg_advantages, g.returns.pg_advantages, atol=1e-4)
    assert torch.allclose(norm.denormalize(f.values), g.values, atol=1e-4)
    assert not torch.allclose(f.returns.vs, unroll_forward(model, batch, **kw).returns.vs)


def test_appo_normalize_returns_counts_each_target_once_and_checkpoints() -> None:
    update = AppoUpdate(setup(appo_config(normalize_returns=True, epochs=3, minibatches=2)))
    arrays = unroll_batch(np.random.default_rng(6), [0] * 4)
    arrays["reward"] *= 100.0  # targets of order 1e3: the statistics must say so
    arrays["valid"][0, -2:] = False
    result = trained(update, batch(arrays))
    norm = update.value_normalizer
    assert norm is not None and result.updates == 6
    assert norm.count == int(arrays["valid"].sum())  # once per batch, not once per epoch
    assert norm.mean > 100 and norm.std > 1
    info = update.train_info()
    assert info["return_mean"] == norm.mean and info["return_std"] == norm.std
    again = AppoUpdate(setup(appo_config(normalize_returns=True)))
    again.load_state_dict(update.state_dict())
    assert again.value_normalizer is not None
    assert again.value_normalizer.state_dict() == norm.state_dict()
    plain = AppoUpdate(setup(appo_config()))
    assert plain.value_normalizer is None and "return_mean" not in plain.train_info()
    plain.load_state_dict(update.state_dict())  # a normalized run's checkpoint loads


def test_learner_adam_eps_reaches_the_optimizer() -> None:
    cfg = config("appo", replay={"batch_size": 8}, learner={"adam_eps": 1e-5})
    update = AppoUpdate(setup(cfg))
    assert update.optimizer.param_groups[0]["eps"] == 1e-5
    assert AppoUpdate(setup(appo_config())).optimizer.param_groups[0]["eps"] == 1e-8


class ImageActorCritic(nn.Module):
    """A tiny actor-critic for uint8 image observations ``[N, C, H, W]``: it must get them
    as they came, only the unroll's batch and time axes flattened."""

    obs_shape = (2, 5, 5)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.pi, self.v = nn.Linear(36, 3), nn.Linear(36, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert obs.dtype == torch.uint8 and tuple(obs.shape[1:]) == self.obs_shape
        x = torch.relu(self.conv(obs.float() / 255.0)).flatten(1)
        return self.pi(x), self.v(x)[:, 0]


def test_appo_trains_on_image_observations() -> None:
    """uint8 ``[B, T, C, H, W]`` observations reach the model as ``[B * T, C, H, W]``."""
    torch.manual_seed(0)
    s = setup(appo_config(epochs=2, minibatches=2))
    s.model = ImageActorCritic()
    update = AppoUpdate(s)
    rng = np.random.default_rng(0)
    B, T = 4, 5
    tensors = {
        "obs": torch.from_numpy(rng.integers(0, 256, (B, T, 2, 5, 5), dtype=np.uint8)),
        "bootstrap_obs": torch.from_numpy(rng.integers(0, 256, (B, 2, 5, 5), dtype=np.uint8)),
        "action": torch.from_numpy(rng.integers(0, 3, (B, T))),
        "logp": torch.full((B, T), math.log(1 / 3)),
        "reward": torch.ones(B, T),
        "terminated": torch.zeros(B, T, dtype=torch.bool),
        "valid": torch.ones(B, T, dtype=torch.bool),
    }
    before = {k: v.clone() for k, v in update.model.state_dict().items()}
    result = update.train_unrolls(tensors)
    assert result.updates == 4 and np.isfinite(result.loss)
    after = update.model.state_dict()
    assert not all(torch.equal(before[k], after[k]) for k in before)


def test_appo_takes_frame_batches_and_rebuilds_the_stacks(monkeypatch) -> None:
    """On stacks of k = 2 frames ``[2, 5, 5]``: a ``frame_unroll_batch`` (``frames [B, T + 2,
    5, 5]``) is checked (T + k frames per unroll) and trained on the stacks rebuilt from it."""
    torch.manual_seed(0)
    cfg = appo_config(epochs=1, minibatches=1)
    obs_space = gym.spaces.Box(0, 255, ImageActorCritic.obs_shape, np.uint8)
    update = AppoUpdate(learner_setup(cfg, ImageActorCritic(), obs_space, gym.spaces.Discrete(3)))
    assert update.schema is M.FRAME_UNROLL_BATCH and update.trained_arrays == FRAME_TRAINED_ARRAYS
    rng = np.random.default_rng(0)
    B, T = 3, 5
    valid = np.ones((B, T), bool)
    valid[0, 2] = valid[1, 0] = False  # episodes start at obs_3 of row 0 and obs_1 of row 1
    arrays = {
        "frames": rng.integers(1, 256, (B, T + 2, 5, 5), dtype=np.uint8),
        "action": rng.integers(0, 3, (B, T)),
        "logp": np.full((B, T), math.log(1 / 3), np.float32),
        "reward": np.ones((B, T), np.float32),
        "terminated": np.zeros((B, T), bool),
        "truncated": np.zeros((B, T), bool),
        "valid": valid,
        "weights_version": np.zeros(B, np.int64),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    with pytest.raises(P.ProtocolError, match="T \\+ 2"):
        update.receive(batch({**arrays, "frames": arrays["frames"][:, 1:]}), 0)
    seen: list[dict[str, torch.Tensor]] = []
    train_unrolls = AppoUpdate.train_unrolls
    monkeypatch.setattr(
        AppoUpdate, "train_unrolls", lambda self, b: seen.append(b) or train_unrolls(self, b)
    )
    result = trained(update, batch(arrays))
    assert result.samples == valid.sum() and len(seen) == 1
    obs, bootstrap = seen[0]["obs"].numpy(), seen[0]["bootstrap_obs"].numpy()
    frames = arrays["frames"]
    assert obs.shape == (B, T, 2, 5, 5) and bootstrap.shape == (B, 2, 5, 5)
    np.testing.assert_array_equal(obs[2, 3], frames[2, 3:5])  # one episode: frames[i : i + k]
    np.testing.assert_array_equal(bootstrap[2], frames[2, T : T + 2])
    np.testing.assert_array_equal(obs[0, 3], np.stack([np.zeros((5, 5)), frames[0, 4]]))
    np.testing.assert_array_equal(obs[1, 1], np.stack([np.zeros((5, 5)), frames[1, 2]]))
    np.testing.assert_array_equal(obs[1, 2], frames[1, 2:4])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("normalize_returns", [False, True])
def test_appo_trains_a_batch_on_the_gpu(normalize_returns: bool) -> None:
    s = setup(
        appo_config(epochs=2, minibatches=2, value_clip=0.2, normalize_returns=normalize_returns)
    )
    update = AppoUpdate(s)
    update.model.cuda()
    update.optimizer = torch.optim.Adam(update.model.parameters(), lr=1e-3)
    arrays = unroll_batch(np.random.default_rng(0), [0] * 4)
    tensors = {k: torch.from_numpy(arrays[k]).cuda() for k in TRAINED_ARRAYS}
    result = update.train_unrolls(tensors)
    assert result.updates == 4 and np.isfinite(result.loss)
    assert next(update.model.parameters()).is_cuda
    if normalize_returns:
        assert (
            update.value_normalizer is not None
            and update.value_normalizer.count == arrays["valid"].sum()
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_appo_on_the_gpu_moves_a_batch_while_the_last_one_trains() -> None:
    """On a GPU: the checks stay on the device, the copy of a received batch is in flight on
    the staging's stream, and the update takes it from there."""
    s = setup(appo_config(epochs=2, minibatches=2, normalize_returns=True))
    s.model.cuda()
    s.device = torch.device("cuda")
    update = AppoUpdate(s)
    assert update.defer_checks and update.staging.stream is not None
    msgs = [batch(unroll_batch(np.random.default_rng(i), [0] * 4)) for i in range(3)]
    update.receive(msgs[0], 0)
    first = update.train(0)  # the first step's state and buffers are made here
    update.receive(msgs[1], 0)  # its copy queued behind nothing: the update runs meanwhile
    assert len(update.pending) == 1 and update.pending[0].moving.ready is not None
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the update raises
    try:
        second = update.train(0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert first is not None and second is not None
    assert first.finite is not None and bool(first.finite) and bool(second.finite)
    assert isinstance(second.loss, torch.Tensor) and second.loss.is_cuda
    arrays = unroll_batch(np.random.default_rng(9), [0] * 4)
    arrays["reward"] = np.full_like(arrays["reward"], 3e38)
    before = {k: v.clone() for k, v in update.model.state_dict().items()}
    bad = trained(update, batch(arrays))
    assert bad.finite is not None and not bool(bad.finite)
    assert all(torch.equal(before[k], v) for k, v in update.model.state_dict().items())
