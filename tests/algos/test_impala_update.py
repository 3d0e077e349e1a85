"""V-trace and the IMPALA loss with a ``valid`` mask, and ``impala_update`` on env-major unrolls,
against plain-loop references (each episode segment is an independent V-trace trajectory)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.updates import config, layout
from zrl.algos.api.learner import NonFiniteLossError
from zrl.algos.impala.losses import ImpalaStepResult, impala_loss, impala_update
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.kernel.vtrace import VTraceReturns, vtrace
from zrl.nets.discrete import ActorCritic
from zrl.nets.gaussian import categorical_entropy

torch.set_num_threads(1)
SETTINGS = settings(max_examples=50, deadline=None)
thresholds = st.sampled_from([0.5, 1.0, 2.0, math.inf])


@st.composite
def masked_trajectories(draw: st.DrawFn, on_policy: bool = False) -> dict[str, np.ndarray]:
    """Env-major [B, T] float64 numpy arrays (the tests transpose them for vtrace)."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_term = draw(st.sampled_from([0.0, 0.2, 0.4]))
    p_trunc = draw(st.sampled_from([0.0, 0.2, 0.4]))
    term, trunc, valid = layout(rng, B, T, p_term, p_trunc)
    behaviour = np.log(rng.random((B, T)) * 0.9 + 0.1)
    target = behaviour if on_policy else behaviour + rng.normal(size=(B, T))
    rewards = rng.normal(size=(B, T))
    rewards[~valid] = 0.0
    return {
        "behaviour_logp": behaviour,
        "target_logp": target,
        "rewards": rewards,
        "values": rng.normal(size=(B, T)),
        "bootstrap_value": rng.normal(size=B),
        "terminated": term,
        "truncated": trunc,
        "valid": valid,
        "gamma": np.array(draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))),
    }


def run_vtrace(tr: dict[str, np.ndarray], **kw) -> VTraceReturns:
    """vtrace as impala_update calls it: time-major, discounts gamma (1 - terminated) valid."""

    def tm(name: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(tr[name].T)).double()

    valid = tm("valid")
    discounts = float(tr["gamma"]) * (1.0 - tm("terminated")) * valid
    out = vtrace(
        tm("behaviour_logp"),
        tm("target_logp"),
        tm("rewards"),
        discounts,
        tm("values"),
        torch.from_numpy(tr["bootstrap_value"]).double(),
        valid=valid,
        **kw,
    )
    return VTraceReturns(vs=out.vs.T, pg_advantages=out.pg_advantages.T)  # back to [B, T]


def segment_vtrace_reference(tr, rho_bar, c_bar, pg_rho_bar=None, lam=1.0):
    """Eq. (1) of the paper summed explicitly over each episode segment separately.

    A segment starts at a valid step s and ends at the first step j >= s that terminated or
    was truncated, or at the row's last step. Its bootstrap value after j is 0 (terminated),
    V(x_{j+1}) = values[j + 1] (truncated: the reset step holds the final observation), or
    bootstrap_value (the row ends). Invalid steps: v_s = V(x_s), advantage 0.
    """
    b_logp, t_logp = tr["behaviour_logp"], tr["target_logp"]
    rewards, values, boot = tr["rewards"], tr["values"], tr["bootstrap_value"]
    term, trunc, valid, gamma = tr["terminated"], tr["truncated"], tr["valid"], float(tr["gamma"])
    B, T = rewards.shape
    vs = values.astype(np.float64).copy()
    adv = np.zeros((B, T))
    pg_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    for b in range(B):

        def ratio(t: int, b: int = b) -> float:
            return math.exp(t_logp[b, t] - b_logp[b, t])

        def segment_end(s: int, b: int = b) -> int:
            j = s
            while not (term[b, j] or trunc[b, j]) and j < T - 1:
                j += 1
            return j

        for s in range(T):
            if not valid[b, s]:
                continue
            j = segment_end(s)
            if term[b, j]:
                after = 0.0
            else:
                after = float(values[b, j + 1]) if j + 1 < T else float(boot[b])

            def next_value(t: int, j: int = j, after: float = after, b: int = b) -> float:
                return after if t == j else float(values[b, t + 1])

            total = 0.0
            for t in range(s, j + 1):
                trace = 1.0
                for i in range(s, t):
                    trace *= gamma * lam * min(c_bar, ratio(i))
                g_t = 0.0 if term[b, t] else gamma
                td = rewards[b, t] + g_t * next_value(t) - values[b, t]
                total += trace * min(rho_bar, ratio(t)) * td
            vs[b, s] = values[b, s] + total
        for s in range(T):
            if not valid[b, s]:
                continue
            j = segment_end(s)
            g_s = 0.0 if term[b, s] else gamma
            if s < j:
                next_vs = vs[b, s + 1]
            elif term[b, j]:
                next_vs = 0.0
            else:
                next_vs = float(values[b, j + 1]) if j + 1 < T else float(boot[b])
            adv[b, s] = min(pg_bar, ratio(s)) * (rewards[b, s] + g_s * next_vs - values[b, s])
    return vs, adv


# ----------------------------------------------------------------------------- vtrace + valid


@SETTINGS
@given(
    tr=masked_trajectories(),
    rho_bar=thresholds,
    c_bar=thresholds,
    pg_rho_bar=st.one_of(st.none(), thresholds),
    lam=st.sampled_from([1.0, 0.8, 0.0]),
)
def test_vtrace_valid_mask_matches_segment_reference(tr, rho_bar, c_bar, pg_rho_bar, lam):
    out = run_vtrace(tr, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lam)
    ref_vs, ref_adv = segment_vtrace_reference(tr, rho_bar, c_bar, pg_rho_bar, lam)
    np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-9, atol=1e-9)
    invalid = ~tr["valid"]
    np.testing.assert_array_equal(out.vs.numpy()[invalid], tr["values"][invalid])
    assert np.all(out.pg_advantages.numpy()[invalid] == 0.0)


@SETTINGS
@given(tr=masked_trajectories(on_policy=True), rho_bar=st.sampled_from([1.0, 2.0, math.inf]))
def test_vtrace_on_policy_with_valid_is_nstep_return(tr, rho_bar):
    """On-policy the masked V-trace targets are the n-step bootstrapped returns of
    rollout_gae(lam=1), and the pg advantages its advantages."""
    out = run_vtrace(tr, rho_bar=rho_bar, c_bar=rho_bar)
    adv, ret = rollout_gae(
        tr["rewards"],
        tr["values"],
        tr["terminated"],
        tr["truncated"],
        tr["valid"],
        tr["bootstrap_value"],
        float(tr["gamma"]),
        1.0,
    )
    valid = tr["valid"]
    np.testing.assert_allclose(out.vs.numpy()[valid], ret[valid], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), adv, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(tr=masked_trajectories(on_policy=True), lam=st.sampled_from([0.0, 0.5, 0.95]))
def test_vtrace_on_policy_with_lambda_is_gae(tr, lam):
    """On-policy with lambda_ the V-trace targets are GAE(lambda)'s returns (its advantages
    plus V)."""
    out = run_vtrace(tr, rho_bar=1.0, c_bar=1.0, lambda_=lam)
    _, ret = rollout_gae(
        tr["rewards"],
        tr["values"],
        tr["terminated"],
        tr["truncated"],
        tr["valid"],
        tr["bootstrap_value"],
        float(tr["gamma"]),
        lam,
    )
    valid = tr["valid"]
    np.testing.assert_allclose(out.vs.numpy()[valid], ret[valid], rtol=1e-5, atol=1e-5)


def test_vtrace_nothing_flows_across_an_invalid_step():
    """B=1, T=7: truncated at t=2 (t=3 invalid), terminated at t=5 (t=6 invalid); ratios 3."""
    rng = np.random.default_rng(1)
    T = 7
    term, trunc, valid = np.zeros((1, T), bool), np.zeros((1, T), bool), np.ones((1, T), bool)
    trunc[0, 2], valid[0, 3], term[0, 5], valid[0, 6] = True, False, True, False
    behaviour = np.full((1, T), math.log(0.2))
    tr: dict[str, np.ndarray] = {
        "behaviour_logp": behaviour,
        "target_logp": behaviour + math.log(3.0),
        "rewards": rng.normal(size=(1, T)),
        "values": rng.normal(size=(1, T)),
        "bootstrap_value": rng.normal(size=1),
        "terminated": term,
        "truncated": trunc,
        "valid": valid,
        "gamma": np.array(0.9),
    }
    kw = {"rho_bar": math.inf, "c_bar": math.inf}
    base = run_vtrace(tr, **kw)
    vs, adv, v = base.vs.numpy()[0], base.pg_advantages.numpy()[0], tr["values"][0]
    assert vs[3] == v[3] and adv[3] == 0.0
    assert vs[6] == v[6] and adv[6] == 0.0
    # The truncated step bootstraps from V at the reset step (its final observation).
    r = tr["rewards"][0]
    assert vs[2] == pytest.approx(v[2] + 3.0 * (r[2] + 0.9 * v[3] - v[2]))
    assert adv[2] == pytest.approx(3.0 * (r[2] + 0.9 * v[3] - v[2]))
    # The terminated step bootstraps from nothing.
    assert vs[5] == pytest.approx(v[5] + 3.0 * (r[5] - v[5]))
    # The next episode (its rewards, values, ratios, the reset step's reward, the bootstrap)
    # does not reach the first one.
    later = {k: np.array(x, copy=True) for k, x in tr.items()}
    later["rewards"][0, 3:] += 10.0
    later["values"][0, 4:] -= 10.0
    later["behaviour_logp"][0, 3:] -= 2.0
    later["bootstrap_value"][:] = 99.0
    out = run_vtrace(later, **kw)
    np.testing.assert_array_equal(out.vs.numpy()[0, :4], vs[:4])
    np.testing.assert_array_equal(out.pg_advantages.numpy()[0, :4], adv[:4])
    # The terminated episode ignores the bootstrap entirely.
    np.testing.assert_array_equal(
        out.vs.numpy()[0, 4:],
        run_vtrace({**later, "bootstrap_value": np.array([-5.0])}, **kw).vs.numpy()[0, 4:],
    )


# ----------------------------------------------------------------------------- impala_loss + valid


def test_impala_loss_valid_mask_is_the_loss_of_the_valid_steps():
    gen = torch.Generator().manual_seed(3)
    T, B, A = 5, 3, 4
    valid = torch.rand(T, B, generator=gen) < 0.6
    valid[0, 0] = True
    logits = (torch.randn(T, B, A, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    values = torch.randn(T, B, generator=gen, dtype=torch.float64).requires_grad_(True)
    actions = torch.randint(A, (T, B), generator=gen)
    returns = VTraceReturns(
        vs=torch.randn(T, B, generator=gen, dtype=torch.float64),
        pg_advantages=torch.randn(T, B, generator=gen, dtype=torch.float64),
    )
    loss, parts = impala_loss(logits, values, actions, returns, 0.05, 0.7, valid=valid)
    loss.backward()

    # The same steps gathered into a [N, 1] batch without a mask.
    sub_logits = logits.detach()[valid].unsqueeze(1).requires_grad_(True)
    sub_values = values.detach()[valid].unsqueeze(1).requires_grad_(True)
    sub = VTraceReturns(
        vs=returns.vs[valid].unsqueeze(1), pg_advantages=returns.pg_advantages[valid].unsqueeze(1)
    )
    sub_loss, sub_parts = impala_loss(
        sub_logits, sub_values, actions[valid].unsqueeze(1), sub, 0.05, 0.7
    )
    sub_loss.backward()
    assert {k: float(v) for k, v in parts.items()} == pytest.approx(
        {k: float(v) for k, v in sub_parts.items()}, rel=1e-12
    )
    assert logits.grad is not None and values.grad is not None
    assert sub_logits.grad is not None and sub_values.grad is not None
    torch.testing.assert_close(logits.grad[valid], sub_logits.grad[:, 0])
    torch.testing.assert_close(values.grad[valid], sub_values.grad[:, 0])
    assert torch.all(logits.grad[~valid] == 0) and torch.all(values.grad[~valid] == 0)
    # An all-invalid batch is a zero loss, not a division by zero.
    none = torch.zeros(T, B, dtype=torch.bool)
    zero, zero_parts = impala_loss(
        logits.detach(), values.detach(), actions, returns, 0.05, 0.7, valid=none
    )
    assert zero.item() == 0.0 and all(v == 0.0 for v in zero_parts.values())
    with pytest.raises(ValueError, match="valid"):
        impala_loss(logits, values, actions, returns, 0.05, 0.7, valid=valid[:, :2])


# ----------------------------------------------------------------------------- impala_update

OBS_DIM, NUM_ACTIONS = 4, 3
GAMMA = 0.9
HYPER = {"rho_bar": 1.0, "c_bar": 1.0, "entropy_coef": 0.01, "value_coef": 0.5}


def make_model(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(OBS_DIM, NUM_ACTIONS, hidden=(16, 16), activation="tanh")


def unroll_batch(model: ActorCritic, seed: int = 0) -> dict[str, torch.Tensor]:
    """B=3, T=6 env-major unrolls, behaviour log-probs from ``model`` itself (on-policy).

    env 0: terminated at t=1 (t=2 invalid); env 1: truncated at t=2 (t=3 invalid) and at the
    last step; env 2: invalid at t=0, terminated at the last step.
    """
    rng = np.random.default_rng(seed)
    B, T = 3, 6
    term, trunc, valid = np.zeros((B, T), bool), np.zeros((B, T), bool), np.ones((B, T), bool)
    term[0, 1], valid[0, 2] = True, False
    trunc[1, 2], valid[1, 3], trunc[1, 5] = True, False, True
    valid[2, 0], term[2, 5] = False, True
    reward = rng.uniform(0.0, 2.0, (B, T)).astype(np.float32)
    reward[~valid] = 0.0
    obs = torch.from_numpy(rng.normal(size=(B, T, OBS_DIM)).astype(np.float32))
    action = torch.from_numpy(rng.integers(NUM_ACTIONS, size=(B, T)))
    with torch.no_grad():
        logits, _ = model(obs.reshape(B * T, OBS_DIM))
        logp = F.log_softmax(logits, -1).gather(1, action.reshape(-1, 1))[:, 0].reshape(B, T)
    return {
        "obs": obs,
        "action": action,
        "logp": logp,
        "reward": torch.from_numpy(reward),
        "terminated": torch.from_numpy(term),
        "truncated": torch.from_numpy(trunc),  # not read by impala_update; the reference's
        "valid": torch.from_numpy(valid),
        "bootstrap_obs": torch.from_numpy(rng.normal(size=(B, OBS_DIM)).astype(np.float32)),
    }


def update(model, optimizer, batch, grad_clip: float = 10.0) -> ImpalaStepResult:
    batch = {k: v for k, v in batch.items() if k != "truncated"}
    return impala_update(model, optimizer, batch, gamma=GAMMA, grad_clip=grad_clip, **HYPER)


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_impala_update_on_policy_is_actor_critic_on_nstep_returns():
    """On-policy, the update is the actor-critic step on rollout_gae(lam=1) targets: its loss
    parts, gradient norm and resulting weights match a reference built from those targets."""
    model = make_model()
    batch = unroll_batch(model)
    B, T = batch["reward"].shape
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        values = model.value(batch["obs"].reshape(B * T, OBS_DIM)).reshape(B, T).double()
        boot = model.value(batch["bootstrap_obs"]).double()
    adv, ret = rollout_gae(
        batch["reward"].numpy(),
        values.numpy(),
        batch["terminated"].numpy(),
        batch["truncated"].numpy(),
        batch["valid"].numpy(),
        boot.numpy(),
        GAMMA,
        1.0,
    )
    valid = batch["valid"]
    n = int(valid.sum())

    # Reference loss over the valid steps, with the n-step targets as constants.
    logits, v = ref_model(batch["obs"].reshape(B * T, OBS_DIM))
    logits, v = logits.reshape(B, T, -1)[valid], v.reshape(B, T)[valid]
    logp = F.log_softmax(logits, -1).gather(1, batch["action"][valid].unsqueeze(1))[:, 0]
    adv_t, ret_t = torch.from_numpy(adv)[valid].float(), torch.from_numpy(ret)[valid].float()
    policy_loss = -(logp * adv_t).sum() / n
    value_loss = 0.5 * ((ret_t - v) ** 2).sum() / n
    entropy = categorical_entropy(logits).sum() / n
    ref_loss = policy_loss + HYPER["value_coef"] * value_loss - HYPER["entropy_coef"] * entropy
    ref_loss.backward()
    grad_clip = 0.05  # small enough to clip: the reported norm is the one before clipping
    ref_norm = float(torch.nn.utils.clip_grad_norm_(ref_model.parameters(), grad_clip))
    assert ref_norm > grad_clip
    ref_opt = make_adam(ref_model.parameters(), 1e-2)
    ref_opt.step()

    result = update(model, make_adam(model.parameters(), 1e-2), batch, grad_clip=grad_clip)
    assert isinstance(result, ImpalaStepResult)
    assert result.mean_rho == pytest.approx(1.0, abs=1e-5)
    assert result.parts["policy_loss"] == pytest.approx(policy_loss.item(), rel=1e-4, abs=1e-6)
    assert result.parts["value_loss"] == pytest.approx(value_loss.item(), rel=1e-4)
    assert result.parts["entropy"] == pytest.approx(entropy.item(), rel=1e-5)
    assert result.parts["loss"] == pytest.approx(ref_loss.item(), rel=1e-4)
    assert result.grad_norm == pytest.approx(ref_norm, rel=1e-4)
    for k, w in weights_of(ref_model).items():
        torch.testing.assert_close(model.state_dict()[k], w, rtol=1e-5, atol=1e-6)


def test_impala_update_ignores_invalid_steps():
    """Whatever an invalid step carries (reward, action, behaviour log-prob) changes nothing."""
    model = make_model(1)
    batch = unroll_batch(model, seed=1)
    other = {k: v.clone() for k, v in batch.items()}
    invalid = ~batch["valid"]
    other["reward"][invalid] = 50.0
    other["action"][invalid] = (other["action"][invalid] + 1) % NUM_ACTIONS
    other["logp"][invalid] = -20.0  # ratio ~ e^19 there; clipped or masked everywhere
    m1, m2 = make_model(1), make_model(1)
    r1 = update(m1, make_adam(m1.parameters(), 1e-2), batch)
    r2 = update(m2, make_adam(m2.parameters(), 1e-2), other)
    assert r1.parts == pytest.approx(r2.parts, rel=1e-6, abs=1e-7)
    assert r1.mean_rho == pytest.approx(r2.mean_rho, rel=1e-6)
    assert r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-5)
    for k, w in weights_of(m1).items():
        torch.testing.assert_close(m2.state_dict()[k], w)


def test_impala_update_mean_rho_off_policy():
    model = make_model(2)
    batch = unroll_batch(model, seed=2)
    gen = torch.Generator().manual_seed(0)
    target = batch["logp"].clone()
    batch["logp"] = target + 0.3 * torch.randn(target.shape, generator=gen)
    valid = batch["valid"]
    expected = float(torch.exp(target - batch["logp"])[valid].mean())
    result = update(model, make_adam(model.parameters(), 1e-3), batch)
    assert result.mean_rho == pytest.approx(expected, rel=1e-4)
    assert result.mean_rho != pytest.approx(1.0, abs=1e-3)


def test_repeated_impala_updates_lower_the_value_loss():
    model = make_model(3)
    batch = unroll_batch(model, seed=3)
    optimizer = make_adam(model.parameters(), 1e-2)
    losses = []
    for _ in range(80):
        batch_now = dict(batch)
        with torch.no_grad():  # stay on-policy as the policy moves
            B, T = batch["reward"].shape
            logits, _ = model(batch["obs"].reshape(B * T, OBS_DIM))
            logp = F.log_softmax(logits, -1).gather(1, batch["action"].reshape(-1, 1))
            batch_now["logp"] = logp[:, 0].reshape(B, T)
        result = update(model, optimizer, batch_now)
        assert math.isfinite(result.parts["loss"]) and math.isfinite(result.grad_norm)
        losses.append(result.parts["value_loss"])
    assert losses[-1] < 0.25 * losses[0], losses[::10]
    assert max(losses[-10:]) < min(losses[:10])


@pytest.mark.parametrize("where", ["reward", "obs"])
def test_impala_update_non_finite_raises_and_leaves_weights(where):
    model = make_model(4)
    batch = unroll_batch(model, seed=4)
    if where == "reward":
        batch["reward"][1, 1] = float("nan")  # a valid step
    else:
        batch["obs"][0, 0, 2] = float("inf")
    before = weights_of(model)
    optimizer = make_adam(model.parameters(), 1e-2)
    with pytest.raises(NonFiniteLossError):
        update(model, optimizer, batch)
    for k, w in before.items():
        torch.testing.assert_close(model.state_dict()[k], w, rtol=0, atol=0)
    assert not optimizer.state  # no step was taken


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_several_learners_refuse_what_a_group_cannot_train(algo: str) -> None:
    """``roles.learners > 1`` (a data-parallel group): a batch in flight per learner, and no
    statistics each learner would gather from its own batches; the errors name the values."""
    group = {"roles": {"learners": 3, "replay": 1}, "replay": {"prefetch": 2}}
    with pytest.raises(
        ValueError,
        match=r"roles.learners \(3\).*roles.replay \(1\) x "
        r"replay.prefetch \(2\) = 2",
    ):
        config(algo, **group)
    config(algo, roles={"learners": 3, "replay": 2}, replay={"prefetch": 2})  # 4 in flight
    with pytest.raises(ValueError, match=r"model.normalize_input with roles.learners \(2\)"):
        config(algo, roles={"learners": 2}, model={"normalize_input": True})
    if algo == "appo":
        with pytest.raises(ValueError, match=r"appo.normalize_returns with roles.learners"):
            config(algo, roles={"learners": 2}, appo={"normalize_returns": True})
    config(algo, model={"normalize_input": True})  # alone, it gathers them all
