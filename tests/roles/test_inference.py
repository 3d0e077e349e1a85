"""The inference role (``zrl.roles.inference``) and the actor's side of it
(``zrl.roles.inference_client``): actors acting through it collect exactly what their own model
would, recurrent state included; joined forwards equal separate ones; hostile requests are
counted and dropped."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from zrl.algos.kernel.batches import resolve_device
from zrl.config.experiment import ExperimentConfig
from zrl.roles.actor import Actor
from zrl.roles.inference import InferenceServer, JoinBuffers, Request, batches
from zrl.testing.fakes import Rpc, config_model
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

E, T = 4, 16


def config(algo: str, inference: int, **extra: Any) -> ExperimentConfig:
    table = {"apex_dqn": "prioritized"}.get(algo, "fifo")
    return ExperimentConfig.model_validate(
        {
            "name": "inference-test",
            "algo": algo,
            "seed": 5,
            "env": {"id": "CartPole-v1", "num_envs": E},
            "model": {"hidden": [16], **extra.pop("model", {})},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            "roles": {"actors": 1, "inference": inference},
            "actor": {"trajectory_length": T, "max_in_flight": 2},
            "replay": {"table": table},
            **extra,
        }
    )


def trajectories(inproc: InProc, cfg: ExperimentConfig, n: int) -> tuple[list[P.Message], Any]:
    """``n`` trajectories of actor 0 (and the inference role when ``cfg`` plans one),
    acknowledged as a replay shard would."""
    inproc.start_broker(cfg)
    experience = inproc.pull("experience")
    server = inproc.start(InferenceServer, index=0) if cfg.roles.inference else None
    actor = inproc.start(Actor, index=0)
    pub = inproc.pub("replay-0")
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)
    out: list[P.Message] = []
    deadline = time.monotonic() + 60
    while len(out) < n and time.monotonic() < deadline:
        got = experience.recv()
        if got is not None:
            out.append(got[1])
            meta = {"seq": got[1].seq, "inserted": 1, "incarnation": 1}
            pub.send(P.Message(P.ACK, meta=meta), topic=P.ack_topic("actor-0"))
    assert len(out) == n, f"got {len(out)} of {n} trajectories"
    return out, (actor, server)


@pytest.mark.parametrize(
    "algo, extra",
    [
        ("appo", {}),
        ("impala", {"model": {"core": "lstm", "core_size": 8}}),
        ("apex_dqn", {}),
    ],
    ids=["appo", "impala-lstm", "apex_dqn"],
)
def test_an_actor_acting_through_the_inference_role_sends_what_its_own_model_would(
    zmq_ctx: Any, algo: str, extra: dict[str, Any]
) -> None:
    """At the initial weights (both built from the run's seed) the server's forwards are the
    actor's own: every array of every trajectory is equal (floats up to rounding), the
    recurrent state and the episode starts (``first``) of an LSTM policy and Ape-X's
    priorities (a forward of the whole trajectory) included."""
    n = 4
    runs = {}
    for inference in (0, 1):
        h = InProc(zmq_ctx, f"inference-{inference}")
        try:
            sent, (actor, server) = trajectories(h, config(algo, inference, **dict(extra)), n)
            runs[inference] = sent
            if server is not None:
                assert isinstance(actor, Actor) and actor.inference is not None
                assert actor.weights is None  # the server follows the weights, not the actor
                info = actor.heartbeat_info()
                assert info["inference"] == "inference-0"
                assert info["inference_requests"] >= n * T
                assert server.heartbeat_info()["requests"] >= info["inference_requests"] - 1
                assert server.heartbeat_info()["requests_refused"] == 0
        finally:
            h.close()
    own, served = runs[0], runs[1]
    for a, b in zip(own, served, strict=True):
        assert a.meta["weights_version"] == b.meta["weights_version"] == 0
        assert sorted(a.arrays) == sorted(b.arrays)
        for name in a.arrays:
            if np.issubdtype(a.arrays[name].dtype, np.floating):
                # The server's forward joins the actor's rows with others: the same numbers
                # up to the rounding of a different batch size (which CPUs' kernels show).
                np.testing.assert_allclose(
                    a.arrays[name], b.arrays[name], rtol=1e-5, atol=1e-6, err_msg=name
                )
            else:  # actions, episode starts, counts: exactly the same
                np.testing.assert_array_equal(a.arrays[name], b.arrays[name], err_msg=name)
    if "state" in own[0].arrays:
        # Episodes ended inside the trajectories: the state was zeroed there and carried on.
        assert any(m.arrays["first"][:, 1:].any() for m in own)
        assert any(np.abs(m.arrays["state"]).sum() > 0 for m in served)


def test_batches_join_requests_of_a_method_up_to_the_row_bound() -> None:
    def req(method: str, rows: int, seq: int) -> Request:
        return Request(b"x", seq, method, [np.zeros((rows, 2), np.float32)])

    requests = [req("forward", 3, 0), req("step", 2, 1), req("forward", 4, 2), req("forward", 9, 3)]
    runs = batches(requests, max_rows=8)
    assert [[r.seq for r in run] for run in runs] == [[0, 2], [3], [1]]


def test_a_joined_forward_equals_the_forwards_of_each_request() -> None:
    cfg = config("impala", 1, model={"core": "gru", "core_size": 8})
    server = InferenceServer("inproc://unused", index=0)
    server.model = config_model(cfg).eval()
    rng = np.random.default_rng(0)

    def req(rows: int, seq: int) -> Request:
        obs = rng.normal(size=(rows, 4)).astype(np.float32)
        state = rng.normal(size=(rows, 8)).astype(np.float32)
        return Request(b"x", seq, "step", [obs, state])

    run = [req(3, 0), req(5, 1), req(1, 2)]
    joined = server.forward(run)
    for r, outputs in zip(run, joined, strict=True):
        alone = server.forward([r])[0]
        assert len(outputs) == len(alone) == 3  # logits, value, next state
        for got, want in zip(outputs, alone, strict=True):
            assert got.shape[0] == r.rows
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_join_buffers_are_reused_and_grow() -> None:
    buffers = JoinBuffers(pinned=False)
    a = buffers.join(0, [np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)])
    assert a.shape == (3, 3) and a[:2].sum() == 6 and a[2].sum() == 0
    first = buffers.buffers[0].data_ptr()
    buffers.join(0, [np.ones((3, 3), np.float32)])
    assert buffers.buffers[0].data_ptr() == first  # fits: the same memory
    big = buffers.join(0, [np.ones((7, 3), np.float32)])
    assert big.shape == (7, 3) and len(buffers.buffers[0]) >= 7


def infer(seq: int, rows: int = 2, method: str = "step", **arrays: np.ndarray) -> P.Message:
    base = {"obs": np.zeros((rows, 4), np.float32), "state": np.zeros((rows, 8), np.float32)}
    if method != "step":
        del base["state"]
    return P.Message(P.INFER, meta={"method": method, "seq": seq}, arrays={**base, **arrays})


def test_requests_the_config_the_spaces_and_the_registry_do_not_allow_are_dropped(
    inproc: InProc, zmq_ctx: Any
) -> None:
    cfg = config("impala", 1, model={"core": "gru", "core_size": 8})
    inproc.start_broker(cfg)
    server = inproc.start(InferenceServer, index=0)
    assert isinstance(server, InferenceServer)
    endpoint = server.rpc_endpoint
    actor = Rpc(zmq_ctx, endpoint, "actor-0", broker=inproc.addr, server="inference")
    try:
        reply = actor.request(infer(1))
        version, outputs = M.inferred_outputs(reply, 2)
        assert reply.kind == P.INFERRED and reply.meta["seq"] == 1 and version == 0
        assert [o.shape for o in outputs] == [(2, 2), (2,), (2, 8)]

        max_rows = M.max_infer_rows(E, T)
        forged = [
            infer(2, method="unroll"),  # not a method an actor may ask for
            infer(3, method="value"),
            P.Message(P.INFER, meta={"method": "step", "seq": "x"}, arrays=infer(4).arrays),
            infer(5, obs=np.zeros((2, 5), np.float32)),  # not the env's observation shape
            infer(6, obs=np.zeros((2, 4), np.uint8)),  # not its dtype
            infer(7, state=np.zeros((2, 9), np.float32)),  # not the model's state width
            infer(8, obs=np.full((2, 4), np.nan, np.float32)),
            infer(9, rows=max_rows + 1),  # more rows than an actor ever asks for
            infer(10, extra=np.zeros(3, np.float32)),
            P.Message(P.GET_WEIGHTS),
        ]
        for msg in forged:
            actor.send(msg)
        wait_for(lambda: server.heartbeat_info()["requests_refused"] == len(forged) - 1)
        # Still serving, and none of those was answered.
        reply = actor.request(infer(11, rows=max_rows))
        assert reply.meta["seq"] == 11
        assert M.inferred_outputs(reply, max_rows)[1][0].shape == (max_rows, 2)
    finally:
        actor.close()

    # Connections no planned actor vouches for: unregistered, a learner, an unplanned actor.
    strangers = [
        Rpc(zmq_ctx, endpoint, "actor-0"),
        Rpc(zmq_ctx, endpoint, "learner-0", broker=inproc.addr, server="inference"),
        Rpc(zmq_ctx, endpoint, "actor-7", broker=inproc.addr, server="inference"),
    ]
    refused = server.heartbeat_info()["requests_refused"]
    try:
        for i, peer in enumerate(strangers):
            peer.send(infer(100 + i))
        wait_for(
            lambda: server.heartbeat_info()["requests_refused"] == refused + len(strangers),
            timeout=20,
        )
        for peer in strangers:
            assert not peer.ch.sock.poll(200)
    finally:
        for peer in strangers:
            peer.close()


def test_an_actor_waits_for_its_inference_role_and_sends_again_when_it_is_gone(
    zmq_ctx: Any,
) -> None:
    """The actor's requests are answered by whichever inference-0 is registered: one that
    stops answering is asked again, on a fresh connection, once a new one registered."""
    cfg = config("appo", 1)
    cfg.inference.request_timeout_s = 1.0
    h = InProc(zmq_ctx, "inference-restart")
    try:
        h.start_broker(cfg)
        experience = h.pull("experience")
        server = h.start(InferenceServer, index=0)
        actor = h.start(Actor, index=0)
        assert isinstance(actor, Actor) and actor.inference is not None
        wait_for(lambda: experience.sock.poll(100) != 0, timeout=30)
        h.stop_role(server)
        h.start(InferenceServer, index=0)
        drain(experience)  # the window reopens only through acks: let the actor ask again
        pub = h.pub("replay-0")
        h.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)
        for seq in range(4):
            meta = {"seq": seq, "inserted": 1, "incarnation": 1}
            pub.send(P.Message(P.ACK, meta=meta), topic=P.ack_topic("actor-0"))
        wait_for(lambda: actor.trajectories >= 4, timeout=60)
        assert actor.heartbeat_info()["inference_resent"] >= 1
    finally:
        h.close()


def drain(channel: Channel) -> None:
    while channel.recv(block=False) is not None:
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_forwards_on_a_gpu_equal_those_on_the_cpu() -> None:
    cfg = config("appo", 1)
    cpu = InferenceServer("inproc://unused", index=0)
    cpu.model = config_model(cfg).eval()
    gpu = InferenceServer("inproc://unused", index=0)
    gpu.device = resolve_device("cuda", "inference.device")
    gpu.staging = JoinBuffers(pinned=True)
    gpu.model = config_model(cfg).to(gpu.device).eval()
    gpu.model.load_state_dict(cpu.model.state_dict())
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    run = [Request(b"x", 0, "forward", [obs[:40]]), Request(b"y", 1, "forward", [obs[40:]])]
    for want, got in zip(cpu.forward(run), gpu.forward(run), strict=True):
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_no_gpu_for_inference_is_an_error_naming_the_key() -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(Exception, match=r"inference.device='cuda', but torch sees no GPU"):
        resolve_device("cuda", "inference.device")
    assert resolve_device("auto", "inference.device").type == "cpu"


def test_alphazero_actors_search_through_the_inference_role(zmq_ctx: Any) -> None:
    """AlphaZero's self-play moves for both seats, so it plays no opponent model: every leaf
    of its searches is evaluated by the inference role (one request a simulation for all of
    the actor's games), and the samples it sends are well-formed visit distributions."""
    cfg = ExperimentConfig.model_validate(
        {
            "name": "inference-alphazero",
            "algo": "alphazero",
            "seed": 5,
            "env": {
                "id": "pettingzoo/tictactoe_v3",
                "num_envs": E,
                "multiagent": {"opponent": "self", "self_play_seats": "both"},
            },
            "model": {"hidden": [16]},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            "roles": {"actors": 1, "replay": 0, "learners": 1, "inference": 1},
            "actor": {"trajectory_length": 9},
            "alphazero": {"simulations": 4},
        }
    )
    h = InProc(zmq_ctx, "inference-alphazero")
    try:
        h.start_broker(cfg)
        rollouts = h.sub(P.ROLLOUTS_TOPIC)
        server = h.start(InferenceServer, index=0)
        actor = h.start(Actor, index=0)
        got: list[P.Message] = []

        def samples() -> bool:
            item = rollouts.recv()
            if item is not None:
                got.append(item[1])
            return sum(len(m.arrays["value"]) for m in got) >= 18  # two games' moves at least

        wait_for(samples, timeout=60, message=lambda: f"{len(got)} sample messages in 60 s")
        assert isinstance(actor, Actor) and actor.inference is not None
        info = actor.heartbeat_info()
        # A search is one forward for the roots and one a simulation, all games joined.
        assert info["inference_requests"] >= 2 * (1 + 4)
        assert server.heartbeat_info()["requests_refused"] == 0
        for m in got:
            policy, value = m.arrays["policy"], m.arrays["value"]
            assert np.allclose(policy.sum(axis=1), 1.0) and (policy >= 0).all()
            assert set(np.unique(value)) <= {-1.0, 0.0, 1.0}
    finally:
        h.close()
