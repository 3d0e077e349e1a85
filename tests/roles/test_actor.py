"""``Actor`` in-process: trajectory contents, the credit window, weights updates, epsilons."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from zrl.algos.apex_dqn.policy import ApexDQNPolicy
from zrl.algos.kernel.exploration import apex_epsilons
from zrl.algos.models import build_model
from zrl.config.experiment import ConfigError, ExperimentConfig, config_from_dict
from zrl.envs.vector import EnvGroups, EpisodeTracker, make_vector_env
from zrl.nets.discrete import build_q_network
from zrl.nets.wire import model_to_arrays
from zrl.roles import insert_acks
from zrl.roles.actor import Actor
from zrl.roles.insert_acks import InsertAcks
from zrl.roles.params import ParameterServer
from zrl.roles.replay import ReplayServer
from zrl.testing.inproc import collect
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

torch.set_num_threads(1)

E, T = 4, 8
ARRAYS = {
    "obs": (np.float32, (E, T, 4)),
    "action": (np.int64, (E, T)),
    "reward": (np.float32, (E, T)),
    "terminated": (np.bool_, (E, T)),
    "truncated": (np.bool_, (E, T)),
    "valid": (np.bool_, (E, T)),
    "next_obs": (np.float32, (E, T, 4)),
    "priority": (np.float32, (E, T)),
}


def config(**roles: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "actor-test",
            "seed": 11,
            "env": {"id": "CartPole-v1", "num_envs": E},
            "model": {"hidden": [16]},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
            "roles": {"actors": 1, **roles},
            "actor": {"trajectory_length": T, "max_in_flight": 2},
            "replay": {"n_step": 3, "gamma": 0.99},
        }
    )


INCARNATION = 1234  # of the test's stand-in replay shard


def ack(pub: Channel, actor_id: str, seq: int, incarnation: int = INCARNATION) -> None:
    meta = {"seq": seq, "inserted": 1, "incarnation": incarnation}
    pub.send(P.Message(P.ACK, meta=meta), topic=P.ack_topic(actor_id))


def other_weights(seed: int) -> dict[str, np.ndarray]:
    """Weights of the actor's architecture, but not its initial ones."""
    probe = make_vector_env(config().env, num_envs=1)
    torch.manual_seed(seed)
    net = build_q_network(probe.single_observation_space, probe.single_action_space, [16], True)
    probe.close()
    return model_to_arrays(net)


def receive_acking(
    experience: Channel, pub: Channel, actor_id: str, n: int, timeout: float = 20.0
) -> list[P.Message]:
    """Receive ``n`` trajectories, acknowledging each as a replay shard would."""
    out: list[P.Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        got = experience.recv()
        if got is not None:
            out.append(got[1])
            ack(pub, actor_id, got[1].seq)
    assert len(out) == n, f"got {len(out)} of {n} trajectories"
    return out


def test_actor_trajectories_credit_window_and_weights(inproc):
    inproc.start_broker(config())
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and actor.id == "actor-0"
    pub = inproc.pub("replay-0")
    # The PUB learns the actor's ack subscription through the device.
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)

    # Credit window: without acks the actor sends max_in_flight trajectories and waits.
    first = collect(experience, until=2, timeout=15)
    assert [m.seq for m in first] == [0, 1]
    wait_for(lambda: actor.in_flight == 2, timeout=5)  # counted just after the send
    settle(lambda: actor.trajectories == 2 and actor.in_flight == 2, 1.0)
    assert collect(experience, quiet=0.2) == []
    assert actor.heartbeat_info()["in_flight"] == 2
    # An ack releases exactly the trajectory it names: acking 1 frees one slot, not two.
    ack(pub, "actor-0", 1)
    second = collect(experience, until=1, timeout=10)
    assert [m.seq for m in second] == [2]
    wait_for(lambda: actor.in_flight == 2, timeout=5)  # counted just after the send
    settle(lambda: actor.trajectories == 3 and actor.in_flight == 2, 0.5)
    # A duplicate ack is dropped and frees nothing; acking 0 frees the other slot.
    ack(pub, "actor-0", 1)
    ack(pub, "actor-0", 0)
    more = second + collect(experience, until=1, timeout=10)
    assert [m.seq for m in more] == [2, 3]
    settle(lambda: actor.trajectories == 4, 0.5)
    ack(pub, "actor-0", 2)
    fifth = collect(experience, until=1, timeout=10)
    assert [m.seq for m in fifth] == [4]
    settle(lambda: actor.trajectories == 5, 0.5)
    ack(pub, "actor-0", 3)
    ack(pub, "actor-0", 4)

    trajs = first + more + fifth + receive_acking(experience, pub, "actor-0", 8)
    assert [m.seq for m in trajs] == list(range(13))
    assert check_valid_flags(trajs) >= 1
    for m in trajs:
        assert m.kind == P.TRAJECTORY and m.sender == "actor-0"
        assert {k: (v.dtype, v.shape) for k, v in m.arrays.items()} == {
            k: (np.dtype(d), s) for k, (d, s) in ARRAYS.items()
        }
        assert m.meta["weights_version"] == 0 and m.meta["actor"] == 0
        a = m.arrays
        assert set(np.unique(a["action"])) <= {0, 1}
        p = a["priority"]
        assert np.all(np.isfinite(p)) and np.all(p >= 0)
        assert np.all(p[~a["valid"]] == 0)
        assert np.any(p[a["valid"]] > 0)
        # Consecutive steps: the next observation is the following step's observation.
        np.testing.assert_array_equal(a["next_obs"][:, :-1], a["obs"][:, 1:])
        assert np.all(a["reward"][a["valid"]] == 1.0)
        assert not np.any(a["terminated"][~a["valid"]] | a["truncated"][~a["valid"]])


def test_experience_taken_off_the_stream_is_counted_lost(inproc):
    """A stray PULL on the experience stream: what it takes is never acked, so the actor
    counts it lost; what the shard acked is delivered; and the ledger adds up."""
    inproc.start_broker(config())
    shard = inproc.pull("experience")
    thief = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    actor.credit.window.latency.floor_s = 0.5
    pub = inproc.pub("replay-0")
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)
    acked: list[P.Message] = []
    stolen: list[P.Message] = []

    def progressed() -> bool:
        if (got := shard.recv(block=False)) is not None:
            acked.append(got[1])
            ack(pub, "actor-0", got[1].seq)
        if (got := thief.recv(block=False)) is not None:
            stolen.append(got[1])
        time.sleep(0.005)
        return len(stolen) >= 3 and len(acked) >= 3

    wait_for(progressed, timeout=30, interval=0)
    led = actor.credit.window.ledger
    wait_for(lambda: led.lost >= len(stolen), timeout=5)
    assert led.delivered >= len(acked) - 1  # the last ack may still be on its way
    assert led.sent == led.delivered + led.lost - led.late + actor.in_flight
    info = actor.heartbeat_info()
    assert info["trajectories_lost"] >= len(stolen) and info["steps_lost"] > 0
    assert inproc.error_of(actor) is None


# --- a replay shard that restarts: its incarnation ---------------------------------------


def shard_ack(seq: int, incarnation: Any, sender: str = "replay-0") -> P.Message:
    meta = {"seq": seq, "inserted": 1, "incarnation": incarnation}
    return P.Message(P.ACK, meta=meta, sender=sender)


def announcement(incarnation: Any, sender: str = "replay-0") -> P.Message:
    return P.Message(P.INCARNATION, meta={"incarnation": incarnation}, sender=sender)


def window_actor(limit: int) -> Actor:
    """An actor with no sockets: its credit window and its ack handling only."""
    actor = Actor("inproc://zrl-test-unused", index=0)
    actor.credit = InsertAcks(limit, actor.log, lambda: actor.output.next_seq)
    actor.output = SimpleNamespace(next_seq=0)  # type: ignore[assignment]
    return actor


def send(actor: Actor, n: int) -> None:
    for _ in range(n):
        actor.credit.window.sent(actor.output.next_seq, 10)
        actor.output.next_seq += 1  # type: ignore[misc]


def balanced(actor: Actor) -> bool:
    led = actor.credit.window.ledger
    return led.sent == led.delivered + led.lost - led.late + actor.in_flight


def test_an_ack_from_a_restarted_shard_frees_what_it_lost_at_once():
    actor = window_actor(limit=3)
    send(actor, 2)  # 0, 1
    actor.credit.on_ack(shard_ack(0, incarnation=7))
    send(actor, 2)  # 2, 3: the window (1, 2, 3) is full
    assert actor.credit.window.full
    # The shard restarted holding 1; its new incarnation's first ack names 2. Nothing is
    # expired (no time passed): 1 is counted lost because of the new incarnation alone.
    actor.credit.on_ack(shard_ack(2, incarnation=8))
    assert actor.credit.shard_restarts == 1 and actor.credit.window.timeouts == 0
    assert actor.credit.window.ledger.lost == 1 and actor.in_flight == 1  # 3 was sent after 2
    assert not actor.credit.window.full and balanced(actor)
    # The new incarnation's later acks are no restart; a straggler of the old one (it did
    # insert 1 before it died) is a late delivery, and no restart either.
    actor.credit.on_ack(shard_ack(3, incarnation=8))
    actor.credit.on_ack(shard_ack(1, incarnation=7))
    assert actor.credit.shard_restarts == 1 and actor.in_flight == 0
    assert actor.credit.window.ledger.late == 1 and balanced(actor)


def test_an_announced_incarnation_frees_a_window_full_of_what_the_dead_shard_held():
    actor = window_actor(limit=2)
    actor.credit.on_ack(announcement(7))
    actor.credit.on_ack(announcement(5, sender="replay-1"))  # first heard of: no restart
    send(actor, 2)
    assert actor.credit.window.full and actor.credit.window.ledger.lost == 0
    actor.credit.on_ack(announcement(7))  # the same incarnation again: nothing happens
    assert actor.credit.window.full and actor.credit.shard_restarts == 0
    # A full window sends nothing, so no ack of the new incarnation could ever come: its
    # announcement alone frees the window.
    actor.credit.on_ack(announcement(9))
    assert actor.in_flight == 0 and actor.credit.window.ledger.lost == 2
    assert (
        actor.credit.shard_restarts == 1 and actor.credit.window.timeouts == 0 and balanced(actor)
    )


class FakeAcks:
    """Stands in for the actor's ack channel: what the shards sent, and what was dropped."""

    def __init__(self, msgs: list[P.Message]) -> None:
        self.msgs = msgs
        self.dropped: list[str] = []

    def recv(self, block: bool = True) -> tuple[None, P.Message] | None:
        return (None, self.msgs.pop(0)) if self.msgs else None

    def drop(self, sender: str, reason: str) -> None:
        self.dropped.append(reason)


@pytest.mark.parametrize("incarnation", [None, True, -1, 2**63, 1.5, "7", [7]])
def test_a_malformed_incarnation_is_counted_and_dropped(incarnation):
    actor = window_actor(limit=2)
    send(actor, 2)
    bad = [shard_ack(0, incarnation), announcement(incarnation)]
    if incarnation is None:  # absent, rather than None
        bad = [shard_ack(0, 1), announcement(1)]
        for m in bad:
            del m.meta["incarnation"]
    acks = FakeAcks([*bad, announcement(3, sender="learner-0"), shard_ack(1, 3)])
    actor.credit.read(acks)  # type: ignore[arg-type]
    assert len(acks.dropped) == 3, acks.dropped
    assert all("incarnation" in reason for reason in acks.dropped)
    # The malformed ack released nothing; the good one after it did.
    assert actor.in_flight == 1 and actor.credit.window.ledger.delivered == 1
    assert actor.credit.shard_restarts == 0 and balanced(actor)


def test_a_restarted_shard_reopens_the_window_well_before_the_ack_timeout(inproc, monkeypatch):
    """A real shard stops reading (its rate limiter holds inserts back, the usual state
    of Ape-X replay) and dies holding the actor's whole window. Its successor's
    announcement reopens the window well before the ack timeout would."""
    # A timeout far beyond anything here: on a loaded machine filling the window and
    # stopping the shard took longer than the 10-s default, and the timeout, not the
    # announcement, then emptied the window.
    timeout_s = 120.0
    monkeypatch.setattr(insert_acks, "ACK_TIMEOUT_S", timeout_s)
    inproc.start_broker(config())
    first = inproc.start(ReplayServer, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(first, ReplayServer) and isinstance(actor, Actor)
    wait_for(lambda: actor.credit.window.ledger.delivered >= 3, timeout=30)
    first.can_insert = lambda: False  # type: ignore[method-assign]
    wait_for(lambda: actor.credit.window.full, timeout=10)
    assert actor.in_flight > 0  # what the shard holds when it dies
    inproc.stop_role(first)
    delivered = actor.credit.window.ledger.delivered

    second = inproc.start(ReplayServer, index=0)
    assert isinstance(second, ReplayServer) and second.incarnation != first.incarnation
    started = time.monotonic()
    wait_for(
        lambda: (
            actor.credit.shard_restarts == 1 and actor.credit.window.ledger.delivered > delivered
        ),
        timeout=timeout_s / 2,
        message="the actor waited for its ack timeout",
    )
    assert time.monotonic() - started < timeout_s / 2
    assert actor.credit.window.timeouts == 0 and actor.credit.window.ledger.lost > 0
    assert second.trajectories_received > 0
    assert actor.heartbeat_info()["shard_restarts"] == 1
    assert actor.stats.snapshot()["acks"]["dropped"] == 0
    assert inproc.error_of(actor) is None


def check_valid_flags(trajs: list[P.Message]) -> int:
    """``valid`` is False exactly on the steps right after an episode end (across
    consecutive trajectories); returns the number of episode ends seen."""
    valid = np.concatenate([m.arrays["valid"] for m in trajs], axis=1)
    done = np.concatenate([m.arrays["terminated"] | m.arrays["truncated"] for m in trajs], axis=1)
    expected = np.ones_like(valid)
    expected[:, 1:] = ~done[:, :-1]
    np.testing.assert_array_equal(valid, expected)
    return int(done.sum())


def test_actor_valid_flags_env_steps_and_new_weights(inproc):
    inproc.start_broker(config())
    experience = inproc.pull("experience")
    # Actors take weights only from a params role the broker lists; this one has none yet.
    inproc.start(ParameterServer, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    pub = inproc.pub("replay-0")
    params = inproc.pub("params-0")
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=pub)
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=params)

    trajs = receive_acking(experience, pub, "actor-0", 10)
    assert [m.seq for m in trajs] == list(range(10))
    ends = check_valid_flags(trajs)
    assert ends >= 2, "CartPole episodes should have ended within 80 steps of 4 envs"
    # env_steps counts valid steps only.
    valid_steps = np.cumsum([int(m.arrays["valid"].sum()) for m in trajs])
    assert [m.meta["env_steps"] for m in trajs] == valid_steps.tolist()
    assert actor.episodes.episodes >= 1
    for m in trajs:
        assert m.meta["weights_version"] == 0
        assert np.all(m.arrays["reward"][~m.arrays["valid"]] == 0.0)

    # A newer weights version on the topic bus is applied before the next trajectory.
    new = other_weights(seed=123)
    params.send(P.Message(P.WEIGHTS, meta={"version": 7}, arrays=new), topic=P.WEIGHTS_TOPIC)
    later = receive_acking(experience, pub, "actor-0", 4)
    versions = [m.meta["weights_version"] for m in later]
    assert versions[-1] == 7 and versions == sorted(versions), versions
    assert actor.weights.version == 7
    state = actor.model.state_dict()
    for k, v in new.items():
        np.testing.assert_array_equal(state[k].numpy(), v)
    # The rollout stays consistent across the switch.
    check_valid_flags(trajs + later)
    # An older version is ignored.
    params.send(P.Message(P.WEIGHTS, meta={"version": 3}, arrays=other_weights(5)), topic="weights")
    later = receive_acking(experience, pub, "actor-0", 2)
    assert [m.meta["weights_version"] for m in later] == [7, 7]
    assert actor.weights.version == 7
    assert inproc.error_of(actor) is None


def test_actor_survives_weights_that_do_not_fit(inproc):
    inproc.start_broker(config())
    experience = inproc.pull("experience")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    pub = inproc.pub("params-0")
    acker = inproc.pub("replay-0")  # actors accept acks from replay shards only
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=pub)
    inproc.wait_for_subscriber(P.ack_topic("actor-0"), pub=acker)
    bad = {"not.a.parameter": np.zeros(3, np.float32)}
    pub.send(P.Message(P.WEIGHTS, meta={"version": 5}, arrays=bad), topic=P.WEIGHTS_TOPIC)
    time.sleep(0.2)
    received: list[P.Message] = []

    def progressed() -> bool:
        got = experience.recv()
        if got is not None:
            received.append(got[1])
            ack(acker, "actor-0", got[1].seq)
        return len(received) >= 4 or not inproc.alive(actor)

    wait_for(progressed, timeout=10, interval=0)
    assert inproc.error_of(actor) is None and inproc.alive(actor)
    assert len(received) >= 4
    assert actor.weights.version == 0  # the bad version was not adopted


def test_apex_epsilons_per_actor_slot(inproc):
    inproc.start_broker(config(actors=2))
    actors = [inproc.start(Actor, index=i) for i in (0, 1)]
    all_eps = apex_epsilons(2 * E, 0.4, 7.0)
    for i, actor in enumerate(actors):
        assert isinstance(actor, Actor)
        assert isinstance(actor.policy, ApexDQNPolicy)
        assert actor.policy.epsilons.shape == (E,)
        np.testing.assert_allclose(actor.policy.epsilons, all_eps[i * E : (i + 1) * E], rtol=1e-6)
    # Distinct seeds per actor, fixed by the run seed.
    assert actors[0].seed != actors[1].seed
    # Actor 1 is the least exploring half; its last slot is base ** (1 + alpha).
    assert actors[1].policy.epsilons[-1] == pytest.approx(0.4**8, rel=1e-5)
    assert actors[0].policy.epsilons[0] == pytest.approx(0.4)
    wait_for(lambda: all(a.trajectories >= 1 for a in actors), timeout=10)


# --- double-buffered sampling (actor.env_groups) ---------------------------------------------


def grouped_actor(algo: str, num_envs: int, groups: int, vectorization: str = "sync") -> Actor:
    """``Actor.setup`` without sockets, as it builds the envs for ``actor.env_groups``."""
    cfg = ExperimentConfig.model_validate(
        {
            "name": "groups-test",
            "seed": 5,
            "algo": algo,
            "env": {"id": "CartPole-v1", "num_envs": num_envs, "vectorization": vectorization},
            "model": {"hidden": [16]},
            "roles": {"actors": 1, "replay": 0 if algo == "ppo" else 1},
            "actor": {"trajectory_length": T, "env_groups": groups},
            "replay": {"table": "prioritized" if algo == "apex_dqn" else "fifo"},
        }
    )
    actor = Actor("inproc://unused", index=0)
    actor.config = cfg
    actor.seed = 1234
    actor.rng = np.random.default_rng(actor.seed)
    size = num_envs // groups
    envs = [make_vector_env(cfg.env, num_envs=size) for _ in range(groups)]
    actor.envs = EnvGroups(envs) if groups > 1 else envs[0]
    actor.num_envs = num_envs
    spaces = (envs[0].single_observation_space, envs[0].single_action_space)
    torch.manual_seed(0)
    actor.model = build_model(*spaces, cfg.model, cfg.algo)
    actor.weights = SimpleNamespace(version=0)  # type: ignore[assignment]
    actor.policy = actor.make_policy(spaces, actor.model)
    obs, _ = actor.envs.reset(seed=actor.seed)
    actor.obs = np.asarray(obs, np.float32).reshape(num_envs, -1)
    actor.needs_reset = np.zeros(num_envs, bool)
    actor.episodes = EpisodeTracker(num_envs)
    return actor


@pytest.mark.parametrize(
    ("algo", "num_envs", "groups", "vectorization"),
    [("apex_dqn", 4, 2, "sync"), ("appo", 6, 3, "sync"), ("apex_dqn", 4, 2, "async")],
)
def test_env_groups_send_the_trajectories_of_one_vector_env(algo, num_envs, groups, vectorization):
    """G groups of E/G envs, seeded s + rows.start, act and step exactly as one E-env vector
    env: every array of every trajectory (and the episode statistics) is the same, the
    network's outputs up to rounding."""
    runs = []
    for g, vec in ((1, "sync"), (groups, vectorization)):
        actor = grouped_actor(algo, num_envs, g, vec)
        msgs = [actor.collect() for _ in range(6)]
        actor.envs.close()
        runs.append((actor, msgs))
    (one, ref), (grouped, got) = runs
    assert isinstance(grouped.envs, EnvGroups) and len(grouped.envs.groups) == groups
    mode = {"sync": "step", "async": "async"}[vectorization]
    assert {group.mode for group in grouped.envs.groups} == {mode}
    for a, b in zip(ref, got, strict=True):
        assert a is not None and b is not None
        assert a.meta == b.meta and a.arrays.keys() == b.arrays.keys()
        for k in a.arrays:
            assert a.arrays[k].dtype == b.arrays[k].dtype, k
            if k in ("priority", "logp"):  # network outputs: a batch of E/G rounds apart
                np.testing.assert_allclose(a.arrays[k], b.arrays[k], rtol=1e-5, err_msg=k)
            else:
                np.testing.assert_array_equal(a.arrays[k], b.arrays[k], err_msg=k)
    check_valid_flags(got)
    if "next_obs" in got[0].arrays:  # next_obs is obs one step later, across trajectories
        obs = np.concatenate([m.arrays["obs"] for m in got], axis=1)
        nxt = np.concatenate([m.arrays["next_obs"] for m in got], axis=1)
        np.testing.assert_array_equal(nxt[:, :-1], obs[:, 1:])
    assert one.episodes.finished_returns == grouped.episodes.finished_returns
    assert one.env_steps == grouped.env_steps > 0


class FailingEnv:
    """A vector env that raises on its ``fail_at``-th step."""

    def __init__(self, env: Any, fail_at: int) -> None:
        self.env, self.fail_at, self.steps = env, fail_at, 0
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space

    def reset(self, **kwargs: Any) -> Any:
        return self.env.reset(**kwargs)

    def step(self, actions: Any) -> Any:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("boom")
        return self.env.step(actions)

    def close(self) -> None:
        self.env.close()


def test_env_groups_an_env_error_drops_the_trajectory_and_resets_every_group():
    actor = grouped_actor("appo", 4, 2)
    assert isinstance(actor.envs, EnvGroups)
    second = actor.envs.groups[1]
    second.env = FailingEnv(second.env, fail_at=T + 3)
    assert actor.collect() is not None
    actor.obs[:] = -1.0  # the reset must replace it
    assert actor.collect() is None
    assert actor.env_errors == 1 and not any(g.pending for g in actor.envs.groups)
    assert np.all(np.abs(actor.obs) < 0.06)  # fresh CartPole states
    assert not actor.needs_reset.any() and not actor.episodes.running_length.any()
    msg = actor.collect()
    assert msg is not None and msg.arrays["valid"][:, 0].all()
    actor.envs.close()


def test_env_groups_must_divide_num_envs():
    with pytest.raises(ConfigError, match=r"env.num_envs \(6\).*actor.env_groups \(4\)"):
        config_from_dict({"name": "t"}, ["env.num_envs=6", "actor.env_groups=4"])
    with pytest.raises(ConfigError, match="env_groups"):
        config_from_dict({"name": "t"}, ["actor.env_groups=0"])
    assert config_from_dict({"name": "t"}, ["env.num_envs=6", "actor.env_groups=3"])
