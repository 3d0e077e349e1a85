"""``ParameterServer`` and ``WeightsFollower`` in-process: versions, publishing, late join."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.helpers.params import (
    TinyModel,
    assert_same_arrays,
    config,
    connected,
    model_arrays,
    weights,
)
from zrl.roles.base import Role
from zrl.roles.params import ParameterServer
from zrl.roles.params_client import request_latest_weights
from zrl.roles.registry_client import registry_request
from zrl.roles.weights import PARAMS_LOOKUP_INTERVAL_S, RESYNC_INTERVAL_S, WeightsFollower
from zrl.testing.inproc import collect
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P

torch.set_num_threads(1)


@pytest.fixture
def params(inproc) -> ParameterServer:
    inproc.start_broker(config())
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    return ps


def test_versions_acks_publishing_and_late_join(inproc, params, rpc, zmq_ctx):
    assert params.rpc_endpoint.startswith("inproc://")
    services = registry_request(
        zmq_ctx, inproc.addr, P.Message(P.LOOKUP, meta={"role": "params"}), 2.0
    ).meta["services"]
    assert [s["id"] for s in services] == ["params-0"]
    assert services[0]["rpc"] == params.rpc_endpoint
    sub = inproc.sub(P.WEIGHTS_TOPIC)
    inproc.wait_subscribed(sub)  # what params publishes from now on reaches us

    # Before any weights: NO_WEIGHTS, for the rpc and the late-join helper.
    assert rpc.request(P.Message(P.GET_WEIGHTS)).kind == P.NO_WEIGHTS
    assert request_latest_weights(zmq_ctx, services, 2**20, timeout=2.0) is None
    assert params.version == 0

    sent = [weights(i) for i in range(3)]
    for i, w in enumerate(sent, start=1):
        ack = rpc.request(P.Message(P.WEIGHTS, meta={"updates": 20 * i}, arrays=w))
        assert ack.kind == P.ACK and ack.meta["version"] == i
    assert params.version == 3

    published = collect(sub, until=3, timeout=5)
    assert [m.kind for m in published] == [P.WEIGHTS] * 3
    assert [m.meta["version"] for m in published] == [1, 2, 3]
    assert [m.meta["updates"] for m in published] == [20, 40, 60]
    assert all(m.sender == "params-0" for m in published)
    for m, w in zip(published, sent, strict=True):
        assert_same_arrays(m.arrays, w)

    # Late join: a new subscriber sees nothing old; GET_WEIGHTS gives the latest version.
    late = inproc.sub(P.WEIGHTS_TOPIC)
    early = inproc.wait_subscribed(late)  # subscribed: anything old would reach it now
    assert early + collect(late, quiet=0.3) == []
    latest = rpc.request(P.Message(P.GET_WEIGHTS))
    assert latest.kind == P.WEIGHTS and latest.meta["version"] == 3
    assert latest.meta["updates"] == 60
    assert_same_arrays(latest.arrays, sent[2])
    helped = request_latest_weights(zmq_ctx, services, 2**20, timeout=2.0)
    assert helped is not None and helped.meta["version"] == 3
    assert_same_arrays(helped.arrays, sent[2])
    assert params.served == 4  # every GET_WEIGHTS, answered or not
    assert params.heartbeat_info() == {
        "weights_version": 3,
        "late_join_requests": 4,
        "weights_refused": 0,
        "replies_dropped": 0,
    }


def test_bad_weights_are_dropped_and_version_unchanged(params, rpc):
    w1 = weights(1)
    assert rpc.request(P.Message(P.WEIGHTS, arrays=w1)).meta["version"] == 1
    dropped0 = params.stats.snapshot()["rpc"]["dropped"]
    bad = [
        P.Message(P.WEIGHTS, arrays=weights(2, extra=np.zeros(3, np.float32))),  # extra name
        P.Message(P.WEIGHTS, arrays={k: v for k, v in weights(3).items() if "head" not in k}),
        P.Message(P.WEIGHTS, arrays={"other": np.zeros(3, np.float32)}),
        P.Message(P.WEIGHTS),  # no arrays at all
        P.Message(P.ACK, meta={"version": 99}),  # not a request params serves
    ]
    for msg in bad:
        rpc.send(msg)
    wait_for(lambda: params.stats.snapshot()["rpc"]["dropped"] == dropped0 + len(bad), timeout=5)
    # Nothing was acknowledged, the version and the stored arrays did not change.
    assert rpc.ch.recv(block=False) is None
    assert params.version == 1
    latest = rpc.request(P.Message(P.GET_WEIGHTS))
    assert latest.meta["version"] == 1
    assert_same_arrays(latest.arrays, w1)
    # Garbage frames are dropped by the channel, and the server still answers.
    rpc.ch.sock.send_multipart([b"\xc1", b"junk"])
    wait_for(lambda: params.stats.snapshot()["rpc"]["dropped"] == dropped0 + len(bad) + 1)
    assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(4))).meta["version"] == 2


def test_weights_with_other_shapes_are_dropped(params, rpc):
    assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(1))).meta["version"] == 1
    wrong = {k: np.zeros((3, 3), np.float32) for k in weights(1)}
    rpc.send(P.Message(P.WEIGHTS, arrays=wrong))
    wait_for(lambda: params.stats.snapshot()["rpc"]["dropped"] >= 1 or params.version > 1)
    assert params.version == 1


def test_weights_follower_applies_only_newer_versions(inproc, params, rpc):
    # A bare role registered with the broker, as actors and the evaluator are.
    follower_role = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=5)
    try:
        follower_role.connect()
        # The test's own subscriber to the weights, subscribed before any role is: the bus
        # hands each version to it and to the follower at once, so once it holds v3 the
        # follower's queue does too.
        watcher = inproc.sub(P.WEIGHTS_TOPIC)
        inproc.wait_subscribed(watcher)
        model = TinyModel()
        follower = WeightsFollower(follower_role, model)
        inproc.wait_for_subscriber(P.WEIGHTS_TOPIC)  # its subscription reached params' PUB
        assert follower.update() is False and follower.version == 0

        # Several versions queued: only the newest is applied, once.
        for i in range(1, 4):
            assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(i))).meta["version"] == i
        assert len(collect(watcher, until=3, timeout=5)) == 3
        wait_for(follower.update, timeout=5)
        assert follower.version == 3
        assert_same_arrays(model_arrays(model), weights(3))
        settle(lambda: follower.update() is False, 0.3)

        # Older or equal versions (e.g. from a restarted params) are ignored, version-less ones
        # dropped: the params rpc, asked once, confirms v3.
        pub = inproc.pub("params-0")
        inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=pub)
        dropped0, received0 = follower.sub.stats.dropped, follower.sub.stats.received
        for meta in ({"version": 2}, {"version": 3}, {}, {"version": "4"}, {"version": True}):
            pub.send(P.Message(P.WEIGHTS, meta=meta, arrays=weights(9)), topic=P.WEIGHTS_TOPIC)
        changed: list[bool] = []

        def all_read() -> bool:
            changed.append(follower.update())
            return follower.sub.stats.received == received0 + 5

        wait_for(all_read, timeout=5)
        assert not any(changed)
        assert follower.version == 3
        assert follower.sub.stats.dropped == dropped0 + 3
        assert_same_arrays(model_arrays(model), weights(3))

        # Weights that do not fit the model are dropped (counted), never applied or fatal.
        pub.send(
            P.Message(
                P.WEIGHTS, meta={"version": 50}, arrays={"not.a.param": np.ones(3, np.float32)}
            ),
            topic=P.WEIGHTS_TOPIC,
        )

        def bad_dropped() -> bool:
            follower.update()
            return follower.sub.stats.dropped == dropped0 + 4

        wait_for(bad_dropped, timeout=5, interval=0.05)
        assert follower.version == 3

        # A newer one is applied.
        assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(4))).meta["version"] == 4
        wait_for(follower.update, timeout=5)
        assert follower.version == 4
        assert_same_arrays(model_arrays(model), weights(4))

        # Late join through the follower: the latest version, and only if newer.
        assert follower.fetch_latest() is False  # 4 is not newer than 4
        fresh_model = TinyModel()
        fresh = WeightsFollower(follower_role, fresh_model)
        assert fresh.fetch_latest() is True and fresh.version == 4
        assert_same_arrays(model_arrays(fresh_model), weights(4))
    finally:
        follower_role.close()


# --- hostile weights (issue 12): poisoned values, forged senders, version jumps -----------------


def nan_weights(seed: int) -> dict[str, np.ndarray]:
    w = weights(seed)
    w["advantage_head.weight"][0, 0] = np.nan
    return w


def assert_finite_model(model: torch.nn.Module) -> None:
    assert all(torch.isfinite(v).all() for v in model.state_dict().values()), "NaN adopted"


def test_params_drops_non_finite_weights_and_forged_version_floors(params, rpc):
    assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(1))).meta["version"] == 1
    dropped0 = params.stats.snapshot()["rpc"]["dropped"]
    inf = weights(3)
    inf["torso.0.bias"][2] = -np.inf
    bad = [
        P.Message(P.WEIGHTS, arrays=nan_weights(2)),
        P.Message(P.WEIGHTS, arrays=inf),
        # A floor far past the current version would lock every follower out.
        P.Message(P.WEIGHTS, meta={"min_version": 10**15}, arrays=weights(4)),
        P.Message(P.WEIGHTS, meta={"min_version": 2**60}, arrays=weights(4)),
        P.Message(P.WEIGHTS, meta={"min_version": True}, arrays=weights(4)),
        P.Message(P.WEIGHTS, meta={"min_version": "9"}, arrays=weights(4)),
    ]
    for msg in bad:
        rpc.send(msg)
    wait_for(lambda: params.stats.snapshot()["rpc"]["dropped"] == dropped0 + len(bad), timeout=5)
    assert rpc.ch.recv(block=False) is None  # nothing acknowledged
    assert params.version == 1
    assert_same_arrays(rpc.request(P.Message(P.GET_WEIGHTS)).arrays, weights(1))
    # Learning goes on: the next real version, and a resumed learner's floor within the step.
    assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(5))).meta["version"] == 2
    ack = rpc.request(P.Message(P.WEIGHTS, meta={"min_version": 500}, arrays=weights(6)))
    assert ack.meta["version"] == 500


def test_params_takes_a_resumed_learners_floor_when_fresh(params, rpc):
    # A fresh server (no weights yet) continues a resumed learner's numbering, however far.
    ack = rpc.request(P.Message(P.WEIGHTS, meta={"min_version": 50_001}, arrays=weights(1)))
    assert ack.meta["version"] == 50_001 == params.version


def test_follower_keeps_learning_through_poisoned_and_forged_weights(inproc, params, rpc):
    follower_role = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=5)
    lookups: list[str] = []
    real_lookup = follower_role.lookup

    def counted_lookup(role: str, timeout: float = 5.0) -> list[dict]:
        lookups.append(role)
        return real_lookup(role, timeout)

    follower_role.lookup = counted_lookup  # type: ignore[method-assign]
    try:
        follower_role.connect()
        model = TinyModel()
        follower = WeightsFollower(follower_role, model)
        inproc.wait_for_subscriber(P.WEIGHTS_TOPIC)  # its subscription reached params' PUB
        assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(1))).meta["version"] == 1
        wait_for(follower.update, timeout=5)
        assert follower.version == 1 and follower.params_ids == {"params-0"}

        mallory, impostor, forged = (
            connected(inproc, follower, "mallory"),
            connected(inproc, follower, "params-9"),
            connected(inproc, follower, "params-0"),
        )
        by_sender0 = dict(follower.sub.stats.dropped_by_sender)
        lookups0, started = len(lookups), time.monotonic()
        attack = [
            (mallory, {"version": 2}, weights(7)),  # not a params id at all
            (impostor, {"version": 2}, weights(7)),  # a params id the broker does not list
            (forged, {"version": 2}, nan_weights(7)),  # the real id, poisoned values
            (forged, {"version": 10**15}, weights(8)),  # the real id, a lock-out version
            (forged, {"version": 2**63}, weights(8)),  # past 2**53
        ]
        # A flood of forged params ids: dropped, and at most a LOOKUP a second for all of them.
        attack += [(impostor, {"version": 2}, weights(7))] * 50
        for ch, meta, arrays in attack:
            assert ch.send(P.Message(P.WEIGHTS, meta=meta, arrays=arrays), topic=P.WEIGHTS_TOPIC)
        expected = {"mallory": 1, "params-9": 51, "params-0": 3}
        changed: list[bool] = []

        def all_dropped() -> bool:
            changed.append(follower.update())
            stats = follower.sub.stats.dropped_by_sender
            return {k: stats.get(k, 0) - by_sender0.get(k, 0) for k in expected} == expected

        wait_for(all_dropped, timeout=10, interval=0.05)
        elapsed = time.monotonic() - started
        assert not any(changed)
        assert follower.version == 1
        # One LOOKUP for the resync, and at most one a second for the flood of unknown ids.
        assert len(lookups) - lookups0 <= 2 + elapsed / PARAMS_LOOKUP_INTERVAL_S, lookups
        # The v10**15 jump was checked with params (not confirmed): at most once per interval.
        assert 1 <= follower.resyncs <= 1 + elapsed / RESYNC_INTERVAL_S
        assert_same_arrays(model_arrays(model), weights(1))

        # The real updates are adopted as if nothing happened, and the model stays finite.
        for i in (2, 3):
            assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(10 + i))).meta["version"] == i
        wait_for(lambda: follower.update() is not None and follower.version == 3, timeout=5)
        assert follower.version == 3
        assert_same_arrays(model_arrays(model), weights(13))
        assert_finite_model(model)
    finally:
        follower_role.close()


def test_follower_follows_a_resumed_params_and_recovers_from_a_forged_step(
    inproc, params, rpc, monkeypatch
):
    import zrl.roles.weights as weights_module

    monkeypatch.setattr(weights_module, "RESYNC_INTERVAL_S", 0.0)
    follower_role = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=5)
    try:
        follower_role.connect()
        model = TinyModel()
        follower = WeightsFollower(follower_role, model)
        inproc.wait_for_subscriber(P.WEIGHTS_TOPIC)  # its subscription reached params' PUB
        # A params server resumed at v50,001: far past our v0, confirmed by its rpc, adopted.
        ack = rpc.request(P.Message(P.WEIGHTS, meta={"min_version": 50_001}, arrays=weights(1)))
        assert ack.meta["version"] == 50_001
        wait_for(follower.update, timeout=5)
        assert follower.version == 50_001 and follower.sub.stats.dropped == 0
        assert_same_arrays(model_arrays(model), weights(1))

        # Without keys, the real id and a version within the step are forgeable: adopted ...
        forged = connected(inproc, follower, "params-0")
        forged.send(
            P.Message(P.WEIGHTS, meta={"version": 59_000}, arrays=weights(66)),
            topic=P.WEIGHTS_TOPIC,
        )
        wait_for(follower.update, timeout=5)
        assert follower.version == 59_000
        # ... until the next real version, which is "behind": the params rpc is asked and wins.
        assert rpc.request(P.Message(P.WEIGHTS, arrays=weights(2))).meta["version"] == 50_002
        wait_for(lambda: follower.update() is not None and follower.version == 50_002, timeout=5)
        assert follower.version == 50_002
        assert_same_arrays(model_arrays(model), weights(2))
    finally:
        follower_role.close()
