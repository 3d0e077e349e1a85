"""The host agent's weights relay, on real sockets: an inproc broker and parameter server, the
agent's relay on ipc, followers under the agent (through the relay) and one without (the bus)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.helpers.params import TinyModel, assert_same_arrays, config, model_arrays, weights
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.roles.params import ParameterServer
from zrl.roles.role_sockets import WEIGHTS_RELAY_ENV
from zrl.roles.weights import WeightsFollower
from zrl.run import host_agent
from zrl.run.children import RestartPolicy
from zrl.run.host_agent import HostAgent, parse_role_specs
from zrl.run.weights_relay import RELAY_HWM, WeightsRelay, is_weights_topic
from zrl.testing.fakes import Rpc
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.endpoints import connect_topics
from zrl.transport.sockets import make_socket


@pytest.fixture
def params(inproc) -> ParameterServer:
    inproc.start_broker(config())
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    return ps


def role(inproc: InProc) -> Role:
    r = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=10)
    r.connect()
    return r


def relay_of(r: Role, directory: Path) -> WeightsRelay:
    return WeightsRelay(r.ctx, r.endpoints, directory, max_message_bytes=r.max_topic_message_bytes)


def test_weights_topics() -> None:
    assert is_weights_topic(b"weights") and is_weights_topic(b"policy/exploiter_1/weights")
    bad = (b"weightsx", b"weights/", b"metrics", b"", b"policy/Bad/weights", b"policy//weights")
    for topic in bad:
        assert not is_weights_topic(topic), topic
    assert not is_weights_topic(b"policy/\xff/weights")


def test_an_agents_children_follow_weights_through_its_relay_and_others_through_the_bus(
    inproc, params, zmq_ctx, tmp_path, monkeypatch
):
    """The agent's children get each version from its relay (one copy from the broker for the
    host) and apply it; a follower without an agent gets it from the broker's bus."""
    agent = HostAgent(
        inproc.addr,
        parse_role_specs(["actor=2@0"]),
        log_dir=tmp_path,
        role_args=[],
        restart=RestartPolicy((0.0,), 1),
        ctx=inproc.ctx,
        connect_timeout=10,
    )
    envs: list[dict[str, str]] = []
    monkeypatch.setattr(host_agent, "launch", lambda argv, log, zygote, env: envs.append(env))
    rpc = Rpc(zmq_ctx, params.rpc_endpoint, broker=params.broker)
    roles: list[Role] = []
    try:
        agent.connect()
        agent.open_reports()
        agent.open_weights_relay()
        relay = agent.relay
        assert relay is not None and relay.alive()
        for child in agent.children:
            agent.spawn(child)
        # What the agent gives its children: the relay's ipc endpoint in its private directory.
        assert [env[WEIGHTS_RELAY_ENV] for env in envs] == [relay.endpoint] * 2
        assert agent.reports_dir is not None and relay.endpoint.startswith(
            f"ipc://{agent.reports_dir}/"
        )
        assert (agent.reports_dir.stat().st_mode & 0o777) == 0o700

        models = [TinyModel() for _ in range(3)]
        followers: list[WeightsFollower] = []
        for k, model in enumerate(models):
            if k < 2:  # the agent's children, with the environment it gave them
                monkeypatch.setenv(WEIGHTS_RELAY_ENV, envs[k][WEIGHTS_RELAY_ENV])
            else:
                monkeypatch.delenv(WEIGHTS_RELAY_ENV)
            roles.append(role(inproc))
            followers.append(WeightsFollower(roles[-1], model))
        wait_for(lambda: relay.topics == {P.WEIGHTS_TOPIC.encode()}, timeout=20)

        pushed: list[int] = []

        def everyone_has_weights() -> bool:
            pushed.append(len(pushed) + 1)  # a new version until every follower adopted one
            rpc.request(P.Message(P.WEIGHTS, arrays=weights(pushed[-1])))
            for f in followers:
                f.update()
            return all(f.version > 0 for f in followers)

        wait_for(everyone_has_weights, timeout=30, interval=0.2)
        for f, m in zip(followers, models, strict=True):
            assert_same_arrays(model_arrays(m), weights(f.version))  # applied, checked
        assert relay.relayed >= 1 and relay.dropped == 0
        # One copy per version reached the host, whatever its number of children.
        assert relay.received <= len(pushed)

        # The children's only way to the bus is the relay: without it they fall behind.
        relay.close()
        assert not relay.alive()
        before = len(pushed)  # the newest version that can have been relayed

        def loner_moved_on() -> bool:
            pushed.append(len(pushed) + 1)
            rpc.request(P.Message(P.WEIGHTS, arrays=weights(pushed[-1])))
            for f in followers:
                f.update()
            return followers[2].version >= before + 2

        wait_for(loner_moved_on, timeout=30, interval=0.2)
        assert all(0 < f.version <= before for f in followers[:2])
        with pytest.raises(RoleError, match="weights relay of this host stopped"):
            agent.step()
    finally:
        for r in roles:
            r.close()
        rpc.close()
        agent.close()
        agent.teardown()


def test_a_relayed_message_is_byte_identical_and_other_topics_are_not_relayed(
    inproc, params, zmq_ctx, tmp_path
):
    host = role(inproc)
    relay = relay_of(host, tmp_path)
    relay.start()
    direct = make_socket(zmq_ctx, zmq.SUB, rcvtimeo_ms=100, max_message_bytes=2**26)
    direct.setsockopt(zmq.SUBSCRIBE, P.WEIGHTS_TOPIC.encode())
    connect_topics(direct, host.endpoints)
    relayed = make_socket(zmq_ctx, zmq.SUB, rcvtimeo_ms=100, max_message_bytes=2**26)
    for topic in (P.WEIGHTS_TOPIC, "metrics"):
        relayed.setsockopt(zmq.SUBSCRIBE, topic.encode())
    relayed.connect(relay.endpoint)
    pub = inproc.pub("params-0")
    got: dict[str, dict[int, list[bytes]]] = {"direct": {}, "relayed": {}}
    sent = [0]

    def both_got_one() -> bool:
        sent[0] += 1
        big = np.full(300_000, sent[0], np.float32)  # the bulk lane
        msg = P.Message(P.WEIGHTS, meta={"version": sent[0]}, arrays={"w": big})
        pub.send(msg, topic=P.WEIGHTS_TOPIC)
        pub.send(P.Message(P.METRICS, meta={"n": sent[0]}), topic="metrics")
        for name, sock in (("direct", direct), ("relayed", relayed)):
            while sock.poll(50):
                frames = sock.recv_multipart()
                got[name][P.decode(frames[1:]).meta.get("version", -1)] = frames
        return bool(set(got["direct"]) & set(got["relayed"]) - {-1})

    try:
        wait_for(both_got_one, timeout=30, interval=0.1)
        both = sorted(set(got["direct"]) & set(got["relayed"]) - {-1})
        for v in both:
            assert got["relayed"][v] == got["direct"][v]  # frame by frame, byte for byte
        assert -1 not in got["relayed"]  # metrics: not a weights topic, never subscribed up
        assert relay.topics == {P.WEIGHTS_TOPIC.encode()} and relay.refused_subscriptions >= 1
    finally:
        direct.close(linger=0)
        relayed.close(linger=0)
        relay.close()
        host.close()


def test_the_relays_queues_are_bounded(inproc, params, zmq_ctx, tmp_path):
    """A child that does not read holds at most the relay's and its own HWM of versions."""
    host = role(inproc)
    relay = relay_of(host, tmp_path)
    assert relay.sub.getsockopt(zmq.RCVHWM) == RELAY_HWM
    assert relay.out.getsockopt(zmq.SNDHWM) == RELAY_HWM
    relay.start()
    stuck = make_socket(zmq_ctx, zmq.SUB, rcvhwm=1, max_message_bytes=2**26)
    stuck.setsockopt(zmq.SUBSCRIBE, P.WEIGHTS_TOPIC.encode())
    stuck.connect(relay.endpoint)
    pub = inproc.pub("params-0")
    payload = {"w": np.ones(2**17, np.float32)}  # 512 KiB
    sent = [0]

    def many_relayed() -> bool:
        sent[0] += 1
        pub.send(P.Message(P.WEIGHTS, meta={"version": sent[0]}, arrays=payload), topic="weights")
        return relay.relayed >= 30

    try:
        wait_for(many_relayed, timeout=60, interval=0.02)
        held = 0
        while stuck.poll(200):
            stuck.recv_multipart()
            held += 1
        # The XPUB's pipe, the SUB's queue, and at most a message or two in flight between.
        assert 1 <= held <= 2 * RELAY_HWM + 2 < relay.relayed
    finally:
        stuck.close(linger=0)
        relay.close()
        host.close()


def test_a_weights_relay_must_be_an_ipc_path(inproc, params, monkeypatch):
    monkeypatch.setenv(WEIGHTS_RELAY_ENV, "tcp://10.0.0.1:5555")
    r = role(inproc)
    try:
        with pytest.raises(RoleError, match="ipc://"):
            WeightsFollower(r, TinyModel())
    finally:
        r.close()
