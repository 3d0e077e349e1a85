"""``ReplayServer``: trajectory assembly, ACKs, batches, priorities, rate limiting, sharding.

Everything runs in this process (``zrl.testing.inproc.InProc``): a ``Broker`` over
``inproc://`` on the test's zmq context, roles in threads with their own stop events, test
sockets with linger 0 and finite timeouts; every thread stopped, every socket closed at teardown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zrl.roles.replay as replay_role
from tests.helpers.replay import replay_config
from zrl.config.experiment import config_from_dict, load_config
from zrl.replay.assemble import assemble_transitions
from zrl.replay.frames import FrameTable
from zrl.replay.snapshot import BackgroundSave, load_state
from zrl.roles.actor import Actor
from zrl.roles.replay import BATCH_ACK_TIMEOUT_S, ReplayServer
from zrl.testing.fakes import as_message, trajectory
from zrl.testing.inproc import collect, collect_acking
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

torch.set_num_threads(1)


# --- trajectories ---------------------------------------------------------------------------


def handmade() -> dict[str, np.ndarray]:
    """E=2, T=5. Env 0 terminates at t=1 (t=2 is the invalid autoreset step); env 1 is
    truncated at t=3 (t=4 invalid)."""
    E, T = 2, 5
    a = trajectory(E, T, obs_dim=3)
    rng = np.random.default_rng(0)
    a["reward"] = rng.uniform(-1, 2, (E, T)).astype(np.float32)
    a["terminated"][0, 1] = True
    a["truncated"][1, 3] = True
    a["valid"][0, 2] = False
    a["valid"][1, 4] = False
    a["reward"][0, 2] = 0.0
    a["reward"][1, 4] = 0.0
    a["priority"] = rng.uniform(0, 3, (E, T)).astype(np.float32)
    a["priority"][~a["valid"]] = 0.0
    return a


def reference_transitions(a: dict[str, np.ndarray], n: int, gamma: float) -> list[dict]:
    """The n-step transitions of a trajectory, by a plain loop over (env, start)."""
    E, T = a["reward"].shape
    out = []
    for e in range(E):
        for t in range(T):
            if not a["valid"][e, t]:
                continue
            ret, j, k = 0.0, t, 0
            while True:
                ret += gamma**k * float(a["reward"][e, j])
                k += 1
                if a["terminated"][e, j]:
                    discount = 0.0
                    break
                cut = j == T - 1 or not a["valid"][e, j + 1]
                if a["truncated"][e, j] or cut or k == n:
                    discount = gamma**k
                    break
                j += 1
            out.append(
                {
                    "obs": a["obs"][e, t],
                    "action": a["action"][e, t],
                    "reward": ret,
                    "discount": discount,
                    "next_obs": a["next_obs"][e, j],
                    "priority": a["priority"][e, t],
                }
            )
    return out


# --- assemble_transitions ---------------------------------------------------------------


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_assemble_transitions_matches_reference_loop(n_step):
    a = handmade()
    gamma = 0.9
    items, priorities = assemble_transitions(as_message(a, weights_version=4), n_step, gamma)
    ref = reference_transitions(a, n_step, gamma)
    assert len(ref) == 8  # 10 steps, 2 invalid
    assert {k: v.dtype for k, v in items.items()} == {
        "obs": np.float32,
        "action": np.int64,
        "reward": np.float32,
        "discount": np.float32,
        "next_obs": np.float32,
        "weights_version": np.int64,
    }
    assert items["weights_version"].tolist() == [4] * 8  # the trajectory's, on every item
    assert items["obs"].shape == (8, 3) and items["next_obs"].shape == (8, 3)
    assert priorities.shape == (8,)
    for i, r in enumerate(ref):
        np.testing.assert_array_equal(items["obs"][i], r["obs"])
        assert items["action"][i] == r["action"]
        assert items["reward"][i] == pytest.approx(r["reward"], rel=1e-5)
        assert items["discount"][i] == pytest.approx(r["discount"], rel=1e-6)
        np.testing.assert_array_equal(items["next_obs"][i], r["next_obs"])
        assert priorities[i] == r["priority"]


def test_assemble_transitions_handmade_corner_cases():
    """Spot checks written out by hand, independent of the reference loop."""
    a = handmade()
    g = 0.9
    items, pri = assemble_transitions(as_message(a), 3, g)
    r = a["reward"]
    # Row-major order of the valid starts: (0,0) (0,1) (0,3) (0,4) (1,0) (1,1) (1,2) (1,3).
    starts = [(0, 0), (0, 1), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3)]
    np.testing.assert_array_equal(items["obs"][:, 0], [a["obs"][e, t, 0] for e, t in starts])
    np.testing.assert_array_equal(pri, [a["priority"][e, t] for e, t in starts])
    # (0,0): two steps up to the termination at t=1, nothing to bootstrap.
    assert items["reward"][0] == pytest.approx(r[0, 0] + g * r[0, 1], rel=1e-5)
    assert items["discount"][0] == 0.0
    np.testing.assert_array_equal(items["next_obs"][0], a["next_obs"][0, 1])
    # (0,1): the terminal step alone.
    assert items["discount"][1] == 0.0
    # (0,3): cut by the end of the row after 2 steps: bootstrap from next_obs[0, 4].
    assert items["reward"][2] == pytest.approx(r[0, 3] + g * r[0, 4], rel=1e-5)
    assert items["discount"][2] == pytest.approx(g**2)
    np.testing.assert_array_equal(items["next_obs"][2], a["next_obs"][0, 4])
    # (1,0): full 3 steps, ends at t=2.
    assert items["reward"][4] == pytest.approx(r[1, 0] + g * r[1, 1] + g * g * r[1, 2], rel=1e-5)
    assert items["discount"][4] == pytest.approx(g**3)
    np.testing.assert_array_equal(items["next_obs"][4], a["next_obs"][1, 2])
    # (1,2): stops at the truncation at t=3, still bootstraps (time limit, not terminal).
    assert items["discount"][6] == pytest.approx(g**2)
    np.testing.assert_array_equal(items["next_obs"][6], a["next_obs"][1, 3])
    # No transition starts on or reaches past the invalid autoreset steps.
    assert not np.any(items["obs"][:, 0] == a["obs"][0, 2, 0])
    assert not np.any(items["next_obs"][:, 0] == a["next_obs"][1, 4, 0])


def _without(a: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in a.items() if k != name}


def _with(a: dict[str, np.ndarray], **changes: np.ndarray) -> dict[str, np.ndarray]:
    return {**a, **changes}


def _bad_priority(value: float) -> dict[str, np.ndarray]:
    a = handmade()
    p = a["priority"].copy()
    p[1, 1] = value  # a valid step
    return _with(a, priority=p)


BAD_TRAJECTORIES: dict[str, tuple[Callable[[], dict[str, np.ndarray]], str]] = {
    "missing obs": (lambda: _without(handmade(), "obs"), "lacks array 'obs'"),
    "missing priority": (lambda: _without(handmade(), "priority"), "lacks array 'priority'"),
    "missing valid": (lambda: _without(handmade(), "valid"), "lacks array 'valid'"),
    "reward float64": (
        lambda: _with(handmade(), reward=handmade()["reward"].astype(np.float64)),
        "dtype float64",
    ),
    "action int32": (
        lambda: _with(handmade(), action=handmade()["action"].astype(np.int32)),
        "dtype int32",
    ),
    "valid uint8": (
        lambda: _with(handmade(), valid=handmade()["valid"].astype(np.uint8)),
        "dtype uint8",
    ),
    "obs rank 2": (lambda: _with(handmade(), obs=handmade()["obs"][:, :, 0]), "rank 2"),
    "action [2, 4]": (lambda: _with(handmade(), action=handmade()["action"][:, :4]), "shape"),
    "terminated [1, 5]": (
        lambda: _with(handmade(), terminated=handmade()["terminated"][:1]),
        "shape",
    ),
    "obs [2, 4, 3]": (lambda: _with(handmade(), obs=handmade()["obs"][:, :4]), "shape"),
    "next_obs [3, 5, 3]": (
        lambda: _with(handmade(), next_obs=np.zeros((3, 5, 3), np.float32)),
        "shape",
    ),
    "obs/next_obs dims differ": (
        lambda: _with(handmade(), next_obs=np.zeros((2, 5, 4), np.float32)),
        "obs and next_obs",
    ),
    "negative priority": (lambda: _bad_priority(-0.5), "priorities"),
    "NaN priority": (lambda: _bad_priority(np.nan), "'priority'"),
    "inf priority": (lambda: _bad_priority(np.inf), "'priority'"),
}


@pytest.mark.parametrize("case", list(BAD_TRAJECTORIES))
def test_assemble_transitions_rejects_malformed(case):
    make, match = BAD_TRAJECTORIES[case]
    with pytest.raises(P.ProtocolError, match=match):
        assemble_transitions(as_message(make()), 3, 0.99)


# --- a replay shard in-process ------------------------------------------------------------


def test_replay_server_acks_batches_priorities_rate_limit_and_drops(inproc):
    cfg = replay_config()
    inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    batches = inproc.pull("batches")
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer) and replay.id == "replay-0"
    experience = inproc.push("experience", sender="actor-0")
    pub = inproc.pub("learner-0")
    # Subscriptions travel through the XPUB/XSUB device: the shard's acks must reach us, and
    # our priorities and batch acks the shard.
    inproc.wait_subscribed(acks)
    inproc.wait_for_subscriber(P.priority_topic("replay-0"), P.batch_ack_topic("replay-0"), pub=pub)

    # 5 trajectories of 10 transitions: 50 items, exactly min_size.
    for i in range(5):
        assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10 * i)))
    got = collect(acks, until=5, timeout=10)
    assert [m.kind for m in got] == [P.ACK] * 5
    assert [m.meta["seq"] for m in got] == [0, 1, 2, 3, 4]
    assert all(m.meta["inserted"] == 10 for m in got)
    assert all(m.sender == "replay-0" for m in got)
    assert replay.table.size == 50 and replay.trajectories == 5

    # Rate limit: batches = floor((spi * inserts - (spi * min_size - tolerance)) / batch).
    def allowed(inserts: int) -> int:
        return (4 * inserts - (4 * 50 - 64)) // 16

    first = collect(batches, until=allowed(50), timeout=10)
    assert len(first) == allowed(50) == 4
    for b in first:
        assert b.kind == P.BATCH and b.sender == "replay-0"
        assert b.meta["shard"] == "replay-0"
        assert b.meta["table_size"] == 50
        assert set(b.arrays) == {
            "obs",
            "action",
            "reward",
            "discount",
            "next_obs",
            "weights_version",
            "weight",
            "key",
        }
        keys, w = b.arrays["key"], b.arrays["weight"]
        assert keys.dtype == np.int64 and keys.shape == (16,)
        assert w.dtype == np.float32 and w.shape == (16,)
        assert np.all((w > 0) & (w <= 1)) and w.max() == 1.0
        assert np.all((keys >= 0) & (keys < 50))
        assert b.arrays["obs"].shape == (16, 4) and b.arrays["next_obs"].shape == (16, 4)
        # Items are the inserted ones: key k is transition k (obs[.., 0] counts them).
        np.testing.assert_array_equal(b.arrays["obs"][:, 0], keys.astype(np.float32))
    # Stopped: no inserts, no more batches.
    wait_for(lambda: replay.batches_sent >= 4, timeout=5)  # counted just after the send
    settle(lambda: replay.batches_sent == 4, 0.5)
    assert collect(batches, quiet=0.3) == []
    assert replay.heartbeat_info()["sampling_blocked"].startswith("samples/insert ratio")

    # A priority update for one key makes it dominate the next batches.
    hot = int(first[0].arrays["key"][3])
    pub.send(
        P.Message(
            P.PRIORITIES,
            arrays={
                "key": np.array([hot, 10_000], np.int64),  # 10_000 was never inserted
                "priority": np.array([1e6, 1.0], np.float32),
            },
        ),
        topic=P.priority_topic("replay-0"),
    )
    wait_for(lambda: replay.priority_updates == 1, timeout=5)
    assert replay.stale_priority_keys == 1

    # 5 more trajectories: sampling resumes up to the new allowance.
    for i in range(5, 10):
        assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10 * i)))
    got = collect(acks, until=5, timeout=10)
    assert [m.meta["seq"] for m in got] == [5, 6, 7, 8, 9]
    # From here on the test is a learner: every batch is acked (prefetch 4 is the window).
    more = collect_acking(batches, pub, until=allowed(100) - len(first))
    assert len(first) + len(more) == allowed(100) == 16
    wait_for(lambda: replay.batches_sent >= 16, timeout=5)
    settle(lambda: replay.batches_sent == 16, 0.4)
    assert collect(batches, quiet=0.2) == []
    keys = np.concatenate([b.arrays["key"] for b in more])
    assert np.all(keys < 100)
    share = float(np.mean(keys == hot))
    assert share > 0.8, f"key {hot} with priority 1e6 got only {share:.0%} of the samples"
    # The hot key's importance weight is the smallest one in its batch.
    for b in more:
        if hot in b.arrays["key"]:
            assert b.arrays["weight"][b.arrays["key"] == hot].max() == b.arrays["weight"].min()

    # Malformed experience is counted as dropped and the shard goes on.
    dropped0 = replay.stats.snapshot()["experience"]["dropped"]
    assert experience.send(P.Message(P.TRAJECTORY, arrays=_without(trajectory(), "priority")))
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(obs_dim=7)))  # schema
    assert experience.send(P.Message(P.BATCH, arrays=trajectory()))  # wrong kind
    experience.sock.send_multipart([b"\x93garbage", b"x"])  # not a message at all
    assert experience.send(P.Message(P.TRAJECTORY, arrays=_bad_priority(np.nan)))
    wait_for(lambda: replay.stats.snapshot()["experience"]["dropped"] == dropped0 + 5, timeout=5)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=100)))
    got = collect(acks, until=1, timeout=5)
    # Seqs 10..13 were dropped without an ack; the good one after them is acked.
    assert [m.meta["seq"] for m in got] == [14]
    assert replay.trajectories == 11 and replay.table.size == 110
    assert inproc.alive(replay) and inproc.error_of(replay) is None
    # Malformed priority updates are dropped too.
    prio_dropped0 = replay.stats.snapshot()["priorities"]["dropped"]
    for bad in (
        {"key": np.array([1], np.int64), "priority": np.array([-1.0], np.float32)},
        {"key": np.array([1], np.int64), "priority": np.array([np.nan], np.float32)},
        {"key": np.array([1, 2], np.int64), "priority": np.array([1.0], np.float32)},
        {"key": np.array([1], np.int32), "priority": np.array([1.0], np.float32)},
        {"priority": np.array([1.0], np.float32)},
    ):
        pub.send(P.Message(P.PRIORITIES, arrays=bad), topic=P.priority_topic("replay-0"))
    wait_for(
        lambda: replay.stats.snapshot()["priorities"]["dropped"] == prio_dropped0 + 5, timeout=5
    )
    assert replay.priority_updates == 1
    assert inproc.alive(replay) and inproc.error_of(replay) is None


@pytest.mark.waits
@pytest.mark.slow
def test_inserts_wait_for_samples_then_resume(inproc):
    """Without a consumer for batches the shard stops reading experience (back-pressure on
    the actors) once the ratio's insert side is exhausted; consuming batches resumes it."""
    inproc.start_broker(replay_config(samples_per_insert_tolerance=16, min_size=20))
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    for i in range(12):  # 120 items, 10 per trajectory; queued in the stream's pipes
        assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10 * i)))
    # Only the few batches the socket queues hold get sampled, so inserts stop early:
    # an insert is admitted while 4 * (inserts + 1) - samples <= max_diff = 4 * 20 + 16.
    # (The limiter counts an insert just before the shard counts its trajectory.)
    # Stuck means: nothing inserted or sampled for longer than the batch-ack timeout, whose
    # window reset would let the shard sample (and so insert) again while the stream has room.
    seen: dict[str, Any] = {"state": None, "since": time.monotonic()}

    def stuck_for_a_while() -> bool:
        state = (replay.trajectories, replay.limiter.inserts, replay.limiter.samples)
        if state != seen["state"]:
            seen.update(state=state, since=time.monotonic())
        return (
            time.monotonic() - seen["since"] > BATCH_ACK_TIMEOUT_S + 0.5
            and not replay.limiter.can_insert(1, replay.table.size)
            and replay.limiter.inserts == 10 * replay.trajectories
        )

    wait_for(stuck_for_a_while, timeout=30, interval=0.05)
    stuck = replay.trajectories
    settle(lambda: replay.trajectories == stuck, 0.5)
    assert 2 <= stuck < 12
    assert 4 * (replay.limiter.inserts - 10 + 1) - replay.limiter.samples <= 96
    acked = collect(acks, until=stuck, timeout=5)
    assert len(acked) == stuck
    # A learner shows up: batches flow, so inserts flow again, until every trajectory is in.
    batches = inproc.pull("batches")
    learner = inproc.pub("learner-0")
    received: list[P.Message] = []
    wait_for(
        lambda: (
            received.extend(collect_acking(batches, learner, quiet=0.1))
            or replay.trajectories == 12
        )
    )
    acked += collect(acks, until=12 - len(acked), timeout=5)
    assert [m.meta["seq"] for m in acked] == list(range(12))
    assert replay.table.size == 120


def test_priorities_reach_only_their_shard(inproc):
    inproc.start_broker(replay_config())
    shards = {i: inproc.start(ReplayServer, index=i) for i in (0, 1, 10)}
    assert {i: s.id for i, s in shards.items()} == {0: "replay-0", 1: "replay-1", 10: "replay-10"}
    pub = inproc.pub("learner-0")
    inproc.wait_for_subscriber(*(P.priority_topic(s.id) for s in shards.values()), pub=pub)

    def update(shard: str) -> None:
        pub.send(
            P.Message(
                P.PRIORITIES,
                arrays={"key": np.array([0], np.int64), "priority": np.array([2.0], np.float32)},
            ),
            topic=P.priority_topic(shard),
        )

    def counts() -> dict[int, int]:
        return {i: s.priority_updates for i, s in shards.items()}  # type: ignore[attr-defined]

    update("replay-0")
    wait_for(lambda: counts()[0] == 1, timeout=5)
    settle(lambda: counts() == {0: 1, 1: 0, 10: 0}, 0.3)
    # "priorities/replay-1/" must not reach replay-10 (the trailing slash in the topic).
    update("replay-1")
    wait_for(lambda: counts()[1] == 1, timeout=5)
    settle(lambda: counts() == {0: 1, 1: 1, 10: 0}, 0.3)
    update("replay-10")
    wait_for(lambda: counts()[10] == 1, timeout=5)
    settle(lambda: counts() == {0: 1, 1: 1, 10: 1}, 0.3)
    # The key was never inserted anywhere: stale, not applied.
    assert all(s.stale_priority_keys == 1 for s in shards.values())  # type: ignore[attr-defined]


def test_batches_wait_for_learner_acks(inproc, monkeypatch):
    """At most ``replay.prefetch`` batches are sampled ahead of the learners' acks (the
    credit window); an ack of a newer batch covers older ones; forged or impossible acks are
    dropped; and a window nobody acks is reopened after a timeout, counted."""
    import zrl.roles.replay as replay_module
    import zrl.transport.credit as credit_module

    monkeypatch.setattr(replay_module, "BATCH_ACK_TIMEOUT_S", 1.0)
    # The timeout stays at its floor however slowly this test acks (tests/transport covers
    # its growth with the acks' latency).
    monkeypatch.setattr(credit_module, "LATENCY_FACTOR", 0.0)
    inproc.start_broker(replay_config(prefetch=2, samples_per_insert=0, min_size=10))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    batches = inproc.pull("batches")
    learner = inproc.pub("learner-0")
    intruder = inproc.pub("actor-3")
    experience = inproc.push("experience", sender="actor-0")
    # The shard's batch-ack subscription travels through the XPUB/XSUB device to both of us.
    for publisher in (learner, intruder):
        inproc.wait_for_subscriber(P.batch_ack_topic("replay-0"), pub=publisher)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory()))

    def ack(seq: int, via: Channel = learner, shard: str = "replay-0") -> None:
        via.send(P.Message(P.ACK, meta={"seq": seq}), topic=P.batch_ack_topic(shard))

    got = collect(batches, until=2, timeout=5)
    assert [b.seq for b in got] == [0, 1]
    wait_for(lambda: replay.batches_sent == 2, timeout=2)  # counted after the send returns
    settle(lambda: replay.batches_sent == 2, 0.5)  # window full, well within the timeout
    assert replay.heartbeat_info()["batches_in_flight"] == 2

    dropped0 = replay.stats.snapshot()["priorities"]["dropped"]
    ack(0, via=intruder)  # not a learner
    ack(7)  # a batch never sent
    ack(-1)
    learner.send(P.Message(P.ACK, meta={"seq": True}), topic=P.batch_ack_topic("replay-0"))
    ack(0, shard="replay-1")  # another shard's: never reaches this one
    wait_for(lambda: replay.stats.snapshot()["priorities"]["dropped"] == dropped0 + 4, timeout=5)
    assert replay.batches_sent == 2

    ack(0)  # one credit: one more batch
    assert [b.seq for b in collect(batches, until=1, timeout=5)] == [2]
    assert replay.batch_ack_latency.slowest_s > 0  # how long batch 0 waited for its ack
    wait_for(lambda: replay.batches_sent == 3, timeout=2)  # counted after the send returns
    settle(lambda: replay.batches_sent == 3, 0.3)
    ack(2)  # covers 1 as well (a lost ack does not shrink the window)
    assert [b.seq for b in collect(batches, until=2, timeout=5)] == [3, 4]
    wait_for(lambda: replay.batches_sent == 5, timeout=2)  # counted after the send returns
    settle(lambda: replay.batches_sent == 5, 0.3)

    # Nobody acks: the window reopens after the timeout (a learner died holding batches).
    assert replay.batch_ack_timeouts == 0
    assert [b.seq for b in collect(batches, until=2, timeout=5)] == [5, 6]
    assert replay.batch_ack_timeouts == 1
    assert inproc.alive(replay) and inproc.error_of(replay) is None


# --- the layout is the config's, never a message's (issue 27) -------------------------------

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FAST = ["broker.heartbeat_interval=0.2", "broker.heartbeat_timeout=10", "replay.min_size=100000"]


@pytest.mark.parametrize(
    ("config_file", "overrides"),
    [
        ("cartpole_apex_dqn.yaml", ["env.num_envs=4", "actor.env_groups=2"]),
        (
            "cartpole_novel_r2d2.yaml",
            [
                "env.num_envs=2",
                "r2d2.sequence_length=8",
                "r2d2.burn_in=2",
                "actor.trajectory_length=4",
            ],
        ),
        ("cartpole_impala.yaml", ["env.num_envs=2", "model.core=gru", "model.core_size=8"]),
        ("pendulum_sac.yaml", ["env.num_envs=2"]),
        ("tictactoe_impala.yaml", ["env.num_envs=2", "roles.league=0"]),
        (  # recurrent_frame_unroll
            "pong_appo.yaml",
            ["env.num_envs=2", "model.core=lstm", "model.core_size=16", "replay.capacity=8"],
        ),
        (  # frame_sequences
            "cartpole_novel_r2d2.yaml",
            [
                "env.id=ALE/Pong-v5",
                "env.num_envs=2",
                "r2d2.sequence_length=8",
                "r2d2.burn_in=2",
                "replay.n_step=2",
                "actor.trajectory_length=4",
                "replay.capacity=64",
            ],
        ),
    ],
    ids=[
        "apex_dqn-env-groups",
        "r2d2",
        "impala-recurrent",
        "sac",
        "multiagent-impala",
        "pong-appo-recurrent",
        "pong-r2d2",
    ],
)
def test_real_actors_send_the_layout_the_shard_fixed_at_setup(inproc, config_file, overrides):
    """Each algorithm's actor, as it runs: every trajectory fits the layout the shard derived
    from the config and the env's spaces alone (nothing refused), and is stored (on Pong each
    frame once: ``recurrent_frame_unroll``, ``frame_sequences``)."""
    if config_file.startswith("pong") or "env.id=ALE/Pong-v5" in overrides:
        pytest.importorskip("ale_py")
    cfg = load_config(CONFIGS / config_file, [*overrides, *FAST])
    inproc.start_broker(cfg)
    replay = inproc.start(ReplayServer, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(replay, ReplayServer) and isinstance(actor, Actor)
    wait_for(lambda: replay.trajectories >= 3 and replay.size > 0, timeout=60)
    assert replay.layout_refused == 0
    assert replay.stats.snapshot()["experience"]["dropped"] == 0
    assert inproc.error_of(replay) is None and inproc.error_of(actor) is None


def frames_trajectory(E: int = 2, T: int = 5, k: int = 2, hw: int = 84) -> dict[str, np.ndarray]:
    """The observation [1, 2, 84, 84] attack: a frame_transitions TRAJECTORY (issue 27)."""
    a = {k_: v for k_, v in trajectory(E, T).items() if k_ not in ("obs", "next_obs")}
    a["frames"] = np.zeros((E, T + k, hw, hw), np.uint8)
    return a


def test_forged_layouts_are_dropped_counted_and_allocate_nothing(inproc):
    """A CartPole shard: frames, other shapes, dtypes or action ranges are refused and counted,
    the table keeps the config's layout and size, and real trajectories are still stored."""
    inproc.start_broker(replay_config(min_size=10_000))
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    table = replay.table
    allocated = table.nbytes
    # 500 items of obs + next_obs (2 x 4 float32), action, reward, discount, weights version,
    # and the sum tree: the bound the config sets, allocated at setup.
    assert allocated == 500 * (2 * 16 + 8 + 4 + 4 + 8) + 2 * 512 * 8
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=0)))
    forged = [
        frames_trajectory(E=1, k=2),  # the attack: would have become an 84x84 frame table
        frames_trajectory(E=2, k=4, hw=512),  # 4 MB, would have sized a table from it
        trajectory(obs_dim=1000),  # another observation width
        trajectory(E=3),  # more envs than the actor has
        trajectory(T=6),  # another trajectory length
        {**trajectory(), "obs": trajectory()["obs"].astype(np.uint8)},  # dtype
        {**trajectory(), "action": np.full((2, 5), 7, np.int64)},  # CartPole has 2 actions
    ]
    for arrays in forged:
        assert experience.send(P.Message(P.TRAJECTORY, arrays=arrays))
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10)))
    got = collect(acks, until=2, timeout=10)
    assert [m.meta["seq"] for m in got] == [0, len(forged) + 1]
    wait_for(lambda: replay.layout_refused == len(forged), timeout=5)
    assert replay.stats.snapshot()["experience"]["dropped"] == len(forged)
    assert replay.heartbeat_info()["layout_refused"] == len(forged)
    assert replay.table is table and not isinstance(table, FrameTable)
    assert table.size == 20 and replay.trajectories == 2 and table.nbytes == allocated
    assert inproc.alive(replay) and inproc.error_of(replay) is None


def test_a_frame_shard_refuses_other_frames_and_stays_its_size(inproc, tmp_path):
    """An Atari-shaped shard (frame stacks of 4 x 84 x 84): forged 4096 x 4096 frames, or
    stacks of another depth, are refused without allocating anything; its snapshot comes back
    into a table of the same layout."""
    pytest.importorskip("ale_py")
    cfg = replay_config(min_size=10_000, capacity=1000)
    cfg = config_from_dict(
        cfg.model_dump(mode="json"),
        [
            "env.id=ALE/Pong-v5",
            "env.num_envs=1",
            "actor.trajectory_length=4",
            f"checkpoint.dir={tmp_path}",
            "checkpoint.interval=1e6",
        ],
    )
    inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    table = replay.table
    assert isinstance(table, FrameTable) and (table.frame_shape, table.stack) == ((84, 84), 4)
    allocated = table.nbytes
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    for arrays in (frames_trajectory(E=1, T=4, k=2, hw=4096), frames_trajectory(E=1, T=4, k=2)):
        assert experience.send(P.Message(P.TRAJECTORY, arrays=arrays))
    assert experience.send(P.Message(P.TRAJECTORY, arrays=frames_trajectory(E=1, T=4, k=4)))
    assert [m.meta["seq"] for m in collect(acks, until=1, timeout=10)] == [2]
    assert replay.layout_refused == 2 and table.nbytes == allocated and table.size == 4
    inproc.stop_role(replay)  # writes its snapshot
    restored = inproc.start(ReplayServer, index=0)
    assert isinstance(restored, ReplayServer) and isinstance(restored.table, FrameTable)
    assert restored.table.size == 4 and restored.table.frame_inserts == table.frame_inserts
    assert restored.table.nbytes == allocated and restored.snapshot_refused is None


def frame_unroll(E: int = 1, T: int = 4, k: int = 4, hw: int = 84) -> dict[str, np.ndarray]:
    """A ``frame_unroll`` TRAJECTORY: each frame once, ``frames [E, T + k, hw, hw]``."""
    steps = {k_: v for k_, v in trajectory(E, T).items() if k_ not in ("obs", "next_obs")}
    del steps["priority"]
    return {
        "frames": np.full((E, T + k, hw, hw), 7, np.uint8),
        **steps,
        "logp": np.full((E, T), -1.0, np.float32),
    }


def test_a_frame_unroll_fifo_takes_its_layout_from_the_config(inproc):
    """An APPO shard on Pong stores each env's frames ``[T + 4, 84, 84]`` in its FIFO: forged
    frames (4096 x 4096, stacks of 2), full-stack ``unroll``s and a CartPole-shaped unroll
    are refused without allocating anything; a frame unroll of the layout is stored."""
    pytest.importorskip("ale_py")
    cfg = config_from_dict(
        replay_config(capacity=8, min_size=8, samples_per_insert=0).model_dump(mode="json"),
        [
            "algo=appo",
            "replay.table=fifo",
            "replay.batch_size=4",
            "env.id=ALE/Pong-v5",
            "env.num_envs=1",
            "actor.trajectory_length=4",
        ],
    )
    inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer) and replay.layout.schema.name == "frame_unroll"
    table = replay.table
    assert table.kind == "fifo" and table.column("frames").shape == (8, 4 + 4, 84, 84)
    allocated = table.nbytes
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    stacks = {k: v for k, v in frame_unroll().items() if k != "frames"}
    forged = [
        frame_unroll(hw=4096),  # would size a table of 4096 x 4096 frames
        frame_unroll(k=2),  # stacks of another depth
        frame_unroll(E=2),  # more envs than the actor has
        {  # the full stacks of a plain unroll: this shard takes each frame once
            **stacks,
            "obs": np.zeros((1, 4, 4, 84, 84), np.uint8),
            "bootstrap_obs": np.zeros((1, 4, 84, 84), np.uint8),
        },
        {**stacks, "obs": np.zeros((1, 4, 4), np.float32), "bootstrap_obs": np.zeros((1, 4))},
    ]
    meta = {"weights_version": 1}
    for arrays in forged:
        assert experience.send(P.Message(P.TRAJECTORY, meta=meta, arrays=arrays))
    assert experience.send(P.Message(P.TRAJECTORY, meta=meta, arrays=frame_unroll()))
    assert [m.meta["seq"] for m in collect(acks, until=1, timeout=10)] == [len(forged)]
    assert replay.layout_refused == len(forged)
    assert replay.table is table and table.nbytes == allocated and table.size == 1
    np.testing.assert_array_equal(table.column("frames")[0], frame_unroll()["frames"][0])
    assert inproc.error_of(replay) is None


@pytest.mark.parametrize("algo", ["appo", "r2d2"])
def test_recurrent_and_sequence_frame_layouts_come_from_the_config(inproc, algo):
    """A recurrent APPO FIFO and an R2D2 shard on Pong store each frame once
    (``recurrent_frame_unroll``, ``frame_sequences``): the layout comes from the config and a
    probe env, so the full stacks of the other layout, frames of another size or depth and a
    message without the recurrent state are refused and counted, allocating nothing; a
    message of the layout is stored as it came."""
    pytest.importorskip("ale_py")
    sets = [
        f"algo={algo}",
        "env.id=ALE/Pong-v5",
        "env.num_envs=1",
        "actor.trajectory_length=4",
        "model.core=lstm",
        "model.core_size=16",
    ]
    if algo == "appo":
        sets += ["replay.table=fifo", "replay.batch_size=4"]
    else:
        sets += ["r2d2.sequence_length=6", "r2d2.burn_in=2", "replay.n_step=2"]
    cfg = config_from_dict(
        replay_config(capacity=8, min_size=8, samples_per_insert=0).model_dump(mode="json"), sets
    )
    inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    steps = 6 if algo == "r2d2" else 4  # positions T + 1 (a sequence) or T (an unroll)
    expected = "frame_sequences" if algo == "r2d2" else "recurrent_frame_unroll"
    assert replay.layout.schema.name == expected
    table = replay.table
    assert table.column("frames").shape == (8, steps + 4, 84, 84)
    allocated = table.nbytes
    good = dict(replay.layout.example().arrays)
    good["frames"] = np.full_like(good["frames"], 7)
    other = {k: v for k, v in good.items() if k != "frames"}
    full_stacks = (  # the layout without frames: sequences, recurrent_unroll
        {**other, "obs": np.zeros((1, steps + 1, 4, 84, 84), np.uint8)}
        if algo == "r2d2"
        else {
            **other,
            "obs": np.zeros((1, steps, 4, 84, 84), np.uint8),
            "bootstrap_obs": np.zeros((1, 4, 84, 84), np.uint8),
        }
    )
    forged = [
        full_stacks,
        {**good, "frames": np.zeros((1, steps + 2, 84, 84), np.uint8)},  # stacks of 2
        {**good, "frames": np.zeros((1, steps + 4, 512, 512), np.uint8)},  # larger frames
        {k: v for k, v in good.items() if k != "state"},  # a feed-forward model's
    ]
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    meta = {"weights_version": 1}
    for arrays in forged:
        assert experience.send(P.Message(P.TRAJECTORY, meta=meta, arrays=arrays))
    assert experience.send(P.Message(P.TRAJECTORY, meta=meta, arrays=good))
    assert [m.meta["seq"] for m in collect(acks, until=1, timeout=10)] == [len(forged)]
    assert replay.layout_refused == len(forged)
    assert replay.table is table and table.nbytes == allocated and table.size == 1
    np.testing.assert_array_equal(table.column("frames")[0], good["frames"][0])
    assert inproc.error_of(replay) is None


class HeldSave(BackgroundSave):
    """A snapshot write that waits for ``release`` before it writes (a slow disk, a big
    table): the test decides when it ends."""

    release = threading.Event()

    def _save(self, path: str | Path, state: dict[str, Any]) -> None:
        assert HeldSave.release.wait(60), "the test never released the write"
        super()._save(path, state)


def test_a_snapshot_is_written_in_a_thread_while_the_shard_heartbeats_and_holds_its_table(
    inproc, tmp_path, monkeypatch
):
    """A snapshot of a full 1M-row table takes seconds, longer than the broker's heartbeat
    timeout: the shard writes it in a thread from views of its table, inserts and samples
    nothing meanwhile (the snapshot holds the table as it was when the write began), and its
    loop goes on heartbeating."""
    monkeypatch.setattr(HeldSave, "release", threading.Event())
    monkeypatch.setattr(replay_role, "BackgroundSave", HeldSave)
    cfg = config_from_dict(
        replay_config().model_dump(mode="json"),
        [f"checkpoint.dir={tmp_path}", "checkpoint.interval=1e6", "checkpoint.replay=true"],
    )
    broker = inproc.start_broker(cfg)
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    assert isinstance(replay, ReplayServer)
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=0)))
    assert [m.meta["seq"] for m in collect(acks, until=1, timeout=10)] == [0]

    replay.next_snapshot = 0.0  # due now, after the first trajectory went in
    wait_for(lambda: replay.snapshot_write is not None, timeout=30)  # held by the test
    held_from = replay._beat_seq
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(base=10)))
    # Three heartbeats sent and acknowledged while the write is held: the loop goes on.
    wait_for(lambda: replay._acked_seq >= held_from + 3, timeout=30)
    entry = broker.roles[replay.id]
    assert entry.state == "alive" and entry.info["snapshot_writing"] is True
    assert replay.trajectories_received == 1 and replay.table.size == 10  # held still
    assert replay.snapshots == 0

    HeldSave.release.set()
    assert [m.meta["seq"] for m in collect(acks, until=1, timeout=10)] == [1]
    wait_for(lambda: replay.snapshots >= 1, timeout=10)
    assert replay.snapshot_seconds is not None and replay.table.size == 20
    assert replay.snapshot_path is not None
    state = load_state(replay.snapshot_path, max_bytes=1 << 24)
    assert state["table"]["inserts"] == 10 and state["trajectories"] == 1  # as it was
    assert inproc.error_of(replay) is None


def test_a_snapshot_write_that_fails_stops_the_shard_with_its_error(inproc, tmp_path, monkeypatch):
    class FailingSave(BackgroundSave):
        def _save(self, path: str | Path, state: dict[str, Any]) -> None:
            super()._save(Path(path).parent / "missing-dir" / "x.snapshot", state)

    monkeypatch.setattr(replay_role, "BackgroundSave", FailingSave)
    cfg = config_from_dict(
        replay_config().model_dump(mode="json"),
        [f"checkpoint.dir={tmp_path}", "checkpoint.interval=0.2", "checkpoint.replay=true"],
    )
    inproc.start_broker(cfg)
    replay = inproc.start(ReplayServer, index=0)
    wait_for(lambda: not inproc.alive(replay), timeout=30)
    assert isinstance(inproc.error_of(replay), FileNotFoundError)
