"""Named learning policies (a league with exploiters): the wire fields (``policy``, ``resets``),
the config's layout and refusals, the parameter server's per-policy streams and RESET, and a
weights follower of a named policy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers.params import assert_same_arrays, model_arrays
from zrl.config.experiment import ConfigError, ExperimentConfig, load_config
from zrl.config.league import MAIN
from zrl.roles.base import Role
from zrl.roles.params import ParameterServer
from zrl.roles.weights import WeightsFollower
from zrl.testing.fakes import Rpc, config_model, model_weights
from zrl.testing.inproc import collect
from zrl.testing.probes import wait_for
from zrl.transport import messages as M
from zrl.transport import protocol as P

torch.set_num_threads(1)
EXPLOITER = "main_exploiter_0"


def league_config(learners: int = 2, actors: int = 3, **league: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "policies-test",
            "algo": "ppo",
            "env": {"id": "pettingzoo/tictactoe_v3"},
            "roles": {"actors": actors, "replay": 0, "learners": learners, "league": 1},
            "league": {"main_exploiters": 1, **league},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
        }
    )


# --- the wire ----------------------------------------------------------------------------------


def test_policy_field_defaults_to_main_and_must_be_a_name() -> None:
    assert M.DEFAULT_POLICY == MAIN  # the league's main agent is the run's default stream
    assert M.policy_name({}) == "main"
    assert M.policy_name({"policy": EXPLOITER}) == EXPLOITER
    for bad in ("", "Main", "a/b", "main@3", "x" * 65, 3, None, ["main"]):
        with pytest.raises(P.ProtocolError, match="policy"):
            M.policy_name({"policy": bad})
    assert M.policy_meta("main") == {} and M.policy_meta(EXPLOITER) == {"policy": EXPLOITER}


def test_policy_topics_never_prefix_match_the_default_ones() -> None:
    assert M.policy_topic(P.WEIGHTS_TOPIC, "main") == "weights"
    assert M.policy_topic(P.ROLLOUTS_TOPIC, "main") == "rollouts/"
    named = M.policy_topic(P.WEIGHTS_TOPIC, EXPLOITER)
    assert named == f"policy/{EXPLOITER}/weights"
    assert not named.startswith(P.WEIGHTS_TOPIC)
    assert not M.policy_topic(P.ROLLOUTS_TOPIC, EXPLOITER).startswith(P.ROLLOUTS_TOPIC)
    # One exploiter's topic is no prefix of another's (main_exploiter_1 vs _10).
    one, ten = (M.policy_topic(P.ROLLOUTS_TOPIC, f"main_exploiter_{i}") for i in (1, 10))
    assert not ten.startswith(one.removesuffix("rollouts/"))


def test_reset_count_is_a_non_negative_int() -> None:
    assert M.reset_count({}) == 0 and M.reset_count({"resets": 4}) == 4
    for bad in (-1, True, 1.0, "2", 2**60):
        with pytest.raises(P.ProtocolError, match="resets"):
            M.reset_count({"resets": bad})


# --- the config ----------------------------------------------------------------------------------


def test_layout_of_policies_learners_and_actors() -> None:
    cfg = league_config(learners=3, actors=5, league_exploiters=1)
    assert cfg.policies == ["main", EXPLOITER, "league_exploiter_0"]
    assert [cfg.learner_policy(i) for i in range(3)] == cfg.policies
    assert [cfg.learner_rank(i) for i in range(3)] == [0, 0, 0]  # no DD-PPO across players
    assert cfg.learners_per_policy() == 1
    assert [cfg.actor_policy(i) for i in range(5)] == cfg.policies + ["main", EXPLOITER]
    assert [cfg.policy_actors(p) for p in cfg.policies] == [2, 2, 1]
    plain = ExperimentConfig.model_validate({"algo": "ppo", "roles": {"learners": 2, "replay": 0}})
    assert plain.policies == ["main"] and plain.learners_per_policy() == 2  # DD-PPO
    assert [plain.learner_rank(i) for i in range(2)] == [0, 1]


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (["roles.learners=1"], ["roles.learners (1)", "league.main_exploiters (1)", "= 2"]),
        (["roles.learners=3"], ["roles.learners (3)", "league.league_exploiters (0)"]),
        (["roles.actors=1"], ["roles.actors (1)", "at least", "league.main_exploiters"]),
        (["roles.league=0"], ["league.main_exploiters (1)", "roles.league: 1"]),
        (["algo=impala", "roles.replay=1"], ["league.main_exploiters", "impala", "replay"]),
    ],
)
def test_exploiters_refused_with_the_keys_named(tmp_path, override, words) -> None:
    path = tmp_path / "league.yaml"
    path.write_text(
        "algo: ppo\nenv: {id: pettingzoo/tictactoe_v3}\n"
        "roles: {actors: 2, replay: 0, learners: 2, league: 1}\n"
        "league: {main_exploiters: 1}\n"
    )
    load_config(path)  # the base is valid
    with pytest.raises(ConfigError) as err:
        load_config(path, override)
    for word in words:
        assert word in str(err.value), str(err.value)


# --- the parameter server ------------------------------------------------------------------------


def weights(seed: int) -> Any:
    """Random weights in the layout of ``league_config()``'s model (tictactoe's PPO)."""
    return model_weights(league_config(), seed)


def TinyModel() -> torch.nn.Module:  # noqa: N802 - a model class to its callers
    return config_model(league_config())


@pytest.fixture
def exploiter_rpc(zmq_ctx, params: ParameterServer) -> Iterator[Rpc]:
    """The connection of learner 1, which trains the exploiter (``learner_policy(1)``)."""
    r = Rpc(zmq_ctx, params.rpc_endpoint, sender="learner-1", broker=params.broker)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def params(inproc) -> ParameterServer:
    inproc.start_broker(league_config())
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    return ps


def test_params_keeps_one_stream_per_policy(inproc, params, rpc, exploiter_rpc) -> None:
    main_sub = inproc.sub(P.WEIGHTS_TOPIC)
    named_sub = inproc.sub(M.policy_topic(P.WEIGHTS_TOPIC, EXPLOITER))
    inproc.wait_subscribed(main_sub)
    inproc.wait_subscribed(named_sub)
    named = {"policy": EXPLOITER}
    assert rpc.request(P.Message(P.GET_WEIGHTS, meta=named)).kind == P.NO_WEIGHTS
    for i in (1, 2):
        ack = exploiter_rpc.request(P.Message(P.WEIGHTS, meta=named, arrays=weights(10 + i)))
        assert ack.kind == P.ACK and ack.meta == {"version": i, "policy": EXPLOITER}
    ack = rpc.request(P.Message(P.WEIGHTS, arrays=weights(1)))
    assert ack.meta == {"version": 1}  # main counts its own versions
    assert params.version == 1 and params.streams[EXPLOITER].version == 2

    # Each stream on its own topic: main's subscriber never sees the exploiter's weights.
    got = collect(named_sub, until=2, timeout=5)
    assert [(m.meta["version"], m.meta["policy"]) for m in got] == [(1, EXPLOITER), (2, EXPLOITER)]
    mains = collect(main_sub, until=1, timeout=5)
    assert [m.meta["version"] for m in mains] == [1] and "policy" not in mains[0].meta
    latest = rpc.request(P.Message(P.GET_WEIGHTS, meta=named))
    assert latest.meta["version"] == 2 and latest.meta["policy"] == EXPLOITER
    assert_same_arrays(latest.arrays, weights(12))
    assert params.heartbeat_info()[f"weights_version_{EXPLOITER}"] == 2

    # A policy the run does not have is refused and counted; no stream is made for it.
    dropped = params.stats.snapshot()["rpc"]["dropped"]
    rpc.send(P.Message(P.WEIGHTS, meta={"policy": "main_exploiter_9"}, arrays=weights(5)))
    rpc.send(P.Message(P.GET_WEIGHTS, meta={"policy": "Bad/Name"}))
    # Nor may a learner send another policy's weights (learner 0 trains main).
    rpc.send(P.Message(P.WEIGHTS, meta=named, arrays=weights(6)))
    wait_for(lambda: params.stats.snapshot()["rpc"]["dropped"] == dropped + 3, timeout=5)
    assert set(params.streams) == {"main", EXPLOITER}
    assert params.streams[EXPLOITER].version == 2 and params.weights_refused == 1


def test_reset_reaches_the_policys_learner_in_its_control(params, rpc, exploiter_rpc) -> None:
    named = {"policy": EXPLOITER}
    ack = exploiter_rpc.request(P.Message(P.WEIGHTS, meta=named, arrays=weights(1)))
    assert ack.meta == {"version": 1, **named}
    assert exploiter_rpc.request(P.Message(P.GET_CONTROL, meta=named)).meta == named
    league = Rpc(params.ctx, params.rpc_endpoint, sender="league-0", broker=params.broker)
    try:
        rpc.send(P.Message(P.RESET, meta={**named, "resets": 5}))  # a learner may not reset
        league.send(P.Message(P.RESET, meta={**named, "resets": 2}))
        league.send(P.Message(P.RESET, meta={**named, "resets": 1}))  # late repeat: not back
        wait_for(lambda: params.streams[EXPLOITER].resets == 2, timeout=5)
        wait_for(lambda: params.weights_refused == 1, timeout=5)
    finally:
        league.close()
    control = exploiter_rpc.request(P.Message(P.GET_CONTROL, meta=named))
    assert control.kind == P.CONTROL and control.meta == {**named, "resets": 2}
    assert rpc.request(P.Message(P.GET_CONTROL)).meta == {}  # main's: never reset
    # Only the policy's own learner may ask (learner 0 trains main): dropped and counted.
    rpc.send(P.Message(P.GET_CONTROL, meta=named))
    wait_for(lambda: params.weights_refused == 2, timeout=5)


def test_follower_of_a_named_policy_takes_only_its_stream(
    inproc, params, rpc, exploiter_rpc
) -> None:
    role = Role(inproc.addr, ctx=inproc.ctx, connect_timeout=5)
    try:
        role.connect()
        model = TinyModel()
        follower = WeightsFollower(role, model, EXPLOITER)
        topic = M.policy_topic(P.WEIGHTS_TOPIC, EXPLOITER)
        inproc.wait_for_subscriber(topic)
        rpc.request(P.Message(P.WEIGHTS, arrays=weights(1)))  # main's v1: not ours
        exploiter_rpc.request(P.Message(P.WEIGHTS, meta={"policy": EXPLOITER}, arrays=weights(7)))
        wait_for(follower.update, timeout=5)
        assert follower.version == 1 and follower.meta["policy"] == EXPLOITER
        assert_same_arrays(model_arrays(model), weights(7))

        # On its topic but naming another policy (a forgery or a bug): dropped and counted.
        pub = inproc.pub("params-0")
        inproc.wait_for_subscriber(topic, pub=pub)
        dropped = follower.sub.stats.dropped
        pub.send(P.Message(P.WEIGHTS, meta={"version": 2}, arrays=weights(8)), topic=topic)
        wait_for(lambda: follower.update() or follower.sub.stats.dropped > dropped, timeout=5)
        assert follower.version == 1

        late = WeightsFollower(role, TinyModel(), EXPLOITER)
        assert late.fetch_latest() and late.version == 1  # GET_WEIGHTS names the policy
    finally:
        role.close()


# --- the learner's reset -------------------------------------------------------------------------


class FakeUpdate:
    """A model, its optimizer and a counter, saved and restored as a learner's update is."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.rounds = 0

    def train_once(self) -> None:
        self.optimizer.zero_grad()
        self.model(torch.ones(1, 3)).sum().backward()
        self.optimizer.step()
        self.rounds += 1

    def state_dict(self) -> dict:
        return {
            "online": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rounds = state["rounds"]


class FakeParams:
    """The learner's params channel: queued ACKs (a meta with a ``version``) and CONTROLs
    (the others), and what was dropped."""

    def __init__(self, *replies: dict) -> None:
        self.acks = [
            (b"", P.Message(P.ACK if "version" in meta else P.CONTROL, meta=meta))
            for meta in replies
        ]
        self.dropped: list[str] = []

    def recv(self, block: bool = True) -> Any:
        return self.acks.pop(0) if self.acks else None

    def drop(self, sender: str, why: str) -> None:
        self.dropped.append(why)


def test_learner_resets_to_its_initial_weights_when_a_control_says_so() -> None:
    import copy
    import logging

    from zrl.roles.learner import Learner

    learner = Learner("inproc://unused")
    learner.log = logging.getLogger("test")
    update = FakeUpdate()
    learner.update = update  # type: ignore[assignment]
    learner.policy = EXPLOITER
    learner.initial_state = copy.deepcopy(update.state_dict())
    initial = {k: v.clone() for k, v in update.model.state_dict().items()}
    sent: list[int] = []
    learner.send_weights = lambda: sent.append(learner.resets)  # type: ignore[method-assign]
    for _ in range(3):
        update.train_once()
    assert not torch.equal(update.model.weight, initial["weight"])

    learner.params = FakeParams({"version": 7}, {"version": 8}, {"resets": "x"})  # type: ignore[assignment]
    learner.read_acks()
    assert learner.resets == 0 and sent == []  # no reset asked; a bad count is dropped
    assert learner.weights_version == 8 and len(learner.params.dropped) == 1  # type: ignore[union-attr]

    learner.params = FakeParams({"version": 9}, {"resets": 1})  # type: ignore[assignment]
    learner.read_acks()
    assert learner.resets == 1 and sent == [1]  # weights sent at once, with resets 1
    for name, value in initial.items():
        assert torch.equal(update.model.state_dict()[name], value), name
    assert update.optimizer.state_dict()["state"] == {}  # Adam's moments are gone too
    assert update.rounds == 3  # counters go on

    learner.params = FakeParams({"version": 10}, {"resets": 1})  # type: ignore[assignment]
    update.train_once()
    learner.read_acks()  # the same count again: nothing to do
    assert sent == [1] and not torch.equal(update.model.weight, initial["weight"])
