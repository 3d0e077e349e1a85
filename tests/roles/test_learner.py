"""``Learner`` in-process with a real parameter server and a fake replay shard.

The fake replay PUSHes BATCH messages of random CartPole-shaped data into the broker's
``batches`` stream; the test watches the parameter server's versions and the PRIORITIES
the learner publishes on ``priorities/replay-0/``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.apex_dqn.update import ApexDQNUpdate
from zrl.algos.appo.update import AppoUpdate
from zrl.algos.impala.update import ImpalaUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.nets.wire import model_to_arrays
from zrl.roles.errors import RoleError
from zrl.roles.learner import Learner
from zrl.roles.params import ParameterServer
from zrl.testing.inproc import InProc, collect
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P

torch.set_num_threads(1)

B = 32
PUBLISH_INTERVAL = 5


def config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "learner-test",
            "seed": 5,
            "env": {"id": "CartPole-v1", "num_envs": 1},
            "model": {"hidden": [16]},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            "learner": {"publish_interval": PUBLISH_INTERVAL, "target_update_interval": 4},
        }
    )


def batch(rng: np.random.Generator, first_key: int, **changes: Any) -> dict[str, np.ndarray]:
    arrays = {
        "obs": rng.standard_normal((B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, B).astype(np.int64),
        "reward": rng.uniform(0, 3, B).astype(np.float32),
        "discount": np.where(rng.random(B) < 0.1, 0.0, 0.99**3).astype(np.float32),
        "next_obs": rng.standard_normal((B, 4)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": rng.uniform(0.1, 1.0, B).astype(np.float32),
        "key": np.arange(first_key, first_key + B, dtype=np.int64),
    }
    arrays.update(changes)
    return {k: v for k, v in arrays.items() if v is not None}


def batch_msg(arrays: dict[str, np.ndarray], shard: Any = "replay-0") -> P.Message:
    meta = {"table_size": 1000} if shard is None else {"shard": shard, "table_size": 1000}
    return P.Message(P.BATCH, meta=meta, arrays=arrays)


@pytest.fixture
def cluster(inproc) -> tuple[InProc, ParameterServer, Learner]:
    inproc.start_broker(config())
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(params, ParameterServer) and isinstance(learner, Learner)
    assert isinstance(learner.update, ApexDQNUpdate)  # the config's default algo
    return inproc, params, learner


def test_learner_publishes_weights_and_priorities(cluster):
    inproc, params, learner = cluster
    # The learner's initial weights are version 1, before any batch.
    wait_for(lambda: params.version == 1 and learner.weights_version == 1, timeout=10)
    initial = {k: np.array(v) for k, v in params.arrays.items()}
    assert set(initial) == set(model_to_arrays(learner.online))
    priorities = inproc.sub(P.priority_topic("replay-0"))
    other_shard = inproc.sub(P.priority_topic("replay-1"))
    batch_acks = inproc.sub(P.batch_ack_topic("replay-0"))
    replay = inproc.push("batches", sender="replay-0")
    for sub in (priorities, other_shard, batch_acks):  # what the learner publishes reaches us
        inproc.wait_subscribed(sub)

    rng = np.random.default_rng(0)
    sent = [batch(rng, 1000 + 100 * i) for i in range(2 * PUBLISH_INTERVAL)]
    for i, arrays in enumerate(sent):
        assert replay.send(batch_msg(arrays))
        if i == PUBLISH_INTERVAL - 2:
            # One update short of the interval: still the initial version.
            wait_for(lambda: learner.updates == PUBLISH_INTERVAL - 1, timeout=10)
            settle(lambda: params.version == 1, 0.3)
    wait_for(lambda: learner.updates == 2 * PUBLISH_INTERVAL, timeout=15)
    # Every publish_interval updates: one more version, acknowledged to the learner.
    wait_for(lambda: params.version == 3 and learner.weights_version == 3, timeout=10)
    # The latest version holds the trained weights, not the initial ones.
    trained = model_to_arrays(learner.online)
    for k, v in trained.items():
        np.testing.assert_array_equal(params.arrays[k], v)
    assert any(not np.array_equal(initial[k], trained[k]) for k in trained)
    assert params.weights_meta.get("updates") == 2 * PUBLISH_INTERVAL

    # One PRIORITIES message per batch, on the shard's own topic, for that batch's keys.
    got = collect(priorities, until=len(sent), timeout=10)
    assert len(got) == len(sent)
    for msg, arrays in zip(got, sent, strict=True):
        assert msg.kind == P.PRIORITIES and msg.sender == "learner-0"
        np.testing.assert_array_equal(msg.arrays["key"], arrays["key"])
        p = msg.arrays["priority"]
        assert p.dtype == np.float32 and p.shape == (B,)
        assert np.all(np.isfinite(p)) and np.all(p >= 0)
        assert np.any(p > 0)
    assert collect(other_shard, quiet=0.2) == []
    # Every batch is acknowledged to its shard by its sequence number (the credit window).
    acks = collect(batch_acks, until=len(sent), timeout=10)
    assert [(m.kind, m.sender, m.meta["seq"]) for m in acks] == [
        (P.ACK, "learner-0", i) for i in range(len(sent))
    ]
    assert learner.heartbeat_info()["updates"] == 2 * PUBLISH_INTERVAL
    assert np.isfinite(learner.heartbeat_info()["loss"])

    # Batches from a second shard get their priorities back on that shard's topic.
    assert replay.send(batch_msg(batch(rng, 5), shard="replay-1"))
    back = collect(other_shard, until=1, timeout=5)
    assert len(back) == 1
    np.testing.assert_array_equal(back[0].arrays["key"], np.arange(5, 5 + B))


def test_malformed_batches_are_dropped_and_learner_goes_on(cluster):
    inproc, params, learner = cluster
    wait_for(lambda: learner.weights_version == 1, timeout=10)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(1)
    bad = [
        batch_msg(batch(rng, 0, weight=None)),  # missing array
        batch_msg(batch(rng, 0, key=None)),
        batch_msg(batch(rng, 0, action=np.zeros(B, np.int32))),  # wrong dtype
        batch_msg(batch(rng, 0, reward=np.zeros((B, 1), np.float32))),  # wrong rank
        batch_msg(batch(rng, 0, discount=np.zeros(B - 1, np.float32))),  # other length
        batch_msg(batch(rng, 0), shard=None),  # no shard id
        batch_msg(batch(rng, 0), shard=7),
        P.Message(P.TRAJECTORY, meta={"shard": "replay-0"}, arrays=batch(rng, 0)),
    ]
    for msg in bad:
        assert replay.send(msg)
    replay.sock.send_multipart([b"not msgpack \xc1"])
    wait_for(lambda: learner.stats.snapshot()["batches"]["dropped"] == len(bad) + 1, timeout=10)
    assert learner.updates == 0
    assert inproc.alive(learner) and inproc.error_of(learner) is None
    # Still learning.
    assert replay.send(batch_msg(batch(rng, 0)))
    wait_for(lambda: learner.updates == 1, timeout=10)
    assert learner.stats.snapshot()["batches"]["received"] == len(bad) + 1
    assert inproc.error_of(learner) is None


@pytest.mark.parametrize("case", ["action out of range", "obs too wide"])
def test_learner_survives_batches_that_do_not_fit_the_model(cluster, case):
    inproc, params, learner = cluster
    wait_for(lambda: learner.weights_version == 1, timeout=10)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(2)
    if case == "action out of range":
        arrays = batch(rng, 0, action=np.full(B, 5, np.int64))
    else:
        wide = rng.standard_normal((B, 7)).astype(np.float32)
        arrays = batch(rng, 0, obs=wide, next_obs=wide)
    assert replay.send(batch_msg(arrays))
    wait_for(
        lambda: learner.stats.snapshot()["batches"]["received"] == 1 or not inproc.alive(learner),
        timeout=10,
    )
    time.sleep(0.3)
    assert inproc.alive(learner) and inproc.error_of(learner) is None
    assert replay.send(batch_msg(batch(rng, 0)))
    wait_for(lambda: learner.updates == 1 or not inproc.alive(learner), timeout=10)
    assert learner.updates == 1


def test_impala_learner_trains_each_batch_epochs_times(inproc):
    """``impala.epochs``: V-trace updates per batch of unrolls; each batch is acknowledged once."""
    cfg = config().model_dump()
    cfg.update(algo="impala", impala={"epochs": 3}, learner={"publish_interval": 1})
    cfg["replay"]["table"] = "fifo"
    inproc.start_broker(ExperimentConfig.model_validate(cfg))
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(learner, Learner) and isinstance(params, ParameterServer)
    update = learner.update
    assert isinstance(update, ImpalaUpdate)
    wait_for(lambda: learner.weights_version == 1, timeout=10)
    batch_acks = inproc.sub(P.batch_ack_topic("replay-0"))
    replay = inproc.push("batches", sender="replay-0")
    inproc.wait_subscribed(batch_acks)
    rng = np.random.default_rng(1)
    U, T = 4, 6
    # What a replay shard's FIFO sends (``zrl.transport.messages.UNROLL_BATCH``).
    unrolls = {
        "obs": rng.standard_normal((U, T, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (U, T)).astype(np.int64),
        "logp": np.full((U, T), np.log(0.5), np.float32),
        "reward": np.ones((U, T), np.float32),
        "terminated": np.zeros((U, T), bool),
        "truncated": np.zeros((U, T), bool),
        "valid": np.ones((U, T), bool),
        "bootstrap_obs": rng.standard_normal((U, 4)).astype(np.float32),
        "weights_version": np.ones(U, np.int64),
        "weight": np.ones(U, np.float32),
        "key": np.arange(U, dtype=np.int64),
    }
    for _ in range(2):
        assert replay.send(P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=unrolls))
    wait_for(lambda: learner.updates == 6 and update.trained_unrolls == 2 * U, timeout=10)
    assert len(collect(batch_acks, until=2, timeout=5)) == 2
    # publish_interval 1: published after every batch's updates (its 3 epochs are one train
    # step of the update, so the weights between them never leave it): versions 2 and 3.
    wait_for(lambda: params.version == 3, timeout=10)
    assert params.weights_meta.get("updates") == 6
    settle(lambda: params.version == 3, 0.3)
    assert update.stale_unrolls == 0


def test_publish_every_s_bounds_the_versions_of_a_fast_learner(inproc):
    """``learner.publish_every_s``: a learner due to publish after every update sends at most
    one version per that many seconds, and the version it held back still reaches params."""
    every = 0.5
    cfg = config().model_dump()
    cfg["learner"].update(publish_interval=1, publish_every_s=every)
    inproc.start_broker(ExperimentConfig.model_validate(cfg))
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(learner, Learner) and isinstance(params, ParameterServer)
    wait_for(lambda: params.version == 1 and learner.weights_version == 1, timeout=10)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(3)
    n = 30
    started = time.monotonic()
    for i in range(n):
        assert replay.send(batch_msg(batch(rng, 100 * i)))
    wait_for(lambda: learner.updates == n, timeout=15)
    took = time.monotonic() - started
    # publish_interval 1 alone: n more versions. Bounded: one per `every` seconds, and one
    # held back that goes out after the last update.
    bound = 1 + took / every + 1
    assert learner.weights_sent <= bound < n
    wait_for(lambda: params.weights_meta.get("updates") == n, timeout=5)
    trained = model_to_arrays(learner.online)
    for k, v in trained.items():
        np.testing.assert_array_equal(params.arrays[k], v)
    settle(lambda: learner.weights_sent <= bound + 1 and not learner.publish_due, 0.3)


def test_learner_reports_where_its_time_goes(inproc):
    """A learner starved of input reports that: ``wait_ms`` (per gradient step) far above
    ``copy_ms`` and ``update_ms``, and most of its time in ``wait_share``."""
    inproc.start_broker(config())
    inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(learner, Learner)
    wait_for(lambda: learner.weights_version == 1, timeout=10)
    metrics = inproc.sub(P.METRICS_TOPIC)
    inproc.wait_subscribed(metrics)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(4)
    for i in range(8):  # a batch every 0.15 s: the update takes a few ms of it
        assert replay.send(batch_msg(batch(rng, 100 * i)))
        time.sleep(0.15)
    wait_for(lambda: learner.updates == 8, timeout=10)
    reports: list[dict[str, Any]] = []

    def a_report_with_figures() -> bool:
        got = metrics.recv()
        if got is not None and got[1].sender == "learner-0":
            reports.append(got[1].meta)
        return bool(reports) and "wait_ms" in reports[-1].get("train", {})

    wait_for(a_report_with_figures, timeout=5, interval=0)
    train = reports[-1]["train"]
    assert {"wait_ms", "copy_ms", "update_ms"} <= set(train)
    assert train["wait_ms"] > 5 * train["update_ms"] and train["wait_ms"] > 5 * train["copy_ms"]
    shares = {k: v for k, v in reports[-1].items() if k.endswith("_share")}
    assert set(shares) == {"wait_share", "copy_share", "update_share", "publish_share"}
    assert shares["wait_share"] > 0.5 > shares["update_share"] + shares["copy_share"]
    assert sum(shares.values()) <= 1.01
    # The seconds behind the shares: two heartbeats give the shares of the time between them.
    seconds = {k: reports[-1][k] for k in ("wait_s", "copy_s", "update_s", "publish_s")}
    stepping = reports[-1]["stepping_s"]
    assert stepping > 0 and sum(seconds.values()) <= stepping * 1.01
    assert abs(seconds["wait_s"] / stepping - shares["wait_share"]) < 0.01
    assert reports[-1]["device"] == "cpu"


class Drops:
    """Stands in for the learner's input: records what it drops (sender, reason)."""

    def __init__(self) -> None:
        self.dropped: list[tuple[str, str]] = []

    def drop(self, sender: str, reason: str) -> None:
        self.dropped.append((sender, reason))


def deferring_appo_learner() -> Learner:
    """An APPO learner without sockets whose update checks finiteness on the device, as on a
    GPU (forced here on the CPU: the same fused Adam skips the step)."""
    cfg = config().model_dump()
    cfg.update(algo="appo", appo={"epochs": 1, "minibatches": 1})
    cfg["replay"].update(table="fifo", batch_size=4)
    cfg["learner"]["publish_interval"] = 10**6  # never due: no parameter server here
    learner = Learner("inproc://unused", index=0)
    learner.config = ExperimentConfig.model_validate(cfg)
    learner.input = Drops()  # type: ignore[assignment]
    probe = gym.make("CartPole-v1")
    learner.update = learner.make_update((probe.observation_space, probe.action_space))
    probe.close()
    assert isinstance(learner.update, AppoUpdate)
    learner.update.defer_checks = True
    return learner


def unrolls(rng: np.random.Generator, reward: float = 1.0) -> P.Message:
    U, T = 4, 6
    arrays = {
        "obs": rng.standard_normal((U, T, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (U, T)).astype(np.int64),
        "logp": np.full((U, T), np.log(0.5), np.float32),
        "reward": np.full((U, T), reward, np.float32),
        "terminated": np.zeros((U, T), bool),
        "truncated": np.zeros((U, T), bool),
        "valid": np.ones((U, T), bool),
        "bootstrap_obs": rng.standard_normal((U, 4)).astype(np.float32),
        "weights_version": np.zeros(U, np.int64),
        "weight": np.ones(U, np.float32),
        "key": np.arange(U, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)


def feed(learner: Learner, msg: P.Message, sender: str) -> None:
    """One learner step's work on one batch: hand it to the update, then train."""
    msg.sender = sender
    learner.hand_over(msg)
    learner.train()


def test_a_learner_counts_an_update_checked_on_the_device_one_update_later():
    """The finite flag of an update is read once the next update is on its way: a finite one
    is counted then, a non-finite one dropped (its sender named) and counted in
    ``non_finite_batches``, its steps skipped; ten in a row still stop the learner."""
    learner = deferring_appo_learner()
    rng = np.random.default_rng(0)
    feed(learner, unrolls(rng), "replay-0")
    assert learner.updates == 0 and learner.unchecked is not None  # not read yet
    before = {k: v.clone() for k, v in learner.online.state_dict().items()}
    feed(learner, unrolls(rng, reward=3e38), "replay-1")  # its loss overflows
    assert learner.updates == 1 and learner.samples_trained == 24  # the first, counted
    assert all(torch.equal(before[k], v) for k, v in learner.online.state_dict().items())
    feed(learner, unrolls(rng), "replay-0")
    assert learner.non_finite_batches == 1 and learner.updates == 1
    assert [s for s, _ in learner.input.dropped] == ["replay-1"]  # type: ignore[attr-defined]
    assert "non-finite loss" in learner.input.dropped[0][1]  # type: ignore[attr-defined]
    learner.settle()
    assert learner.updates == 2 and learner.non_finite_in_a_row == 0
    assert learner.heartbeat_info()["loss"] is not None
    for _ in range(10):
        feed(learner, unrolls(rng, reward=3e38), "replay-1")
    with pytest.raises(RoleError, match="learner-0: .* at update 3 "):
        feed(learner, unrolls(rng, reward=3e38), "replay-1")
    assert learner.diverged and learner.non_finite_batches == 11 and learner.updates == 2


def two_learners(
    inproc: InProc, cfg: dict[str, Any], kind: type
) -> tuple[ParameterServer, Learner, Learner, list[Any]]:
    """Params and learners 0 and 1 of ``cfg`` (``roles.learners: 2``) started in-process
    with a real broker, their group formed and learner 0's first weights acked; their
    updates (each a ``kind``)."""
    cfg["learner"].update(publish_interval=1, group_timeout_s=120)
    inproc.start_broker(ExperimentConfig.model_validate(cfg))
    params = inproc.start(ParameterServer, index=0)
    leader = inproc.start(Learner, index=0)
    follower = inproc.start(Learner, index=1)
    assert isinstance(leader, Learner) and isinstance(follower, Learner)
    assert isinstance(params, ParameterServer)
    ups = [up for up in (leader.update, follower.update) if isinstance(up, kind)]
    assert len(ups) == 2
    wait_for(lambda: all(up.members.ready for up in ups), timeout=120)
    wait_for(lambda: leader.weights_version >= 1, timeout=30)  # the first weights, once formed
    return params, leader, follower, ups


def test_two_appo_learners_form_a_group_and_train_their_own_batches_alike(inproc):
    """``roles.learners: 2`` of APPO, in-process roles with a real broker and parameter
    server: learner 1 finds learner 0's store through a STATUS, the group forms, the batches
    stream deals the batches out to both (each acks its own), both take the same steps on
    the averaged gradients and end with the same weights, bit for bit; only learner 0
    publishes."""
    cfg = config().model_dump()
    cfg.update(algo="appo", appo={"epochs": 2, "minibatches": 2})
    cfg["roles"] = {"actors": 1, "replay": 1, "learners": 2, "params": 1, "evaluator": 0}
    cfg["replay"].update(table="fifo", batch_size=4)
    params, leader, follower, ups = two_learners(inproc, cfg, AppoUpdate)
    batch_acks = inproc.sub(P.batch_ack_topic("replay-0"))
    replay = inproc.push("batches", sender="replay-0")
    inproc.wait_subscribed(batch_acks)
    rng = np.random.default_rng(3)
    for _ in range(4):  # dealt out in turn: two each
        assert replay.send(unrolls(rng))
    # Each trains its two batches (epochs x minibatches steps each), in rounds with the
    # other's batch or, where the other had none for IDLE_ROUND_S, with none: at least 8 steps,
    # the same on both.
    wait_for(
        lambda: [up.trained_unrolls for up in ups] == [8, 8] and leader.updates == follower.updates,
        timeout=120,
    )
    assert leader.updates >= 2 * 2 * 2, leader.updates
    assert len(collect(batch_acks, until=4, timeout=10)) == 4
    mine, theirs = (up.model.state_dict() for up in ups)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    wait_for(lambda: params.version >= 2, timeout=30)  # learner 0's weights after training
    assert follower.weights_sent == 0 and leader.weights_sent >= 2
    beat = follower.heartbeat_info()
    assert (beat["group_rank"], beat["group_size"], beat["weight_drift"]) == (1, 2, 0.0)
    assert beat["group_version"] >= 1 and "group_store" in leader.heartbeat_info()


def test_two_apex_dqn_learners_train_their_own_batches_and_send_their_priorities(inproc):
    """``roles.learners: 2`` of Ape-X DQN, in-process roles with a real broker and parameter
    server: the group forms through the broker, the batches stream deals the prioritized
    batches out to both, each acks its own and sends their new priorities to the shard that
    sampled them, both take the same steps and end with the same weights and targets; only
    learner 0 publishes."""
    cfg = config().model_dump()
    cfg["roles"] = {"actors": 1, "replay": 1, "learners": 2, "params": 1, "evaluator": 0}
    params, leader, follower, ups = two_learners(inproc, cfg, ApexDQNUpdate)
    priorities = inproc.sub(P.priority_topic("replay-0"))
    batch_acks = inproc.sub(P.batch_ack_topic("replay-0"))
    replay = inproc.push("batches", sender="replay-0")
    inproc.wait_subscribed(priorities)
    inproc.wait_subscribed(batch_acks)
    rng = np.random.default_rng(3)
    sent = [batch(rng, first_key=100 * i) for i in range(4)]
    for arrays in sent:  # dealt out in turn: two each
        assert replay.send(batch_msg(arrays))
    # Each trains its two batches, in rounds with the other's batch or, where the other had
    # none for IDLE_ROUND_S, on its last batch with weight 0: the same steps on both.
    wait_for(lambda: leader.samples_trained + follower.samples_trained == 4 * B, timeout=120)
    wait_for(lambda: leader.updates == follower.updates, timeout=60)
    assert len(collect(batch_acks, until=4, timeout=10)) == 4
    got = collect(priorities, until=4, timeout=10)
    keys = sorted(int(m.arrays["key"][0]) for m in got)
    assert keys == [0, 100, 200, 300], keys  # every batch's priorities, each sent once
    for name in ("model", "target"):
        mine, theirs = (getattr(up, name).state_dict() for up in ups)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
    wait_for(lambda: params.version >= 2, timeout=30)  # learner 0's weights after training
    assert follower.weights_sent == 0 and leader.weights_sent >= 2
    beat = follower.heartbeat_info()
    assert (beat["group_rank"], beat["group_size"], beat["weight_drift"]) == (1, 2, 0.0)
