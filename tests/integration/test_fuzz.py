"""Fuzzing: malformed messages at every socket anyone can reach.

The threat model (docs/protocol.md, section 2): anyone who can reach a socket can send any
bytes; a malformed message is dropped and counted by its receiver, never fatal to it.

- Fast: ``decode`` under hypothesis raises nothing but ``ProtocolError``; and regression
  tests for bugs these tests found (one message stopping a receiver, forged acks, messages
  not counted, a supervisor stopped by a bad metrics message).
- Slow: thousands of seeded-random malformed messages into a running `zrl run` (registry,
  topic bus, every stream's ``_in``, the parameter server's rpc endpoint); no role exits,
  the broker answers, the learner keeps learning, every receiver dropped exactly what the
  fuzzer sent it, and the run's own streams lose nothing (no sequence gaps anywhere; every
  actor trajectory acknowledged, in order; the replay received exactly the actors'
  acknowledged trajectories plus the fuzzer's decodable ones; the actors sent exactly what
  was acknowledged). The exact stream accounting needs a quiet moment: both actors are
  frozen with SIGSTOP for under 2 s (less than the heartbeat timeout) while the replay
  takes what is in flight; sentinels (a valid trajectory and batch from the fuzzer, a STATUS
  request) show when each receiver has read everything the fuzzer sent before them.

Counting rules (``Channel``): undecodable => dropped only; decodable but refused by the
role's handler => received *and* dropped.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zrl.broker.topic_bus import MAX_TOPIC_FRAMES
from zrl.config.experiment import ExperimentConfig
from zrl.nets.discrete import QNetwork
from zrl.nets.wire import model_to_arrays
from zrl.roles import insert_acks
from zrl.roles.actor import Actor
from zrl.roles.evaluator import Evaluator
from zrl.roles.registry_client import registry_request
from zrl.roles.replay import ReplayServer
from zrl.roles.weights import WeightsFollower
from zrl.run.aggregator import Aggregator
from zrl.run.metrics import MetricsWriter
from zrl.run.supervisor import Supervisor
from zrl.testing.fakes import trajectory
from zrl.testing.inproc import collect
from zrl.testing.probes import settle, wait_for, wait_for_subscriber, wait_subscribed
from zrl.testing.processes import (
    REPO,
    end_run,
    run_broker_address,
    status_rows,
    zrl_status_json,
)
from zrl.transport import protocol as P
from zrl.transport.endpoints import broker_endpoints
from zrl.transport.sockets import Channel, TransportStats, make_socket

# --- decode under hypothesis --------------------------------------------------------------------

DTYPES = sorted(P.ALLOWED_DTYPES)
BAD_DTYPES = ["<c16", "|O", "<U4", "|V8", "float32", "f4", ">f4" if "<f4" in DTYPES else "<f4"]
# msgpack's integer range: anything wider cannot be sent at all.
MSGPACK_INT = st.integers(-(2**63), 2**64 - 1)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    MSGPACK_INT,
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
)
DTYPE = st.one_of(
    st.sampled_from(DTYPES + BAD_DTYPES),
    st.text(max_size=6),
    MSGPACK_INT,
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.none()),
)
DIM = st.one_of(st.integers(0, 4), st.integers(-3, 2**64 - 1), st.booleans(), st.floats())
SHAPE = st.one_of(st.lists(DIM, max_size=18), JUNK)
SPEC = st.one_of(
    st.tuples(st.one_of(st.text(max_size=4), MSGPACK_INT), DTYPE, SHAPE).map(list),
    st.lists(JUNK, max_size=4),
    JUNK,
)


def _nbytes(spec: Any) -> int | None:
    """Bytes the spec announces when it is valid and small, else None."""
    try:
        name, dtype, shape = spec
        if dtype not in P.ALLOWED_DTYPES or not isinstance(shape, list):
            return None
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            return None
        n = np.dtype(dtype).itemsize * math.prod(shape)
        return n if n <= 4096 else None
    except (TypeError, ValueError):
        return None


@st.composite
def frames_strategy(draw: st.DrawFn) -> list[bytes]:
    header: dict[str, Any] = {
        "v": draw(st.one_of(st.just(P.PROTOCOL_VERSION), JUNK)),
        "k": draw(st.one_of(st.sampled_from([P.TRAJECTORY, P.BATCH, P.WEIGHTS]), JUNK)),
        "s": draw(st.one_of(st.just("fuzzer"), JUNK)),
        "q": draw(st.one_of(st.integers(0, 100), JUNK)),
        "st": draw(st.one_of(st.just("experience"), JUNK)),
        "m": draw(st.one_of(st.dictionaries(st.text(max_size=4), JUNK, max_size=3), JUNK)),
        "a": draw(st.one_of(st.lists(SPEC, max_size=4), JUNK)),
    }
    for key in list(header):
        if draw(st.integers(0, 9)) == 0:
            del header[key]
    head = msgpack.packb(header, use_bin_type=True)
    specs = header.get("a") if isinstance(header.get("a"), list) else []
    frames = [head]
    for spec in specs:
        n = _nbytes(spec)
        size = n if n is not None and draw(st.booleans()) else draw(st.integers(0, 64))
        frames.append(draw(st.binary(min_size=size, max_size=size)))
    frames += draw(st.lists(st.binary(max_size=16), max_size=1))
    if draw(st.integers(0, 5)) == 0:
        frames = frames[: draw(st.integers(0, len(frames)))]
    return frames


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames_strategy())
def test_decode_raises_only_protocol_error(frames):
    try:
        msg = P.decode(frames, max_bytes=1 << 20)
    except P.ProtocolError:
        return
    # Accepted: then it is exactly what the header announced.
    head = msgpack.unpackb(frames[0], raw=False)
    assert msg.kind == head["k"] and msg.version == P.PROTOCOL_VERSION
    assert [[n, a.dtype.str, list(a.shape)] for n, a in msg.arrays.items()] == head.get("a", [])
    assert all(not a.flags.writeable for a in msg.arrays.values())


def header(kind: str = P.TRAJECTORY, **fields: Any) -> bytes:
    h = {"v": P.PROTOCOL_VERSION, "k": kind, "s": "fuzzer", "q": 0, "st": "", "m": {}, "a": []}
    h.update(fields)
    return msgpack.packb(h, use_bin_type=True)


UNHASHABLE_DTYPE = [header(a=[["obs", ["<f4"], [1]]]), b"\0\0\0\0"]


# Regression (found here, since fixed): protocol.py decode: `dtype not in ALLOWED_DTYPES` raises
# TypeError (unhashable) for a dtype given as a list or map, instead of ProtocolError; receivers
# only catch ProtocolError, so one such message stops any receiving role or the broker registry
@pytest.mark.parametrize("dtype", [["<f4"], {"x": 1}])
def test_decode_rejects_unhashable_dtype(dtype):
    with pytest.raises(P.ProtocolError):
        P.decode([header(a=[["obs", dtype, [1]]]), b"\0\0\0\0"])


def small_config(**sections: Any) -> ExperimentConfig:
    data: dict[str, Any] = {
        "name": "fuzz-test",
        "seed": 2,
        "env": {"id": "CartPole-v1", "num_envs": 2},
        "model": {"hidden": [16]},
        "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
        "roles": {"actors": 1},
        "actor": {"trajectory_length": 4, "max_in_flight": 2},
        "replay": {"min_size": 10_000},
    }
    data.update(sections)
    return ExperimentConfig.model_validate(data)


# Regression (found here, since fixed): protocol.py decode (TypeError on an unhashable dtype)
# stops the broker's registry loop (zrl/broker/registry.py): Registry._recv catches only
# ProtocolError, so the registry thread dies
def test_registry_survives_an_unhashable_dtype(inproc, zmq_ctx):
    inproc.start_broker(small_config())
    evil = inproc._socket(zmq.DEALER, "registry", sndtimeo_ms=1000)
    try:
        evil.send_multipart(UNHASHABLE_DTYPE)
        time.sleep(0.3)
        reply = registry_request(zmq_ctx, inproc.addr, P.Message(P.STATUS), 2.0)
        assert reply.kind == P.STATUS_REPLY
    finally:
        evil.close(linger=0)


# Regression (found here, since fixed): protocol.py decode (TypeError on an unhashable dtype)
# escapes sockets.py Channel.recv, which catches only ProtocolError: the replay shard stops
def test_replay_survives_an_unhashable_dtype(inproc):
    inproc.start_broker(small_config())
    acks = inproc.sub(P.ack_topic("actor-0"))
    replay = inproc.start(ReplayServer, index=0)
    experience = inproc.push("experience", sender="actor-0")
    inproc.wait_subscribed(acks)
    experience.sock.send_multipart(UNHASHABLE_DTYPE)
    # Of the config's layout: num_envs 2, trajectory_length 4.
    assert experience.send(P.Message(P.TRAJECTORY, arrays=trajectory(T=4)))
    got = collect(acks, until=1, timeout=3)
    assert inproc.error_of(replay) is None, repr(inproc.error_of(replay))
    assert [m.meta["seq"] for m in got] == [0]


# --- receivers that accept what they should count as malformed ----------------------------------


# Regression (found here, since fixed): insert_acks.py InsertAcks.read: any message on acks/<id>/
# with an int `seq` counts as an ack (any kind, any sender, seqs never sent), so one forged ack (or
# an ack meant for the actor's previous incarnation) opens the credit window for as many
# trajectories
def test_actor_ignores_forged_acks(inproc, monkeypatch):
    # No shard acks here: the window must not time out while the test looks (at load 20,
    # collecting the two trajectories took longer than ACK_TIMEOUT_S, 10 s).
    monkeypatch.setattr(insert_acks, "ACK_TIMEOUT_S", 600.0)
    inproc.start_broker(small_config())
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    pub = inproc.pub("mallory")
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)
    assert len(collect(experience, until=2, timeout=15)) == 2  # the window is full
    settle(lambda: actor.in_flight == 2, 0.3)
    for kind in (P.BATCH, P.ACK):  # not an ack at all; an ack for a trajectory never sent
        pub.send(P.Message(kind, meta={"seq": 10**6}), topic=P.ack_topic("actor-0"))
    time.sleep(0.5)
    assert actor.in_flight >= 0 and actor.trajectories == 2, (actor.in_flight, actor.trajectories)


# Regression (found here, since fixed): weights.py WeightsFollower.update: messages of another
# kind on the `weights` topic are skipped silently instead of being counted as dropped
# (protocol.md section 2: a kind a socket does not serve is malformed, and every malformed message
# is counted)
def test_weights_follower_counts_wrong_kinds_as_dropped(inproc):
    inproc.start_broker(small_config())
    evaluator = inproc.start(Evaluator, index=0)  # follows the weights topic on every step
    assert isinstance(evaluator, Evaluator)
    pub = inproc.pub("mallory")
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=pub)
    for kind in (P.BATCH, P.METRICS, "frobnicate"):
        pub.send(P.Message(kind, meta={"version": 99}), topic=P.WEIGHTS_TOPIC)
    wait_for(lambda: evaluator.stats.snapshot()["weights"]["received"] == 3, timeout=5)
    assert evaluator.weights.version == 0
    wait_for(lambda: evaluator.stats.snapshot()["weights"]["dropped"] == 3, timeout=2)


# Regression (found here, since fixed): supervisor.py Aggregator.row: int() on whatever a
# `metrics` message carries (inserts, size, weights_version): one message with a non-numeric
# field, from any peer on the topic bus, raises out of the supervisor's loop and ends the run
def test_supervisor_aggregator_survives_malformed_metrics():
    agg = Aggregator()
    agg.on_metrics({"id": "actor-0", "role": "actor", "env_steps": 100, "weights_version": 3})
    agg.on_metrics({"id": "replay-9", "role": "replay", "inserts": "many", "size": [1]})
    agg.on_metrics({"id": "params-9", "role": "params", "weights_version": "v3"})
    agg.on_metrics({"id": "actor-9", "role": "actor", "weights_version": None})
    row = agg.row(1.0)
    assert row["env_steps"] == 100


# Regression (found here, since fixed): run/monitor.py RunMonitor.drain/metrics.py
# MetricsWriter.write_eval: an `eval` message with a numeric mean but no std (or a non-numeric
# one) raises KeyError/TypeError out of the supervisor's loop and ends the run
def test_supervisor_survives_an_eval_message_without_std(tmp_path):
    sup = Supervisor(ExperimentConfig(), run_dir=tmp_path / "run", show_status=False)
    (tmp_path / "run").mkdir()
    writer = MetricsWriter(tmp_path / "run")

    sup.monitor.status_rows = [{"id": "evaluator-0", "role": "evaluator", "state": "alive"}]

    class Monitor:
        def __init__(self, metas: list[dict[str, Any]]) -> None:
            self.msgs = [P.Message(P.METRICS, meta=m, sender="evaluator-0") for m in metas]

        def recv(self, block: bool = True) -> tuple[None, P.Message] | None:
            return (None, self.msgs.pop(0)) if self.msgs else None

        def drop(self, sender: str, reason: str) -> None:
            pass

    try:
        sup.monitor.drain(Monitor([{"kind": "eval", "mean": 30.0}]), writer, 1.0)
        sup.monitor.drain(Monitor([{"kind": "eval", "mean": 31.0, "std": "x"}]), writer, 1.0)
    finally:
        writer.close()
    assert len(sup.agg.evals) == 2


# Regression (found here, since fixed): sockets.py Channel.recv returns None for a dropped
# malformed message as for an empty queue, so every drain loop (weights.py WeightsFollower.update,
# insert_acks.py read, replay.py _drain, learner.py read_acks, run/monitor.py drain) stops
# at the first malformed message: N of them delay an actor's newest weights by N trajectories
def test_one_malformed_message_does_not_hide_newer_weights(zmq_ctx):
    addr = "inproc://zrl-test-fuzz-drain"
    pub = make_socket(zmq_ctx, zmq.PUB, sndhwm=1000)
    pub.bind(addr)
    sub = make_socket(zmq_ctx, zmq.SUB, rcvhwm=1000, rcvtimeo_ms=100)
    sub.setsockopt(zmq.SUBSCRIBE, P.WEIGHTS_TOPIC.encode())
    sub.connect(addr)
    channel = Channel(sub, "weights", "actor-0", TransportStats(), topics=True)
    try:
        model = QNetwork(4, 2, [8])

        class FakeRole:
            def open_weights_subscriber(self, topics: list[str], name: str) -> Channel:
                return channel

            def lookup(self, role: str, timeout: float = 5.0) -> list[dict[str, Any]]:
                return [{"id": "params-0", "rpc": "inproc://unused", "host": "here"}]

        follower = WeightsFollower(FakeRole(), model)  # type: ignore[arg-type]
        wait_subscribed(pub, sub, P.WEIGHTS_TOPIC)  # raw probes: the channel counts none
        newest = P.Message(
            P.WEIGHTS,
            meta={"version": 5},
            arrays=model_to_arrays(QNetwork(4, 2, [8])),
            sender="params-0",
        )
        pub.send_multipart([b"weights", b"\xc1 not a message"])
        pub.send_multipart([b"weights", *P.encode(newest)])
        wait_for(lambda: sub.poll(0), timeout=2)
        time.sleep(0.2)  # both are queued at the subscriber now
        assert follower.update(), "the newest weights were not applied"
        assert follower.version == 5 and channel.stats.dropped == 1
    finally:
        channel.close()
        pub.close(linger=0)


# --- fuzzing a running zrl run ------------------------------------------------------------------

CONFIG = REPO / "configs" / "cartpole_apex_dqn.yaml"
ROLE_IDS = {"actor-0", "actor-1", "replay-0", "params-0", "learner-0", "evaluator-0"}
ACTOR_IDS = ("actor-0", "actor-1")
FUZZ_SENDER = "fuzzer"


class Fuzz:
    """Malformed messages (frames), each marked decodable or not; decodable ones carry
    consecutive sequence numbers per target so that receivers see no gaps."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.q: dict[str, int] = defaultdict(int)

    def head(
        self,
        target: str,
        kind: str,
        arrays: dict[str, np.ndarray] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> list[Any]:
        """A decodable message (the next sequence number of this target)."""
        msg = P.Message(kind, meta=meta or {}, arrays=arrays or {}, sender=FUZZ_SENDER)
        msg.seq = self.q[target]
        self.q[target] += 1
        return [bytes(memoryview(f)) for f in P.encode(msg)]

    def garbage(self) -> list[bytes]:
        """Never decodable, whatever the target."""
        r = self.rng
        arr = [["x", "<f4", [4]]]

        def h(**kw: Any) -> bytes:
            return header(**kw)

        choice = r.randrange(22)
        if choice == 0:
            return [os.urandom(r.randrange(1, 64)) for _ in range(r.randrange(1, 4))]
        if choice == 1:
            return [b""]
        if choice == 2:
            return [msgpack.packb(r.choice([[1, 2], 7, "header", None, 1.5]))]
        if choice == 3:  # wrong protocol versions
            return [h(v=r.choice([0, 2, 99, "1", None, 1.0, True]))]
        if choice == 4:
            return [h(k=r.choice(["", 7, None, ["trajectory"]]))]
        if choice == 5:
            return [h(s=r.choice([7, None, ["x"]]))]
        if choice == 6:
            return [h(q=r.choice([-1, True, "3", 1.5, None]))]
        if choice == 7:
            return [h(m=r.choice([[1], "meta", 7, None]))]
        if choice == 8:
            return [h(a=r.choice(["obs", 7, {"obs": 1}]))]
        if choice == 9:  # more array specs than MAX_ARRAYS
            return [
                h(a=[[f"x{i}", "<u1", [0]] for i in range(P.MAX_ARRAYS + 1)]),
                *[b""] * (P.MAX_ARRAYS + 1),
            ]
        if choice == 10:  # wrong dtypes
            dtype = r.choice(["<c16", "|O", "<U4", "|V8", "float32", "f4", 7, None])
            return [h(a=[["x", dtype, [4]]]), b"\0" * 16]
        if choice == 11:  # bad shapes
            shape = r.choice([[-1], [1.5], ["4"], [True], [1] * (P.MAX_NDIM + 1), "4", None])
            return [h(a=[["x", "<f4", shape]]), b"\0" * 16]
        if choice == 12:  # truncated array
            return [h(a=arr), b"\0" * r.randrange(0, 16)]
        if choice == 13:  # too long an array
            return [h(a=arr), b"\0" * r.randrange(17, 64)]
        if choice == 14:  # huge shapes with a small or empty frame
            shape = r.choice([[2**40], [2**31, 2**31], [0, 2**63], [0, 2**62, 2**62], [2**62] * 3])
            return [h(a=[["x", "<f4", shape]]), b"\0" * r.choice([0, 16])]
        if choice == 15:  # fewer frames than arrays
            return [h(a=[*arr, ["y", "<i8", [1]]]), b"\0" * 16]
        if choice == 16:  # more frames than arrays
            return [h(a=arr), b"\0" * 16, b"extra"]
        if choice == 17:  # duplicate array names
            return [h(a=[*arr, *arr]), b"\0" * 16, b"\0" * 16]
        if choice == 18:
            return [h(a=[["x", "<f4"]]), b"\0" * 16]
        if choice == 19:  # a header that is not valid msgpack
            return [b"\xc1" + os.urandom(8)]
        if choice == 20:  # msgpack with non-string map keys
            return [msgpack.packb({1: 2, "v": 1})]
        return [msgpack.packb({"v": 1, "k": "trajectory", "a": [], "s": "fuzzer", "q": 0}) + b"x"]


def traj(obs_dim: int = 4, **changes: Any) -> dict[str, np.ndarray]:
    a = trajectory(2, 4, obs_dim)
    a.update(changes)
    return {k: v for k, v in a.items() if v is not None}


def bad_trajectories(f: Fuzz) -> list[list[Any]]:
    """Decodable messages the replay must refuse (received, then dropped)."""
    nan = np.full((2, 4, 4), np.nan, np.float32)
    prio = np.full((2, 4), -1.0, np.float32)
    arrays = [
        traj(priority=None),
        traj(reward=np.zeros((2, 4), np.float64)),
        traj(next_obs=nan),
        traj(obs=nan),
        traj(reward=np.full((2, 4), np.inf, np.float32)),
        traj(priority=prio),
        traj(action=np.zeros((2, 3), np.int64)),
        traj(obs_dim=7),  # 7 wide: not the table's items
        traj(valid=np.ones((2, 4), np.uint8)),
    ]
    out = [f.head("experience", P.TRAJECTORY, a) for a in arrays]
    out += [f.head("experience", k, traj()) for k in (P.BATCH, P.WEIGHTS, "frobnicate")]
    return out


def batch_arrays(B: int = 8, **changes: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(B)
    a = {
        "obs": rng.standard_normal((B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, B).astype(np.int64),
        "reward": np.ones(B, np.float32),
        "discount": np.full(B, 0.97, np.float32),
        "next_obs": rng.standard_normal((B, 4)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    a.update(changes)
    return {k: v for k, v in a.items() if v is not None}


def bad_batches(f: Fuzz) -> list[list[Any]]:
    shard = {"shard": "fuzz-shard"}
    cases = [
        (P.BATCH, batch_arrays(weight=None), shard),
        (P.BATCH, batch_arrays(action=np.zeros(8, np.int32)), shard),
        (P.BATCH, batch_arrays(obs=np.full((8, 4), np.nan, np.float32)), shard),
        (P.BATCH, batch_arrays(reward=np.full(8, np.inf, np.float32)), shard),
        (P.BATCH, batch_arrays(action=np.full(8, 5, np.int64)), shard),
        (P.BATCH, batch_arrays(obs=np.zeros((8, 7), np.float32)), shard),
        (P.BATCH, batch_arrays(discount=np.ones(7, np.float32)), shard),
        (P.BATCH, batch_arrays(), {}),
        (P.BATCH, batch_arrays(), {"shard": 7}),
        (P.TRAJECTORY, batch_arrays(), shard),
        ("frobnicate", {}, {}),
    ]
    return [f.head("batches", k, a, m) for k, a, m in cases]


def bad_priorities(f: Fuzz) -> list[list[Any]]:
    key, prio = np.arange(4, dtype=np.int64), np.ones(4, np.float32)
    cases = [
        {"key": key, "priority": -prio},
        {"key": key, "priority": prio * np.nan},
        {"key": key, "priority": prio[:3]},
        {"key": key.astype(np.int32), "priority": prio},
        {"key": key},
        {"priority": prio},
        {"key": key.reshape(2, 2), "priority": prio.reshape(2, 2)},
    ]
    return [f.head("priorities", P.PRIORITIES, a) for a in cases]


def bad_weights(f: Fuzz, version: int) -> list[list[Any]]:
    wrong = {"torso.0.weight": np.zeros((3, 3), np.float32)}
    out = [f.head("weights", P.WEIGHTS, wrong, {"version": version})]
    out.append(f.head("weights", P.WEIGHTS, {}, {"version": version + 1}))
    for v in ("7", 1.5, True, None):
        out.append(f.head("weights", P.WEIGHTS, wrong, {"version": v}))
    for kind in (P.BATCH, P.METRICS, "frobnicate"):  # kinds the weights topic does not carry
        out.append(f.head("weights", kind, {}, {"version": version + 2}))
    return out


def bad_rpc(f: Fuzz) -> list[list[Any]]:
    wrong = {"torso.0.weight": np.zeros((3, 3), np.float32)}
    return [
        f.head("rpc", P.WEIGHTS, {}, {"updates": 1}),
        f.head("rpc", P.WEIGHTS, wrong, {"updates": 1, "min_version": 10**9}),
        f.head("rpc", P.TRAJECTORY, traj()),
        f.head("rpc", "frobnicate"),
    ]


def bad_registry(f: Fuzz) -> list[list[Any]]:
    return [
        f.head("registry", P.TRAJECTORY, traj()),
        f.head("registry", "frobnicate"),
        f.head("registry", P.HELLO),  # without its fields
        f.head("registry", P.HELLO, meta={"role": "actor", "host": 7, "pid": "x"}),
    ]


class AckMonitor(threading.Thread):
    """Every insert acknowledgement the replay publishes (topics ``acks/<actor id>/``): the
    acknowledged sequence numbers by actor id."""

    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        super().__init__(name="ack-monitor", daemon=True)
        self.sock = make_socket(ctx, zmq.SUB, rcvhwm=1_000_000, rcvtimeo_ms=100)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"acks/")
        self.sock.connect(broker_endpoints(addr, ["experience"])["topics_out"])
        self.seqs: dict[str, list[int]] = defaultdict(list)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            topic, *frames = self.sock.recv_multipart()
            try:
                msg = P.decode(frames)
            except P.ProtocolError:
                continue  # the fuzzer's garbage on acks/nobody/
            if msg.kind == P.ACK:
                actor = topic.decode().removeprefix("acks/").rstrip("/")
                with self.lock:
                    self.seqs[actor].append(msg.meta["seq"])

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.seqs.values())

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {k: list(v) for k, v in self.seqs.items()}

    def close(self) -> None:
        self.stop.set()
        self.join(5)
        self.sock.close(linger=0)


def stream(rows: dict[str, dict[str, Any]], rid: str, name: str) -> dict[str, int]:
    return rows.get(rid, {}).get("streams", {}).get(name, {})


def send_all(sock: zmq.Socket, messages: list[list[Any]], deadline: float) -> None:
    for frames in messages:
        while True:
            try:
                sock.send_multipart(frames)
                break
            except zmq.Again:
                assert time.monotonic() < deadline, "the fuzzer could not send for too long"


@pytest.mark.slow
def test_fuzzing_a_running_experiment(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zrl",
                "run",
                str(CONFIG),
                "--run-dir",
                str(run_dir),
                "--insecure",  # what a run without keys guarantees
                "--set",
                "stop.wall_time=150",
                "--set",
                "stop.eval_return=null",
                # A small run; inserts never wait for samples, so in-flight data lands at once.
                "--set",
                "env.num_envs=8",
                "--set",
                "replay.samples_per_insert=0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    ctx = zmq.Context()
    addr = ""
    socks: list[zmq.Socket] = []
    monitor: AckMonitor | None = None
    stopped: list[int] = []
    rng = random.Random(20240611)
    fuzz = Fuzz(rng)

    def sock(kind: int, endpoint: str, **kw: Any) -> zmq.Socket:
        s = make_socket(ctx, kind, sndtimeo_ms=500, rcvtimeo_ms=5000, **kw)
        s.connect(endpoint)
        socks.append(s)
        return s

    try:
        addr = run_broker_address(proc, run_dir, log)
        monitor = AckMonitor(ctx, addr)  # before any actor sends its first trajectory
        monitor.start()
        eps = broker_endpoints(addr, ExperimentConfig().broker.streams)

        def all_alive() -> bool:
            rows = status_rows(ctx, addr)
            return ROLE_IDS <= set(rows) and all(rows[i]["state"] == "alive" for i in ROLE_IDS)

        def learner_updates() -> int:
            return int(
                status_rows(ctx, addr).get("learner-0", {}).get("info", {}).get("updates", 0)
            )

        wait_for(lambda: all_alive() or proc.poll() is not None, timeout=60, interval=0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        wait_for(lambda: learner_updates() > 20, timeout=40)
        before = zrl_status_json(addr)
        pids = {r["id"]: r["pid"] for r in before["roles"]}
        reg_before = before["broker"]["registry"]["registry"]
        assert sum(r["dropped"] + r["gaps"] for r in before["roles"]) == 0, before["roles"]
        params_rpc = {r["id"]: r for r in before["roles"]}["params-0"]["rpc"]
        assert params_rpc

        reg = sock(zmq.DEALER, eps["registry"])
        # An XPUB publishes as a PUB does, and shows which subscriptions reached it.
        pub = sock(zmq.XPUB, eps["topics_in"], sndhwm=1_000_000)
        pushes = {s: sock(zmq.PUSH, eps[f"{s}_in"]) for s in ("experience", "batches")}
        idle = {s: sock(zmq.PUSH, eps[f"{s}_in"], sndhwm=8) for s in ("priorities", "gradients")}
        rpc = sock(zmq.DEALER, params_rpc)
        sentinel_acks = sock(zmq.SUB, eps["topics_out"])
        sentinel_acks.setsockopt(zmq.SUBSCRIBE, P.ack_topic(FUZZ_SENDER).encode())
        sentinel_prio = sock(zmq.SUB, eps["topics_out"])
        sentinel_prio.setsockopt(zmq.SUBSCRIBE, P.priority_topic("fuzz-shard").encode())
        # Connections and subscriptions settle: the roles' (we publish to them) reached our PUB,
        # and the sentinels' (nobody else listens there) the broker and the roles' PUBs.
        for topic in (P.WEIGHTS_TOPIC, P.priority_topic("replay-0")):
            wait_for_subscriber(pub, topic, timeout=30)
        wait_subscribed(pub, sentinel_acks, P.ack_topic(FUZZ_SENDER), timeout=30)
        wait_subscribed(pub, sentinel_prio, P.priority_topic("fuzz-shard"), timeout=30)

        # Build the traffic: per target, undecodable garbage mixed with decodable but invalid
        # messages (in order, so that the decodable ones' sequence numbers stay consecutive).
        def mix(n: int, decodable: Callable[[], list[list[Any]]]) -> list[list[Any]]:
            out: list[list[Any]] = []
            while len(out) < n:
                garbage = [fuzz.garbage() for _ in range(rng.randrange(1, 8))]
                assert not any(map(_decodes, garbage))
                out += garbage + decodable()
            return out

        traffic = {
            "registry": mix(500, lambda: bad_registry(fuzz)),
            "experience": mix(600, lambda: bad_trajectories(fuzz)),
            "batches": mix(600, lambda: bad_batches(fuzz)),
            "weights": mix(400, lambda: bad_weights(fuzz, 10**9 + rng.randrange(10**6))),
            "priorities": mix(400, lambda: bad_priorities(fuzz)),
            "rpc": mix(500, lambda: bad_rpc(fuzz)),
        }
        big_header = [header(m={"pad": "x" * (P.MAX_HEADER_BYTES + 10)})]
        for name in traffic:
            traffic[name].append(big_header)
        decodable = {name: sum(1 for m in msgs if _decodes(m)) for name, msgs in traffic.items()}
        total = sum(len(m) for m in traffic.values())
        assert total >= 3000

        deadline = time.monotonic() + 60
        updates_at_start = learner_updates()
        send_all(reg, traffic["registry"], deadline)
        send_all(pushes["experience"], traffic["experience"], deadline)
        send_all(pushes["batches"], traffic["batches"], deadline)
        for frames in traffic["weights"]:
            pub.send_multipart([P.WEIGHTS_TOPIC.encode(), *frames])
        for frames in traffic["priorities"]:
            pub.send_multipart([P.priority_topic("replay-0").encode(), *frames])
        for frames in fuzz_topic_garbage(fuzz):  # only the supervisor listens there
            pub.send_multipart(frames)
        send_all(rpc, traffic["rpc"], deadline)
        for s in idle.values():  # nobody consumes these streams: queued, never harmful
            for _ in range(20):
                try:
                    s.send_multipart(fuzz.garbage(), flags=zmq.NOBLOCK)
                except zmq.Again:
                    break

        # Sentinels: each receiver that answers has read everything sent before them.
        # Of the run's layout (env.num_envs=8, the config's 32 steps): the shard takes no other.
        sentinel_traj = fuzz.head("experience", P.TRAJECTORY, trajectory(8, 32))
        send_all(pushes["experience"], [sentinel_traj], deadline)
        sentinel_batch = fuzz.head("batches", P.BATCH, batch_arrays(), {"shard": "fuzz-shard"})
        send_all(pushes["batches"], [sentinel_batch], deadline)
        # A stranger's GET_WEIGHTS is served (and its reply is no gap at the learner).
        send_all(rpc, [fuzz.head("rpc", P.GET_WEIGHTS)], deadline)
        send_all(reg, [fuzz.head("registry", P.STATUS)], deadline)
        assert sentinel_acks.poll(30_000), "the replay never acknowledged the sentinel"
        assert sentinel_prio.poll(30_000), "the learner never trained on the sentinel"
        replies = drain_kinds(rpc, P.WEIGHTS, timeout=30)
        assert P.WEIGHTS in replies, replies
        assert P.STATUS_REPLY in drain_kinds(reg, P.STATUS_REPLY, timeout=30)
        fuzz_s = round(time.monotonic() - (deadline - 60), 1)

        # The broker itself drops topic messages of more frames or bytes than a zrl message
        # may have (counted as its topic_dropped), and libzmq disconnects a registry peer
        # whose frame exceeds the registry's size limit (counted nowhere).
        def topic_passes(msgs: list[list[Any]]) -> int:
            return sum(1 for m in msgs if len(m) + 1 <= MAX_TOPIC_FRAMES)

        reaching = {name: topic_passes(traffic[name]) for name in ("weights", "priorities")}
        expected = {
            ("broker", "registry"): len(traffic["registry"]) - 1,
            ("replay-0", "experience"): len(traffic["experience"]),
            ("replay-0", "priorities"): reaching["priorities"],
            ("learner-0", "batches"): len(traffic["batches"]),
            ("params-0", "rpc"): len(traffic["rpc"]),
            ("actor-0", "weights"): reaching["weights"],
            ("actor-1", "weights"): reaching["weights"],
            ("evaluator-0", "weights"): reaching["weights"],
        }

        def dropped_now() -> dict[tuple[str, str], int]:
            reply = registry_request(ctx, addr, P.Message(P.STATUS), 2.0)
            rows = {r["id"]: r for r in reply.meta["roles"]}
            got = {k: stream(rows, *k).get("dropped", 0) for k in expected if k[0] != "broker"}
            reg_now = reply.meta["broker"]["registry"]["registry"]
            got[("broker", "registry")] = reg_now["dropped"] - reg_before["dropped"]
            return got

        seen: list[dict[tuple[str, str], int]] = []
        try:
            wait_for(lambda: seen.append(dropped_now()) or seen[-1] == expected, 30, 0.5)
        except AssertionError:
            rows = status_rows(ctx, addr)
            detail = {
                i: (rows[i]["state"], rows[i]["age"], rows[i]["streams"], rows[i]["info"])
                for i in ("actor-0", "actor-1")
            }
            raise AssertionError(f"dropped {seen[-1]}, expected {expected}; {detail}") from None
        settle(lambda: dropped_now() == expected, 1.5)

        # The run went on: nobody exited or restarted, the learner kept learning.
        rows = status_rows(ctx, addr)
        assert {i: rows[i]["pid"] for i in ROLE_IDS} == {i: pids[i] for i in ROLE_IDS}
        assert all(rows[i]["state"] == "alive" and rows[i]["restarts"] == 0 for i in ROLE_IDS)
        wait_for(lambda: learner_updates() > updates_at_start + 100, timeout=30)

        # A quiet moment for exact stream accounting: freeze both actors (SIGSTOP, for less
        # than the heartbeat timeout) until the replay has taken and acknowledged everything
        # in flight and reported it in a heartbeat; retry if it takes longer than that.
        actor_pids = [pids["actor-0"], pids["actor-1"]]
        assert all(p in descendants(proc.pid) for p in actor_pids)

        def first_beat_after(frozen: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
            """Each actor's first heartbeat after the freeze (its registry `sent` counts them)."""
            beats = {rid: frozen[rid]["streams"]["registry"]["sent"] for rid in ACTOR_IDS}
            seen: dict[str, dict[str, Any]] = {}
            deadline = time.monotonic() + 10
            while len(seen) < len(beats) and time.monotonic() < deadline:
                rows = status_rows(ctx, addr)
                for rid, n in beats.items():
                    row = rows.get(rid)
                    if rid not in seen and row and row["streams"]["registry"]["sent"] > n:
                        seen[rid] = row
                time.sleep(0.01)
            assert len(seen) == len(beats), "an actor did not heartbeat after the freeze"
            return seen

        def quiet_snapshot() -> tuple[dict[str, Any], dict[str, Any], dict[str, list[int]]]:
            """(replay row, each actor's first row after the freeze, acks), taken once the
            replay's experience counters and the acks stayed the same for 0.6 s: longer than
            a heartbeat, so the replay's row includes the last acknowledged insert."""
            for _ in range(5):
                frozen: dict[str, dict[str, Any]] | None = None
                for p in actor_pids:
                    os.kill(p, signal.SIGSTOP)
                    stopped.append(p)
                try:
                    t_stop, first, since = time.monotonic(), None, 0.0
                    while time.monotonic() - t_stop < 2.0:  # well within the 3 s timeout
                        time.sleep(0.2)
                        row = status_rows(ctx, addr).get("replay-0", {})
                        key = (
                            monitor.count(),
                            row.get("streams", {}).get("experience"),
                            row.get("info", {}).get("trajectories"),
                        )
                        if key != first:
                            first, since = key, time.monotonic()
                        elif time.monotonic() - since >= 0.6:
                            frozen = status_rows(ctx, addr)
                            quiet = (row, monitor.snapshot())
                            break
                finally:
                    for p in actor_pids:
                        os.kill(p, signal.SIGCONT)
                    stopped.clear()
                if frozen is not None:
                    return quiet[0], first_beat_after(frozen), quiet[1]
                time.sleep(3)  # let the actors heartbeat and catch up, then try again
            raise AssertionError("the replay never went quiet")

        replay_row, after, acks = quiet_snapshot()
        replay_exp = replay_row["streams"]["experience"]
        actor_acks = {a: s for a, s in acks.items() if a != FUZZ_SENDER}

        # Every receiver dropped exactly what the fuzzer sent it; nothing else anywhere.
        final = zrl_status_json(addr)
        for r in final["roles"]:
            for name, s in r["streams"].items():
                want = expected.get((r["id"], name), 0)
                assert s.get("dropped", 0) == want, (r["id"], name, s, want)
                assert s.get("gaps", 0) == 0, (r["id"], name, s)
        reg_after = final["broker"]["registry"]["registry"]
        assert reg_after["dropped"] - reg_before["dropped"] == expected[("broker", "registry")]
        assert reg_after["gaps"] == 0
        assert all(r["state"] == "alive" for r in final["roles"])
        # The actors' own streams lost nothing: every trajectory acknowledged, in order...
        assert set(actor_acks) == {"actor-0", "actor-1"}, acks.keys()
        for actor, seqs in actor_acks.items():
            assert seqs == list(range(len(seqs))), f"actor {actor}: acks out of order or missing"
        for rid in ("actor-0", "actor-1"):
            info = {r["id"]: r for r in final["roles"]}[rid]["info"]
            assert info.get("ack_timeouts", 0) == 0 and info.get("trajectories_lost", 0) == 0, info
        # ...and the replay received exactly those plus the fuzzer's decodable trajectories
        # (which it dropped, except the sentinel it inserted).
        assert acks.get(FUZZ_SENDER) == [fuzz.q["experience"] - 1]
        acked = sum(map(len, actor_acks.values()))
        assert replay_row["info"]["trajectories"] == acked + 1
        assert replay_exp["received"] == acked + decodable["experience"] + 1, (
            replay_exp,
            {a: len(s) for a, s in actor_acks.items()},
            decodable,
        )
        assert replay_exp["dropped"] == expected[("replay-0", "experience")]
        # The actors sent exactly what was acknowledged: their first heartbeat after the
        # freeze reports what they sent before it (all acknowledged during the freeze), plus
        # at most the one trajectory of the step they were frozen in.
        for rid in ACTOR_IDS:
            sent = after[rid]["streams"]["experience"]["sent"]
            n = len(actor_acks[rid])
            assert n <= sent <= n + 1, (rid, sent, n)
        print(f"fuzzed {total + 4} messages in {fuzz_s}s; decodable {decodable}")

        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        for p in stopped:
            os.kill(p, signal.SIGCONT)
        if monitor is not None:
            monitor.close()
        for s in socks:
            s.close(linger=0)
        leftovers = end_run(proc, addr)
        ctx.destroy(linger=0)
    assert leftovers == []
    text = log.read_text(errors="replace")
    assert proc.returncode == 130, text[-3000:]  # Ctrl-C's exit code
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["error"] is None, summary
    assert summary["signal"] == "SIGINT", summary
    assert summary["restarts"] == {}, summary
    for name in ROLE_IDS:
        role_log = (run_dir / "logs" / f"{name}.log").read_text()
        assert "Traceback" not in role_log, (name, role_log[-3000:])


def _decodes(frames: list[Any]) -> bool:
    try:
        P.decode(frames)
    except P.ProtocolError:
        return False
    return True


def fuzz_topic_garbage(fuzz: Fuzz) -> Iterator[list[bytes]]:
    for topic in (P.METRICS_TOPIC, P.EVAL_TOPIC, "acks/nobody/", "\x00"):
        for _ in range(25):
            yield [topic.encode(), *fuzz.garbage()]


def drain_kinds(sock: zmq.Socket, want: str, timeout: float) -> set[str]:
    """Read replies (DEALER, no envelope) until one of kind ``want`` arrived."""
    kinds: set[str] = set()
    deadline = time.monotonic() + timeout
    while want not in kinds and time.monotonic() < deadline:
        if not sock.poll(200):
            continue
        frames = sock.recv_multipart()
        try:
            kinds.add(P.decode(frames).kind)
        except P.ProtocolError:
            kinds.add("?")
    return kinds


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()
