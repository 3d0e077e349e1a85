"""Checkpoints and failure handling of the roles, in-process.

- ReplayServer snapshots: exact round trip (table, priorities, order, counters, limiter,
  sampling rng), atomic writes, ``replay.capacity_bytes``.
- Learner checkpoints: weights, optimizer, counters, and the parameter server's version
  numbering continuing after a resume.
- Non-finite losses: ``dqn_update`` never steps on one; a learner stops with a RoleError.
- Actor env errors, the memory limit, NaN trajectories at the replay.

Every role runs in a thread of this process over ``inproc://`` (``zrl.testing.inproc.InProc``),
which stops every thread and closes every socket at teardown.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import threading
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.apex_dqn.losses import dqn_update
from zrl.algos.api.actor import BasePolicy
from zrl.algos.api.learner import NonFiniteLossError
from zrl.broker.broker import Broker
from zrl.config.experiment import ExperimentConfig, config_from_dict
from zrl.config.factories import Factories
from zrl.envs.vector import EpisodeTracker
from zrl.nets.discrete import QNetwork
from zrl.nets.wire import model_to_arrays
from zrl.replay.snapshot import SnapshotError, load_state, save_state
from zrl.roles.actor import Actor
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.roles.learner import MAX_NON_FINITE_IN_A_ROW, Learner
from zrl.roles.params import ParameterServer
from zrl.roles.replay import ReplayServer
from zrl.roles.trust import load_checkpoint_file
from zrl.testing.fakes import sequences, trajectory
from zrl.testing.inproc import InProc, collect, collect_acking
from zrl.testing.probes import settle, wait_for
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.utils.durable import temporary_path

torch.set_num_threads(1)

FAST_BROKER = {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0}
# One replay item of a 4-wide observation: obs + next_obs (float32), action (int64), reward and
# discount (float32), weights version (int64), plus 16 bytes the shard charges for the key and
# the priority.
ITEM_BYTES = 2 * 4 * 4 + 8 + 4 + 4 + 8 + 16


def make_config(tmp: Path | None = None, **sections: Any) -> ExperimentConfig:
    data: dict[str, Any] = {
        "name": "checkpoint-test",
        "seed": 3,
        # The layout of ``trajectory()`` at a replay shard: 2 CartPole envs, 5 steps.
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "actor": {"trajectory_length": 5},
        "model": {"hidden": [16]},
        "broker": FAST_BROKER,
        "replay": {
            "capacity": 60,
            "min_size": 50,
            "batch_size": 16,
            "samples_per_insert": 4,
            "samples_per_insert_tolerance": 64,
            "n_step": 3,
            "gamma": 0.9,
        },
        # Only explicit saves and the save at teardown: no timer interferes with the test.
        "checkpoint": {"dir": str(tmp) if tmp else None, "interval": 1e6},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ExperimentConfig.model_validate(data)


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Exact equality of nested dicts/lists of arrays, tensors and plain values."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{path}: length differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b)} is not a tensor"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape}"
        assert torch.equal(a, b), f"{path}: tensors differ"
    elif isinstance(a, np.ndarray):
        b = np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape}"
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


# --- replay snapshots ---------------------------------------------------------------------------


@pytest.mark.waits
@pytest.mark.slow
def test_replay_snapshot_round_trip(inproc, tmp_path):
    ckpt = tmp_path / "ckpt"
    inproc.start_broker(make_config(ckpt))
    acks = inproc.sub(P.ack_topic("actor-0"))
    batches = inproc.pull("batches")
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer) and replay.table is not None
    experience = inproc.push("experience", sender="actor-0")
    pub = inproc.pub("learner-0")
    # Subscriptions travel through the XPUB/XSUB device: the shard's acks must reach us, and
    # our priorities and batch acks the shard.
    inproc.wait_subscribed(acks)
    inproc.wait_for_subscriber(P.priority_topic("replay-0"), P.batch_ack_topic("replay-0"), pub=pub)

    # 8 trajectories of 10 items into a capacity of 60: the ring wrapped, 20 items evicted.
    for i in range(8):
        arrays = trajectory(base=10 * i, priority=0.5 + i)
        arrays["priority"] = arrays["priority"] + np.arange(10, dtype=np.float32).reshape(2, 5)
        assert experience.send(P.Message(P.TRAJECTORY, arrays=arrays))
    assert len(collect(acks, until=8, timeout=10)) == 8
    # Let the shard sample everything the rate limiter allows, then it stops by itself.
    sampled = collect_acking(batches, pub, quiet=1.0)
    assert sampled, "the shard sampled nothing"
    wait_for(lambda: replay.heartbeat_info().get("sampling_blocked"), timeout=5)
    settle(lambda: replay.batches_sent == len(sampled), 0.3)
    # New priorities for some live keys (20..79 are live) and one evicted key (skipped).
    update = np.array([0, *range(25, 80, 5)], np.int64)
    pub.send(
        P.Message(
            P.PRIORITIES,
            arrays={
                "key": update.astype(np.int64),
                "priority": np.linspace(0.01, 50.0, len(update)).astype(np.float32),
            },
        ),
        topic=P.priority_topic("replay-0"),
    )
    wait_for(lambda: replay.priority_updates == 1, timeout=5)
    assert replay.stale_priority_keys == 1

    inproc.stop_role(replay)  # teardown writes a snapshot too
    table = replay.table
    assert table is not None and table.size == 60 and table.inserts == 80
    assert table.evicted == 20 and table.samples == 16 * len(sampled)
    path = ckpt / "replay-0.snapshot"
    replay.save_snapshot()
    assert path.is_file()
    assert not temporary_path(path).exists(), "the temporary file was left behind"
    old_table = table.state_dict()
    old_limiter = replay.limiter.state_dict()
    old_rng = copy.deepcopy(replay.rng.bit_generator.state)
    saved = load_state(path)  # numpy .npz: nothing in it is unpickled
    assert_same(saved["table"], old_table, "snapshot.table")
    assert saved["limiter"] == old_limiter and saved["trajectories"] == 8

    # A crash mid-write leaves a partial .tmp: the next shard must ignore it.
    temporary_path(path).write_bytes(b"\x80\x05partial pickle, cut off")
    restored = inproc.start(ReplayServer, index=0)
    assert isinstance(restored, ReplayServer) and restored is not replay
    inproc.stop_role(restored)  # nothing reached it: its state is exactly what it loaded
    assert restored.table is not None
    assert_same(restored.table.state_dict(), old_table, "restored.table")
    assert restored.limiter.state_dict() == old_limiter
    assert restored.limiter.inserts == 80 and restored.limiter.samples == 16 * len(sampled)
    assert restored.rng.bit_generator.state == old_rng
    assert restored.trajectories == 8 and restored.snapshots == 1
    assert not temporary_path(path).exists()

    # The same rng draws the same batches from both tables.
    for seed in (0, 1, 2):
        a = replay.table.sample(16, np.random.default_rng(seed))
        b = restored.table.sample(16, np.random.default_rng(seed))
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
        assert_same(a.items, b.items, "batch")
    # And the restored server's own rng continues the old one's sequence.
    np.testing.assert_array_equal(replay.rng.random(5), restored.rng.random(5))


def test_replay_snapshot_round_trip_of_r2d2_sequences_and_their_states(inproc, tmp_path):
    """A prioritized table of R2D2 sequences: the stored recurrent states, masks and episode
    starts come back exactly, with the priorities the actor sent."""
    ckpt = tmp_path / "ckpt"
    cfg = make_config(
        ckpt, replay={"table": "prioritized", "min_size": 1000}, env={"id": "zrl/CartPoleNoVel-v1"}
    )
    cfg = config_from_dict(
        cfg.model_dump(mode="json"),
        [
            "algo=r2d2",
            "model.core=lstm",
            "model.core_size=8",
            "r2d2.sequence_length=6",
            "r2d2.burn_in=2",
        ],
    )
    inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    sent = [sequences(n, seed=n) for n in (3, 0, 5)]  # a trajectory may complete no sequence
    for i, arrays in enumerate(sent):
        arrays["priority"] = np.arange(len(arrays["priority"]), dtype=np.float32) + i
        assert experience.send(P.Message(P.TRAJECTORY, arrays=arrays))
    assert len(collect(acks, until=3, timeout=10)) == 3
    inproc.stop_role(replay)  # teardown writes the snapshot
    table = replay.table
    assert table is not None and table.size == 8
    restored = inproc.start(ReplayServer, index=0)
    inproc.stop_role(restored)
    assert isinstance(restored, ReplayServer) and restored.table is not None
    assert_same(restored.table.state_dict(), table.state_dict(), "restored.table")
    stored = restored.table.sample(8, np.random.default_rng(0)).items
    assert stored["state"].shape == (8, 16) and stored["first"].shape == (8, 7)
    states = np.concatenate([arrays["state"] for arrays in sent])
    assert {tuple(s) for s in stored["state"]} <= {tuple(s) for s in states}
    assert set(stored["weights_version"].tolist()) == {1}  # as the sequences carried it

    # A snapshot from before items kept their weights version loads; its items' is unknown
    # (-1, left out of the learners' policy lag), and new sequences keep theirs.
    path = ckpt / "replay-0.snapshot"
    old = load_state(path)
    del old["table"]["columns"]["weights_version"]
    save_state(path, old)
    upgraded = inproc.start(ReplayServer, index=0)
    assert isinstance(upgraded, ReplayServer) and upgraded.table is not None
    assert upgraded.table.size == 8
    new = sequences(2, seed=9)
    new["weights_version"] = np.full(2, 4, np.int64)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=new))
    assert len(collect(acks, until=1, timeout=10)) == 1
    inproc.stop_role(upgraded)
    batch = upgraded.table.sample(64, np.random.default_rng(0))
    np.testing.assert_array_equal(
        batch.items["weights_version"], np.where(batch.keys >= 8, 4, M.UNKNOWN_VERSION)
    )


def test_replay_without_checkpoint_dir_writes_nothing(inproc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inproc.start_broker(make_config(None))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer) and replay.snapshot_path is None
    experience = inproc.push("experience", sender="actor-0")
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    wait_for(lambda: replay.trajectories == 1, timeout=5)
    inproc.stop_role(replay)
    replay.save_snapshot()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("capacity", "capacity_bytes", "expected"),
    [
        (1000, 30 * ITEM_BYTES + ITEM_BYTES - 1, 30),  # the byte budget decides
        (20, 1000 * ITEM_BYTES, 20),  # the item count decides
        (1000, ITEM_BYTES - 1, 1),  # less than one item: still one
    ],
)
def test_replay_capacity_bytes(inproc, capacity, capacity_bytes, expected):
    inproc.start_broker(
        make_config(replay={"capacity": capacity, "capacity_bytes": capacity_bytes, "min_size": 1})
    )
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    # The item size follows from the env's spaces: the table is allocated at setup.
    assert replay.table.capacity == expected and replay.heartbeat_info()["capacity"] == expected
    schema = replay.table.schema
    assert replay.size == 0 and sum(d.itemsize * np.prod(s) for d, s in schema.values()) == (
        ITEM_BYTES - 16
    )
    acks = inproc.sub(P.ack_topic("actor-0"))
    inproc.pull("batches")
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    for i in range(5):  # 50 items
        assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10 * i)))
    assert len(collect(acks, until=5, timeout=10)) == 5
    assert replay.table is not None
    assert replay.table.capacity == expected == min(capacity, max(1, capacity_bytes // ITEM_BYTES))
    assert replay.size == min(50, expected)
    assert replay.heartbeat_info()["capacity"] == expected


# --- learner checkpoints ------------------------------------------------------------------------

B = 32


def batch(rng: np.random.Generator, first_key: int = 0) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, B).astype(np.int64),
        "reward": rng.uniform(0, 3, B).astype(np.float32),
        "discount": np.full(B, 0.99**3, np.float32),
        "next_obs": rng.standard_normal((B, 4)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": rng.uniform(0.1, 1.0, B).astype(np.float32),
        "key": np.arange(first_key, first_key + B, dtype=np.int64),
    }


def batch_msg(arrays: dict[str, np.ndarray]) -> P.Message:
    return P.Message(P.BATCH, meta={"shard": "replay-0", "table_size": 1000}, arrays=arrays)


def learner_config(ckpt: Path) -> ExperimentConfig:
    return make_config(ckpt, learner={"publish_interval": 5, "target_update_interval": 5})


def settled(learner: Learner, params: ParameterServer) -> bool:
    """Every weights update the learner sent is acknowledged."""
    return learner._unacked_since is None and learner.weights_version == params.version


def test_learner_checkpoint_round_trip_and_versions_continue(inproc, tmp_path):
    ckpt = tmp_path / "ckpt"
    inproc.start_broker(learner_config(ckpt))
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(params, ParameterServer) and isinstance(learner, Learner)
    assert learner.resumed_from is None
    wait_for(lambda: params.version == 1 and learner.weights_version == 1, timeout=10)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(0)
    for i in range(12):
        assert replay.send(batch_msg(batch(rng, 100 * i)))
    wait_for(lambda: learner.updates == 12, timeout=20)
    # Versions 2 and 3 were sent at updates 5 and 10.
    wait_for(lambda: params.version == 3 and settled(learner, params), timeout=10)

    inproc.stop_role(learner)  # a graceful stop saves a checkpoint
    path = ckpt / "learner-0.pt"
    assert path.is_file() and not (ckpt / "learner-0.tmp").exists()
    assert learner.checkpoints == 1
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert saved["updates"] == 12 and saved["weights_version"] == 3
    online = copy.deepcopy(learner.online.state_dict())
    target = copy.deepcopy(learner.update.target.state_dict())
    optimizer = copy.deepcopy(learner.update.optimizer.state_dict())
    # The target was copied at update 10, two updates ago: it is not the online network.
    assert any(not torch.equal(online[k], target[k]) for k in online)
    assert optimizer["state"], "Adam has no state after 12 updates"

    # A fresh parameter server (version 0) and a fresh learner that resumes.
    inproc.stop_role(params)
    params2 = inproc.start(ParameterServer, index=0)
    learner2 = inproc.start(Learner, index=0)
    assert isinstance(params2, ParameterServer) and isinstance(learner2, Learner)
    assert learner2.resumed_from == 12 and learner2.updates == 12
    assert_same(learner2.online.state_dict(), online, "online")
    assert_same(learner2.update.target.state_dict(), target, "target")
    assert_same(learner2.update.optimizer.state_dict(), optimizer, "optimizer")
    # Its first WEIGHTS continues the numbering: saved version + 1, not 1.
    wait_for(lambda: params2.version > 0 and settled(learner2, params2), timeout=10)
    assert params2.version == saved["weights_version"] + 1 == 4
    assert learner2.weights_version == 4
    assert_same(dict(params2.arrays), model_to_arrays(learner.online), "published")
    assert params2.weights_meta.get("updates") == 12

    # It goes on training from there.
    for i in range(5):
        assert replay.send(batch_msg(batch(rng, 5000 + 100 * i)))
    wait_for(lambda: learner2.updates == 17, timeout=20)
    wait_for(lambda: params2.version == 5 and settled(learner2, params2), timeout=10)
    assert inproc.error_of(learner2) is None


# --- non-finite losses --------------------------------------------------------------------------


def tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in arrays.items() if k != "key"}


def update(net: QNetwork, target: QNetwork, opt: torch.optim.Optimizer, b: dict) -> Any:
    return dqn_update(net, target, opt, b, double=True, huber_delta=1.0, grad_clip=10.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reward", np.nan),
        ("reward", np.inf),
        ("weight", np.nan),
        ("next_obs", np.nan),
        ("obs", np.inf),
        ("obs", 3e38),
    ],
)
def test_dqn_update_non_finite_loss_leaves_model_untouched(field, value):
    torch.manual_seed(0)
    net, target = QNetwork(4, 2, [16]), QNetwork(4, 2, [16])
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    update(net, target, opt, tensors(batch(rng)))  # Adam has state now
    before = copy.deepcopy(net.state_dict())
    opt_before = copy.deepcopy(opt.state_dict())
    target_before = copy.deepcopy(target.state_dict())
    bad = batch(rng)
    bad[field] = bad[field].copy()
    bad[field][3] = value
    with pytest.raises(NonFiniteLossError) as err:
        update(net, target, opt, tensors(bad))
    assert not np.isfinite(err.value.loss) or not np.isfinite(err.value.grad_norm)
    assert "non-finite loss" in str(err.value)
    assert_same(net.state_dict(), before, "online")
    assert_same(target.state_dict(), target_before, "target")
    assert_same(opt.state_dict(), opt_before, "optimizer")
    # A good batch afterwards trains normally.
    result = update(net, target, opt, tensors(batch(rng)))
    assert np.isfinite(result.loss)
    assert any(not torch.equal(before[k], v) for k, v in net.state_dict().items())


def poison(learner: Learner) -> None:
    """Make the learner's own network produce NaN (a diverged model)."""
    with torch.no_grad():
        learner.online.advantage_head.bias[0] = float("nan")


@pytest.fixture
def learning(inproc, tmp_path) -> tuple[InProc, ParameterServer, Learner, Any, Path]:
    ckpt = tmp_path / "ckpt"
    inproc.start_broker(learner_config(ckpt))
    params = inproc.start(ParameterServer, index=0)
    learner = inproc.start(Learner, index=0)
    assert isinstance(params, ParameterServer) and isinstance(learner, Learner)
    replay = inproc.push("batches", sender="replay-0")
    rng = np.random.default_rng(1)
    for i in range(6):
        assert replay.send(batch_msg(batch(rng, 100 * i)))
    wait_for(lambda: learner.updates == 6, timeout=20)
    wait_for(lambda: params.version == 2 and settled(learner, params), timeout=10)
    return inproc, params, learner, replay, ckpt


def send_until_stopped(inproc: InProc, learner: Learner, replay: Any) -> None:
    """Feed poisoned-model batches: one non-finite loss is dropped, a run of them stops it."""
    rng = np.random.default_rng(2)
    for i in range(MAX_NON_FINITE_IN_A_ROW):
        msg = batch_msg(batch(rng, 9000 + i))
        wait_for(lambda msg=msg: replay.send(msg), timeout=5)
    wait_for(lambda: not inproc.alive(learner), timeout=10)


def test_learner_stops_on_non_finite_loss_and_published_weights_stay(learning):
    inproc, params, learner, replay, _ = learning
    published = {k: np.array(v) for k, v in params.arrays.items()}
    poison(learner)
    send_until_stopped(inproc, learner, replay)
    err = inproc.error_of(learner)
    assert isinstance(err, RoleError), repr(err)
    msg = str(err)
    assert "non-finite loss" in msg and "at update 7" in msg and "replay-0" in msg
    assert "v2 intact" in msg
    # Nothing was applied or published: the same version with the same finite weights.
    assert learner.updates == 6 and learner.weights_version == 2
    settle(lambda: params.version == 2, 0.5)
    assert_same(dict(params.arrays), published, "published")
    assert all(np.all(np.isfinite(v)) for v in params.arrays.values())
    assert inproc.alive(params)


# Regression (found here, since fixed): learner.py Learner.teardown: saves a checkpoint after the
# NonFiniteLossError too, overwriting the last good checkpoint with the diverged weights; a
# restart then resumes into the same NaN
def test_learner_non_finite_loss_keeps_last_good_checkpoint(learning):
    inproc, params, learner, replay, ckpt = learning
    learner.save_checkpoint()  # the last good checkpoint (the learner idles meanwhile)
    good = torch.load(ckpt / "learner-0.pt", map_location="cpu", weights_only=False)
    poison(learner)
    send_until_stopped(inproc, learner, replay)
    assert isinstance(inproc.error_of(learner), RoleError)
    after = torch.load(ckpt / "learner-0.pt", map_location="cpu", weights_only=False)
    assert all(torch.isfinite(v).all() for v in after["online"].values()), "NaN checkpointed"
    assert_same(after["online"], good["online"], "online")


# --- actor env errors ---------------------------------------------------------------------------

FLAKY_EVERY = 50


class FlakyEnv(gym.Wrapper):
    """CartPole whose step raises on every FLAKY_EVERY-th call."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.calls = 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        if self.calls % FLAKY_EVERY == 0:
            raise RuntimeError(f"flaky env: step call {self.calls}")
        return self.env.step(action)


def make_flaky_env() -> gym.Env:
    return FlakyEnv(gym.make("CartPole-v1"))


E, T = 4, 8


def actor_config() -> ExperimentConfig:
    return make_config(env={"num_envs": E}, roles={"actors": 1}, actor={"trajectory_length": T})


def start_broker_with(inproc: InProc, cfg: ExperimentConfig, factories: Factories) -> Broker:
    """InProc.start_broker, with factories (pickled callables are fine over inproc)."""
    inproc.broker = Broker(inproc.addr, cfg, ctx=inproc.ctx, factories=factories)
    inproc._broker_thread = threading.Thread(
        target=inproc.broker.run, name="test-broker", daemon=True
    )
    inproc._broker_thread.start()
    return inproc.broker


def check_trajectory(m: P.Message) -> None:
    a = m.arrays
    assert m.kind == P.TRAJECTORY and m.sender == "actor-0"
    assert {k: v.shape for k, v in a.items()} == {
        "obs": (E, T, 4),
        "action": (E, T),
        "reward": (E, T),
        "terminated": (E, T),
        "truncated": (E, T),
        "valid": (E, T),
        "next_obs": (E, T, 4),
        "priority": (E, T),
    }
    for name in ("obs", "next_obs", "reward", "priority"):
        assert np.all(np.isfinite(a[name])), name
    np.testing.assert_array_equal(a["next_obs"][:, :-1], a["obs"][:, 1:])
    done = a["terminated"] | a["truncated"]
    np.testing.assert_array_equal(a["valid"][:, 1:], ~done[:, :-1])
    assert np.all(a["reward"][a["valid"]] == 1.0) and np.all(a["reward"][~a["valid"]] == 0.0)
    assert np.all(a["priority"] >= 0) and np.all(a["priority"][~a["valid"]] == 0)
    assert not np.any(done[~a["valid"]])


def test_actor_survives_env_errors(inproc):
    start_broker_with(inproc, actor_config(), Factories(env=make_flaky_env))
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    assert all(isinstance(env, FlakyEnv) for env in actor.envs.envs)  # our factory is used
    pub = inproc.pub("replay-0")
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)  # the actor's, via the device

    trajs: list[P.Message] = []

    def progressed() -> bool:
        got = experience.recv()
        if got is not None:
            trajs.append(got[1])
            pub.send(
                P.Message(P.ACK, meta={"seq": got[1].seq, "inserted": 1, "incarnation": 1}),
                topic=P.ack_topic("actor-0"),
            )
        return (actor.env_errors >= 6 and len(trajs) >= 40) or not inproc.alive(actor)

    wait_for(progressed, timeout=60, interval=0)
    assert inproc.alive(actor) and inproc.error_of(actor) is None
    assert actor.heartbeat_info()["env_errors"] == actor.env_errors >= 6
    # Stop it, acknowledging what it still sends so its end-of-stream wait ends at once.
    actor.request_stop()
    wait_for(lambda: progressed() and not inproc.alive(actor), timeout=10, interval=0)
    assert inproc.error_of(actor) is None
    # The partial trajectories were dropped before sending: no sequence number is missing.
    assert [m.seq for m in trajs] == list(range(len(trajs)))
    for m in trajs:
        check_trajectory(m)
    # Consecutive trajectories continue each other, except across an env error, after which
    # every env starts from a reset (nothing is marked as the step after an episode end).
    restarts = 0
    for prev, m in zip(trajs, trajs[1:], strict=False):
        if np.array_equal(m.arrays["obs"][:, 0], prev.arrays["next_obs"][:, -1]):
            done = prev.arrays["terminated"][:, -1] | prev.arrays["truncated"][:, -1]
            np.testing.assert_array_equal(m.arrays["valid"][:, 0], ~done)
        else:
            restarts += 1
            assert m.arrays["valid"][:, 0].all()
            assert np.all(np.abs(m.arrays["obs"][:, 0]) <= 0.05)  # CartPole's reset range
    assert 1 <= restarts <= actor.env_errors
    # env_steps counts only what was sent.
    assert trajs[-1].meta["env_steps"] == sum(int(m.arrays["valid"].sum()) for m in trajs)


# Regression (found here, since fixed): actor.py Actor.on_env_error: resets the envs but not the
# EpisodeTracker, so the aborted episodes' partial return and length are added to the next
# episodes
def test_actor_env_error_forgets_the_aborted_episodes():
    actor = Actor("inproc://zrl-test-unused", index=0)
    actor.config = actor_config()
    actor.factories = Factories(env=make_flaky_env)
    actor.envs = actor.make_envs()

    class Policy(BasePolicy):
        started: list[list[int]] = []

        def episodes_started(self, envs: np.ndarray) -> None:
            self.started.append(envs.tolist())

    actor.policy = Policy()  # type: ignore[assignment]
    try:
        actor.num_envs, actor.seed, actor.env_errors = E, 0, 0
        actor.episodes = EpisodeTracker(E)
        # Five steps into an episode in every env...
        ones = np.ones((E, 5), bool)
        actor.episodes.update_trajectory(np.ones((E, 5), np.float32), ~ones, ones)
        assert np.all(actor.episodes.running_length == 5)
        actor.on_env_error(RuntimeError("boom"))
        assert actor.env_errors == 1
        # ...which ended with the reset: the next episode starts from zero.
        np.testing.assert_array_equal(actor.episodes.running_return, np.zeros(E))
        np.testing.assert_array_equal(actor.episodes.running_length, np.zeros(E))
        # A recurrent policy hears that every env starts an episode (its state is zeroed).
        assert Policy.started == [list(range(E))]
    finally:
        actor.envs.close()


# --- memory limit -------------------------------------------------------------------------------


def test_check_memory_names_the_limit():
    role = Role("inproc://zrl-test-unused", index=0)
    role.config = make_config(limits={"memory_mb": 1})
    with pytest.raises(RoleError, match=r"role-0 uses \d+ MB of memory, above limits\.memory_mb=1"):
        role.check_memory()
    role.config = make_config(limits={"memory_mb": 1e6})
    rss = role.check_memory()
    assert 1 < rss < 1e6
    role.config = make_config()
    assert role.check_memory() > 1


def test_role_over_its_memory_limit_stops_with_role_error(inproc):
    inproc.start_broker(make_config(limits={"memory_mb": 1}))
    role = Role(inproc.addr, index=0, ctx=inproc.ctx, connect_timeout=10)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            role.run()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, name="test-memory-role", daemon=True)
    t.start()
    try:
        t.join(15)
        assert not t.is_alive(), "the role did not stop"
    finally:
        role.request_stop()
        t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], RoleError), errors
    assert "limits.memory_mb=1" in str(errors[0])
    assert inproc.broker is not None
    # It said goodbye on its way out.
    wait_for(lambda: inproc.broker.roles["role-0"].state == "stopped", timeout=5)


# --- NaN experience at the replay ---------------------------------------------------------------


def test_replay_drops_nan_trajectories_and_keeps_serving(inproc):
    inproc.start_broker(make_config(replay={"capacity": 1000, "min_size": 30}))
    acks = inproc.sub(P.ack_topic("actor-0"))
    batches = inproc.pull("batches")
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)

    def with_value(name: str, value: float) -> dict[str, np.ndarray]:
        a = trajectory(base=1000)
        a[name] = a[name].copy()
        a[name][1, 2] = value
        return a

    bad = [
        with_value("obs", np.nan),
        with_value("next_obs", np.inf),
        with_value("reward", np.nan),
        with_value("obs", -np.inf),
    ]
    good = [trajectory(base=10 * i) for i in range(4)]
    order = [good[0], bad[0], bad[1], good[1], bad[2], good[2], bad[3], good[3]]
    for arrays in order:
        assert experience.send(P.Message(P.TRAJECTORY, arrays=arrays))
    got = collect(acks, until=4, timeout=10)
    # Only the good ones are acknowledged (the others' sequence numbers are skipped).
    assert [m.meta["seq"] for m in got] == [0, 3, 5, 7]
    stats = replay.stats.snapshot()["experience"]
    # Decodable but refused: received *and* dropped.
    assert stats == {"sent": 0, "received": 8, "dropped": 4, "gaps": 0}
    assert replay.trajectories == 4 and replay.table is not None and replay.table.size == 40
    assert np.all(np.isfinite(replay.table.state_dict()["columns"]["obs"]))
    # Keeps serving: batches of finite data flow.
    out = collect(batches, until=2, timeout=10)
    assert len(out) == 2
    for b in out:
        for name in ("obs", "next_obs", "reward"):
            assert np.all(np.isfinite(b.arrays[name]))
    assert inproc.alive(replay) and inproc.error_of(replay) is None


def test_one_batch_with_a_non_finite_loss_is_dropped_not_fatal(learning):
    inproc, params, learner, replay, _ = learning
    dropped = learner.stats.snapshot()["batches"]["dropped"]
    huge = batch(np.random.default_rng(3), 7000)
    huge["obs"] = np.full_like(huge["obs"], 3e38)  # finite, but the loss overflows
    assert replay.send(batch_msg(huge))
    wait_for(lambda: learner.stats.snapshot()["batches"]["dropped"] == dropped + 1, timeout=10)
    assert inproc.alive(learner) and learner.updates == 6
    assert replay.send(batch_msg(batch(np.random.default_rng(4), 8000)))
    wait_for(lambda: learner.updates == 7, timeout=10)


# --- files a forged WELCOME could point at (issue 12): never unpickled ---------------------------


class Exploit:
    """Unpickling this creates ``marker``: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_replay_snapshot_that_is_a_pickle_is_not_executed(inproc, tmp_path, caplog):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    ckpt.mkdir()
    path = ckpt / "replay-0.snapshot"
    path.write_bytes(pickle.dumps({"capacity": Exploit(marker)}))
    with pytest.raises(SnapshotError, match="replay-0.snapshot"):
        load_state(path)
    # An .npz whose array is a pickled object array: refused as well.
    odd = tmp_path / "odd.npz"
    np.savez(
        odd,
        __state__=np.array('{"x": {"__array__": "a0"}}'),
        a0=np.array([Exploit(marker)], dtype=object),
    )
    with pytest.raises(SnapshotError, match="odd.npz"):
        load_state(odd)
    assert not marker.exists()

    # The shard itself: the file is moved aside, the shard starts empty and keeps serving.
    inproc.start_broker(make_config(ckpt))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    assert not marker.exists()
    assert replay.size == 0 and replay.trajectories == 0
    (aside,) = ckpt.glob("replay-0.snapshot.refused-*")
    assert not path.exists() and replay.heartbeat_info()["snapshot_refused"] == str(aside)
    assert "cannot restore" in caplog.text and "replay-0.snapshot" in caplog.text
    experience = inproc.push("experience", sender="actor-0")
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    wait_for(lambda: replay.trajectories == 1, timeout=5)
    assert inproc.error_of(replay) is None


def test_learner_checkpoint_that_would_run_code_is_refused(inproc, tmp_path):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    ckpt.mkdir()
    torch.save({"online": Exploit(marker), "updates": 1}, ckpt / "learner-0.pt")
    with pytest.raises(RoleError, match="without running code"):
        load_checkpoint_file(ckpt / "learner-0.pt")  # what params (A3C) loads with, too
    inproc.start_broker(learner_config(ckpt))
    learner = Learner(inproc.addr, index=0, ctx=inproc.ctx, connect_timeout=10)
    with pytest.raises(RoleError, match="learner-0.pt is not a checkpoint zrl can load"):
        learner.run()
    assert not marker.exists()
    assert (ckpt / "learner-0.pt").is_file()  # left for the user to look at


def test_saved_model_loads_without_pickle_and_a_pickle_is_not_executed(tmp_path):
    from zrl.roles.evaluation import load_policy

    cfg = make_config(None)
    model = QNetwork(4, 2, hidden=tuple(cfg.model.hidden))
    # The format the supervisor writes (Supervisor._save_model): tensors and strings only.
    torch.save(
        {
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "version": 3,
            "config": json.dumps(cfg.model_dump(mode="json")),
            "factory_refs": {},
        },
        tmp_path / "model.pt",
    )
    loaded, loaded_cfg, _ = load_policy(tmp_path)
    assert loaded_cfg.name == cfg.name
    assert_same(loaded.state_dict(), model.state_dict(), "model")

    marker = tmp_path / "pwned"
    torch.save({"weights": Exploit(marker), "config": "{}"}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="model.pt is not a model zrl saved: Unpickling"):
        load_policy(tmp_path)
    assert not marker.exists()


# --- never overwrite what could not be read; bounded loading (issue 27) -------------------------


def npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return out.getvalue()


def npz_with(path: Path, state: str, arrays: dict[str, tuple[bytes, int]]) -> None:
    """An .npz of a ``__state__`` string and raw entries: name -> (npy header, data bytes of
    zeros), compressed (a zip bomb when the zeros are many)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        buf = io.BytesIO()
        np.save(buf, np.array(state))
        zf.writestr("__state__.npy", buf.getvalue())
        for name, (header, zeros) in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                f.write(header)
                chunk = bytes(1 << 20)
                for start in range(0, zeros, len(chunk)):
                    f.write(chunk[: min(len(chunk), zeros - start)])


def valid_snapshot_state(capacity: int = 60) -> dict[str, Any]:
    from zrl.replay.rate_limiter import RateLimiter
    from zrl.replay.tables import make_table

    table = make_table("prioritized", capacity)
    return {
        "capacity": capacity,
        "table": table.state_dict(),
        "limiter": RateLimiter(50, 4.0, 64.0).state_dict(),
        "rng": np.random.default_rng(0).bit_generator.state,
        "trajectories": 0,
    }


ZEROS_MB = 128


def write_hostile_snapshot(path: Path, kind: str) -> None:
    if kind == "deep":  # JSON a hundred thousand lists deep: a RecursionError to parse
        npz_with(path, "[" * 100_000 + "]" * 100_000, {})
    elif kind == "zip bomb":  # 128 MB of zeros in a few hundred KB
        n = ZEROS_MB << 20
        npz_with(path, '{"table": {"__array__": "a0"}}', {"a0": (npy_header((n,), "|u1"), n)})
    elif kind == "huge header":  # 8 bytes of data, a header that declares 8 TB
        npz_with(path, '{"table": {"__array__": "a0"}}', {"a0": (npy_header((10**12,)), 8)})
    elif kind == "capacity":  # a few bytes that ask for a table of a billion items
        state = valid_snapshot_state()
        state["capacity"] = state["table"]["capacity"] = 10**9
        save_state(path, state)
    elif kind == "frames":  # another layout: a frame table on a CartPole shard
        from zrl.replay.frames import FrameTable

        frames = FrameTable.for_budget("uniform", 20, None, (8, 8), 4, 5)
        save_state(path, {**valid_snapshot_state(), "table": frames.state_dict()})
    elif kind == "truncated":
        save_state(path, valid_snapshot_state())
        path.write_bytes(path.read_bytes()[:300])


@pytest.mark.parametrize(
    "kind", ["deep", "zip bomb", "huge header", "capacity", "frames", "truncated"]
)
def test_a_replay_snapshot_it_cannot_load_is_moved_aside_never_overwritten(inproc, tmp_path, kind):
    """A hostile or damaged snapshot costs no more memory than the table the config allows,
    is moved aside (not written over at teardown), the heartbeat names it, and the shard
    starts empty and serves."""
    import tracemalloc

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = ckpt / "replay-0.snapshot"
    write_hostile_snapshot(path, kind)
    original = path.read_bytes()
    inproc.start_broker(make_config(ckpt))
    acks = inproc.sub(P.ack_topic("actor-0"))
    tracemalloc.start()
    try:
        replay = inproc.start(ReplayServer, index=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(replay, ReplayServer) and inproc.error_of(replay) is None
    assert peak < 16 << 20, f"loading the {kind} snapshot took {peak / 2**20:.0f} MB"
    (aside,) = ckpt.glob("replay-0.snapshot.refused-*")
    assert aside.read_bytes() == original and not path.exists()
    assert replay.heartbeat_info()["snapshot_refused"] == str(aside)
    assert replay.size == 0 and replay.trajectories == 0
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    assert len(collect(acks, until=1, timeout=10)) == 1
    inproc.stop_role(replay)  # teardown snapshots the new table to the path, not the aside
    assert aside.read_bytes() == original
    assert load_state(path)["trajectories"] == 1
    restored = inproc.start(ReplayServer, index=0)
    assert isinstance(restored, ReplayServer) and restored.size == 10
    assert "snapshot_refused" not in restored.heartbeat_info()


def write_hostile_checkpoint(path: Path, kind: str) -> None:
    if kind == "truncated":
        torch.save({"updates": 3, "w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:700])
    elif kind == "zip bomb":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            with zf.open("learner-0/data.pkl", "w", force_zip64=True) as f:
                for _ in range(ZEROS_MB):
                    f.write(bytes(1 << 20))
    elif kind == "not ours":  # loads without running code, but is no learner's checkpoint
        torch.save({"updates": 3}, path)


@pytest.mark.parametrize("kind", ["truncated", "zip bomb", "not ours"])
def test_a_learner_checkpoint_it_cannot_load_is_kept_and_refused_again(inproc, tmp_path, kind):
    """The learner stops naming the file, saves nothing over it at teardown, and a restart
    refuses it again: the run fails instead of training afresh from update 0."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = ckpt / "learner-0.pt"
    write_hostile_checkpoint(path, kind)
    original = path.read_bytes()
    inproc.start_broker(learner_config(ckpt))
    for _ in range(2):  # the first start, and the supervisor's restart
        learner = Learner(inproc.addr, index=0, ctx=inproc.ctx, connect_timeout=10)
        with pytest.raises(RoleError, match="learner-0.pt") as err:
            learner.run()
        assert "move it away" in str(err.value)
        assert path.read_bytes() == original and learner.checkpoints == 0
        assert list(ckpt.iterdir()) == [path]


def test_a_truncated_model_and_a_bad_progress_row_name_their_file(tmp_path):
    from zrl.roles.evaluation import load_policy
    from zrl.run.metrics import read_csv

    model = tmp_path / "model.pt"
    torch.save({"weights": {"w": torch.zeros(1000)}, "config": "{}"}, model)
    model.write_bytes(model.read_bytes()[:600])
    with pytest.raises(ValueError, match=f"{model} is not a model zrl saved"):
        load_policy(tmp_path)
    progress = tmp_path / "progress.csv"
    progress.write_text("time,env_steps\n1.0,100\n2.0,lots\n")
    with pytest.raises(ValueError, match=f"{progress}, line 3: could not convert"):
        read_csv(progress)


A3C = ["algo=a3c", "roles.replay=0", "roles.learners=0"]


def test_an_a3c_parameter_server_keeps_a_checkpoint_it_cannot_load(inproc, tmp_path):
    """A3C's params owns the model: the same rule as the learner's."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = ckpt / "params-0.pt"
    write_hostile_checkpoint(path, "truncated")
    original = path.read_bytes()
    inproc.start_broker(config_from_dict(make_config(ckpt).model_dump(mode="json"), A3C))
    params = ParameterServer(inproc.addr, index=0, ctx=inproc.ctx, connect_timeout=10)
    with pytest.raises(RoleError, match="params-0.pt is not a checkpoint zrl can load"):
        params.run()
    assert path.read_bytes() == original and list(ckpt.iterdir()) == [path]


def test_a_snapshot_taken_before_the_first_insert_restores_into_the_layout(inproc, tmp_path):
    """A snapshot of an empty table written before tables were allocated at setup (no
    columns): restored, its table takes the layout's columns and then real trajectories."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_state(ckpt / "replay-0.snapshot", valid_snapshot_state())
    inproc.start_broker(make_config(ckpt))
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer) and replay.snapshot_refused is None
    assert replay.table.capacity == 60 and set(replay.table.schema) == {
        "obs",
        "action",
        "reward",
        "discount",
        "next_obs",
        "weights_version",
    }
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory()))
    assert len(collect(acks, until=1, timeout=10)) == 1 and replay.size == 10
