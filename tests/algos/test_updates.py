"""The learner-side updates of Ape-X DQN, IMPALA, APPO and Ape-X DDPG / SAC, driven directly with a
real ``LearnerSetup`` and hand-built BATCH messages (no role, no sockets): what ``receive``
refuses, what ``train`` returns, and the checkpoint state round trip."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.updates import (
    SHARD,
    B,
    T,
    batch,
    check_non_finite_batch_is_dropped,
    config,
    continuous_batch,
    dqn_batch,
    setup,
    trained,
    unroll_batch,
)
from zrl.algos.apex_dqn.update import ApexDQNUpdate
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.impala.update import ImpalaUpdate
from zrl.algos.kernel.continuous import ContinuousUpdate
from zrl.algos.kernel.unrolls import UnrollUpdate
from zrl.algos.registry import get_algorithm
from zrl.transport import protocol as P

torch.set_num_threads(1)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- Ape-X DQN ----------------------------------------------------------------------------


def test_dqn_trains_and_sends_priorities_to_the_shard() -> None:
    s = setup(config("apex_dqn", learner={"target_update_interval": 2}))
    update = ApexDQNUpdate(s)
    assert update.train(0) is None  # nothing received
    rng = np.random.default_rng(0)
    arrays = dqn_batch(rng)
    before = {k: v.clone() for k, v in update.model.state_dict().items()}
    result = trained(update, batch(arrays))
    assert result.updates == 1 and np.isfinite(result.loss)
    assert result.samples == B  # each transition of the batch once
    assert result.priorities is not None
    assert result.priorities.shard == SHARD
    np.testing.assert_array_equal(result.priorities.keys, arrays["key"])
    assert result.priorities.priorities.dtype == np.float32
    assert result.priorities.priorities.shape == (B,)
    assert any(not torch.equal(before[k], v) for k, v in update.model.state_dict().items())
    assert not same_weights(update.model, update.target)
    trained(update, batch(dqn_batch(rng)))  # update 2: the hard target update
    assert same_weights(update.model, update.target)
    assert update.train(0) is None  # one update per batch
    stats = s.train_stats.flush()
    assert {"loss", "q_mean", "grad_norm", "update_ms", "td_error", "td_error_max"} <= set(stats)
    assert set(update.train_info()) == {"lr"}
    assert update.heartbeat_info() == {} and update.summary() == ""
    assert update.may_publish() and update.weights_meta() == {}


@pytest.mark.parametrize(
    "change",
    [
        {"action": np.zeros(B, np.int32)},  # wrong dtype
        {"action": np.full(B, 2, np.int64)},  # CartPole has actions 0 and 1
        {"action": np.full(B, -1, np.int64)},
        {"reward": np.full(B, np.nan, np.float32)},
        {"obs": np.zeros((B, 5), np.float32), "next_obs": np.zeros((B, 5), np.float32)},
        {"weight": np.ones(B - 1, np.float32)},
    ],
    ids=["dtype", "action-high", "action-low", "nan", "obs-width", "lengths"],
)
def test_dqn_refuses_malformed_batches(change: dict[str, np.ndarray]) -> None:
    update = ApexDQNUpdate(setup(config("apex_dqn")))
    arrays = {**dqn_batch(np.random.default_rng(1)), **change}
    with pytest.raises(P.ProtocolError):
        update.receive(batch(arrays), 0)
    assert update.train(0) is None  # nothing kept


def test_dqn_refuses_a_batch_without_a_shard() -> None:
    update = ApexDQNUpdate(setup(config("apex_dqn")))
    with pytest.raises(P.ProtocolError, match="shard"):
        update.receive(batch(dqn_batch(np.random.default_rng(1)), shard=None), 0)
    with pytest.raises(P.ProtocolError):
        update.receive(P.Message(P.TRAJECTORY, arrays=dqn_batch(np.random.default_rng(1))), 0)


def test_dqn_non_finite_loss_names_the_shard_and_drops_the_batch() -> None:
    update = ApexDQNUpdate(setup(config("apex_dqn")))
    arrays = dqn_batch(np.random.default_rng(2))
    arrays["weight"] = np.full(B, 3e38, np.float32)  # finite, but the weighted loss is inf
    arrays["reward"] = np.full(B, 3e38, np.float32)
    check_non_finite_batch_is_dropped(update, arrays)


def test_dqn_state_dict_round_trip() -> None:
    cfg = config("apex_dqn")
    update = ApexDQNUpdate(setup(cfg, seed=0))
    trained(update, batch(dqn_batch(np.random.default_rng(3))))
    state = update.state_dict()
    assert set(state) == {"online", "target", "optimizer"}
    other = ApexDQNUpdate(setup(cfg, seed=1))
    assert not same_weights(update.model, other.model)
    other.load_state_dict({**state, "updates": 7})  # the learner's counters ride along
    assert same_weights(update.model, other.model)
    assert same_weights(update.target, other.target)
    assert other.optimizer.state_dict()["state"].keys() == state["optimizer"]["state"].keys()
    assert other.updates == 7


# --- IMPALA and APPO ----------------------------------------------------------------------

UNROLL_UPDATES: dict[str, type[UnrollUpdate]] = {"impala": ImpalaUpdate, "appo": AppoUpdate}


@pytest.mark.parametrize("algo", UNROLL_UPDATES)
def test_unroll_updates_train_on_fresh_unrolls_and_count_stale_ones(algo: str) -> None:
    s = setup(config(algo, **{algo: {"max_lag": 2, "epochs": 2}}))
    update = UNROLL_UPDATES[algo](s)
    rng = np.random.default_rng(4)
    # At version 10: lags 0, 2 (fresh) and 3, 8 (stale).
    arrays = unroll_batch(rng, [10, 8, 7, 2])
    result = trained(update, batch(arrays), version=10)
    assert result.updates == 2 and np.isfinite(result.loss)
    # The valid steps of the two fresh unrolls, once, though two epochs used them.
    assert result.samples == int(arrays["valid"][:2].sum())
    assert result.priorities is None
    assert update.stale_unrolls == 2 and update.trained_unrolls == 2 and update.updates == 2
    info = update.heartbeat_info()
    assert info["stale_unrolls"] == 2 and info["trained_unrolls"] == 2
    assert np.isfinite(info["mean_rho"])
    stats = s.train_stats.flush()
    assert {"loss", "policy_loss", "value_loss", "entropy", "grad_norm"} <= set(stats)
    assert stats["policy_lag"] == pytest.approx(1.0) and stats["policy_lag_max"] == 2.0
    # All stale: nothing to train on.
    update.receive(batch(unroll_batch(rng, [0, 1])), 10)
    assert update.train(10) is None
    assert update.stale_unrolls == 4 and update.trained_unrolls == 2
    assert update.summary() == "2 updates on 2 unrolls, 4 stale unrolls dropped (max_lag 2)"
    assert set(update.train_info()) == {"lr"}


@pytest.mark.parametrize("algo", UNROLL_UPDATES)
def test_unroll_updates_drop_the_unrolls_gone_stale_since_they_arrived(
    algo: str, monkeypatch
) -> None:
    """Received at version 10 (lags 0, 2, 3: two fresh, moved to the device), trained at 11:
    only the first is fresh still, and it is the one trained on."""
    update = UNROLL_UPDATES[algo](setup(config(algo, **{algo: {"max_lag": 2}})))
    seen: list[dict[str, torch.Tensor]] = []
    train_unrolls = type(update).train_unrolls
    monkeypatch.setattr(
        update, "train_unrolls", lambda b: seen.append(b) or train_unrolls(update, b)
    )
    arrays = unroll_batch(np.random.default_rng(4), [10, 8, 7])
    update.receive(batch(arrays), 10)
    result = update.train(11)
    assert result is not None and result.samples == int(arrays["valid"][0].sum())
    assert update.stale_unrolls == 2 and update.trained_unrolls == 1
    np.testing.assert_array_equal(seen[0]["obs"].numpy(), arrays["obs"][:1])


@pytest.mark.parametrize("algo", UNROLL_UPDATES)
def test_unroll_updates_checked_on_the_device_train_as_checked_at_once(algo: str) -> None:
    """``defer_checks`` (a GPU learner's; forced here on the CPU, whose fused Adam skips a
    step the same way): the same weights as the checked path, the loss and the finite flag
    left as tensors; a batch whose loss overflows raises nothing, its steps are skipped and
    the result says so for the learner to drop it."""
    cfg = config(algo, **{algo: {"epochs": 2}})
    checked, deferred = UNROLL_UPDATES[algo](setup(cfg)), UNROLL_UPDATES[algo](setup(cfg))
    deferred.defer_checks = True
    for seed in range(2):
        msg = batch(unroll_batch(np.random.default_rng(seed), [0] * 4))
        a, b = trained(checked, msg), trained(deferred, msg)
        assert a.finite is None and isinstance(a.loss, float)
        assert isinstance(b.loss, torch.Tensor) and b.finite is not None and bool(b.finite)
        assert float(b.loss) == a.loss
    assert same_weights(checked.model, deferred.model)
    assert deferred.heartbeat_info()["mean_rho"] == checked.heartbeat_info()["mean_rho"]
    before = {k: v.clone() for k, v in deferred.model.state_dict().items()}
    arrays = unroll_batch(np.random.default_rng(2), [0] * 4)
    arrays["reward"] = np.full_like(arrays["reward"], 3e38)
    result = trained(deferred, batch(arrays))
    assert result.finite is not None and not bool(result.finite)
    assert all(torch.equal(before[k], v) for k, v in deferred.model.state_dict().items())
    steps = {int(s["step"]) for s in deferred.optimizer.state.values()}
    assert steps == {checked.updates}  # the two good batches' steps only


@pytest.mark.parametrize(
    "change",
    [
        {"action": np.full((2, T), 2, np.int64)},
        {"logp": np.full((2, T), np.inf, np.float32)},
        {"reward": np.ones((2, T), np.float64)},
        {"bootstrap_obs": np.zeros((2, 3), np.float32)},
        {"weights_version": np.zeros(3, np.int64)},
    ],
    ids=["action", "inf", "dtype", "obs-width", "rows"],
)
@pytest.mark.parametrize("algo", UNROLL_UPDATES)
def test_unroll_updates_refuse_malformed_batches(algo: str, change: dict[str, np.ndarray]) -> None:
    update = UNROLL_UPDATES[algo](setup(config(algo)))
    arrays = {**unroll_batch(np.random.default_rng(5), [0, 0]), **change}
    with pytest.raises(P.ProtocolError):
        update.receive(batch(arrays), 0)
    assert update.train(0) is None


@pytest.mark.parametrize("algo", UNROLL_UPDATES)
def test_unroll_updates_state_dict_round_trip(algo: str) -> None:
    cfg = config(algo)
    update = UNROLL_UPDATES[algo](setup(cfg, seed=0))
    trained(update, batch(unroll_batch(np.random.default_rng(6), [0, 0])))
    state = update.state_dict()
    assert set(state) == {"online", "optimizer"}
    other = UNROLL_UPDATES[algo](setup(cfg, seed=1))
    other.load_state_dict({**state, "updates": 5})  # the learner's counters ride along
    assert same_weights(update.model, other.model) and other.updates == 5


# --- Ape-X DDPG / TD3 and SAC -------------------------------------------------------------

CONTINUOUS = [
    pytest.param("apex_ddpg", {"ddpg": {"twin": True, "policy_delay": 2}}, id="td3"),
    pytest.param("apex_ddpg", {}, id="ddpg"),
    pytest.param("sac", {}, id="sac"),
]


def continuous_update(s: LearnerSetup) -> ContinuousUpdate:
    """The update of ``s.config.algo`` (Ape-X DDPG's or SAC's), as the learner builds it."""
    algorithm = get_algorithm(s.config.algo)
    assert algorithm.update is not None
    update = algorithm.update(s)
    assert isinstance(update, ContinuousUpdate)
    return update


@pytest.mark.parametrize(("algo", "sections"), CONTINUOUS)
def test_continuous_trains_and_sends_priorities(algo: str, sections: dict[str, Any]) -> None:
    s = setup(config(algo, **sections))
    update = continuous_update(s)
    rng = np.random.default_rng(7)
    arrays = continuous_batch(rng)
    target_before = [p.clone() for p in update.target_params]
    result = trained(update, batch(arrays))
    assert result.updates == 1 and np.isfinite(result.loss)
    assert result.priorities is not None and result.priorities.shard == SHARD
    np.testing.assert_array_equal(result.priorities.keys, arrays["key"])
    assert result.priorities.priorities.dtype == np.float32
    pairs = list(zip(target_before, update.target_params, strict=True))
    moved = any(not torch.equal(a, b) for a, b in pairs)
    assert moved == (algo == "sac" or not sections)  # TD3's first update is not a delayed step
    trained(update, batch(continuous_batch(rng)))
    pairs = list(zip(target_before, update.target_params, strict=True))
    assert any(not torch.equal(a, b) for a, b in pairs)
    stats = s.train_stats.flush()
    assert {"loss", "critic_loss", "q_mean", "grad_norm", "td_error"} <= set(stats)
    assert set(update.train_info()) == {"lr", "actor_lr"}
    assert "actor_loss" in update.heartbeat_info()
    assert update.summary() == "" and update.may_publish()


def test_continuous_uniform_table_sends_no_priorities() -> None:
    update = continuous_update(setup(config("sac", replay={"table": "uniform"})))
    result = trained(update, batch(continuous_batch(np.random.default_rng(8))))
    assert result.priorities is None and np.isfinite(result.loss)


@pytest.mark.parametrize(
    "change",
    [
        {"action": np.full((B, 1), 2.5, np.float32)},  # Pendulum's torque is in [-2, 2]
        {"action": np.full((B, 1), np.nan, np.float32)},
        {"action": np.zeros((B, 2), np.float32)},
        {"action": np.zeros(B, np.int64)},
        {"obs": np.zeros((B, 3), np.float64)},
        {"next_obs": np.full((B, 3), np.inf, np.float32)},
    ],
    ids=["bounds", "nan-action", "action-width", "discrete-action", "dtype", "inf-obs"],
)
def test_continuous_refuses_malformed_batches(change: dict[str, np.ndarray]) -> None:
    update = continuous_update(setup(config("apex_ddpg")))
    arrays = {**continuous_batch(np.random.default_rng(9)), **change}
    with pytest.raises(P.ProtocolError):
        update.receive(batch(arrays), 0)
    with pytest.raises(P.ProtocolError, match="shard"):
        update.receive(batch(continuous_batch(np.random.default_rng(9)), shard=3), 0)
    assert update.train(0) is None


@pytest.mark.parametrize(("algo", "model"), [("apex_ddpg", "DDPGModel"), ("sac", "SACModel")])
def test_continuous_needs_its_continuous_model(algo: str, model: str) -> None:
    s = setup(config(algo))
    s.model = torch.nn.Linear(3, 1)
    with pytest.raises(ValueError, match=f"{algo} needs zrl's {model}"):
        continuous_update(s)


@pytest.mark.parametrize(("algo", "sections"), CONTINUOUS)
def test_continuous_state_dict_round_trip(algo: str, sections: dict[str, Any]) -> None:
    cfg = config(algo, **sections)
    update = continuous_update(setup(cfg, seed=0))
    trained(update, batch(continuous_batch(np.random.default_rng(10))))
    state = update.state_dict()
    temperature = {"log_alpha", "alpha_optimizer"} if algo == "sac" else set()
    assert set(state) == {"online", "target", "actor_optimizer", "critic_optimizer", *temperature}
    other = continuous_update(setup(cfg, seed=1))
    assert not same_weights(update.online, other.online)
    other.load_state_dict(state)
    assert same_weights(update.online, other.online)
    assert same_weights(update.target, other.target)
    if algo == "sac":
        assert torch.equal(update.log_alpha, other.log_alpha)  # type: ignore[attr-defined]
    else:  # a checkpoint of the time DDPG's update held SAC's (unused) temperature still loads
        other.load_state_dict({**state, "log_alpha": torch.zeros(()), "alpha_optimizer": {}})
        assert same_weights(update.online, other.online)
