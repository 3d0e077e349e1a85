"""The on-policy roles: IMPALA unroll assembly, the A3C parameter server (in-process) and the
``Actor`` with the on-policy algorithms' policies (in-process, PPO sync/async and A3C)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from zrl.algos.a3c.config import A3CConfig
from zrl.algos.a3c.policy import A3CPolicy
from zrl.algos.a3c.server import A3CGradientServer
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.policy_gradient import a2c_loss, reduce_gradients
from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.ppo.policy import PPOPolicy
from zrl.algos.ppo.update import PPOUpdate
from zrl.config.experiment import ExperimentConfig
from zrl.envs.vector import make_vector_env
from zrl.nets.discrete import ActorCritic, build_actor_critic
from zrl.nets.gaussian import categorical_entropy
from zrl.nets.wire import load_arrays, model_to_arrays
from zrl.replay.assemble import assemble_unrolls
from zrl.roles.actor import Actor
from zrl.roles.learner import Learner
from zrl.roles.params import ParameterServer
from zrl.roles.params_client import request_latest_weights
from zrl.testing.fakes import Rpc, as_message, unroll_trajectory
from zrl.testing.inproc import InProc, collect
from zrl.testing.probes import settle, wait_for
from zrl.transport import protocol as P
from zrl.transport.messages import UNROLL
from zrl.transport.sockets import Channel

torch.set_num_threads(1)

BROKER = {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0}
HIDDEN = [16]


# ----------------------------------------------------------------------------- assemble_unrolls


def unroll_arrays(E: int = 3, T: int = 5, D: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    term, trunc, valid = np.zeros((E, T), bool), np.zeros((E, T), bool), np.ones((E, T), bool)
    term[0, 1], valid[0, 2] = True, False
    trunc[1, 3], valid[1, 4] = True, False
    reward = rng.uniform(0, 1, (E, T)).astype(np.float32)
    reward[~valid] = 0.0
    return {
        "obs": rng.normal(size=(E, T, D)).astype(np.float32),
        "action": rng.integers(2, size=(E, T)).astype(np.int64),
        "logp": np.log(rng.uniform(0.1, 0.9, (E, T))).astype(np.float32),
        "reward": reward,
        "terminated": term,
        "truncated": trunc,
        "valid": valid,
        "bootstrap_obs": rng.normal(size=(E, D)).astype(np.float32),
    }


def test_assemble_unrolls_one_item_per_env_with_its_version():
    a = unroll_arrays()
    items = assemble_unrolls(as_message(a, weights_version=7, actor=0))
    assert set(items) == {*UNROLL.arrays, "weights_version"}
    for name, arr in a.items():
        assert items[name].dtype == arr.dtype and items[name].shape == arr.shape, name
        np.testing.assert_array_equal(items[name], arr)
    assert items["weights_version"].dtype == np.int64
    np.testing.assert_array_equal(items["weights_version"], [7, 7, 7])
    # Version 0 (the actors' own initialisation before the first published weights) is fine.
    assert assemble_unrolls(as_message(a, weights_version=0))["weights_version"].tolist() == [0] * 3


def _with(**changes: Any) -> Callable[[], dict[str, np.ndarray]]:
    def make() -> dict[str, np.ndarray]:
        a = unroll_arrays()
        for k, v in changes.items():
            if v is None:
                del a[k]
            elif callable(v):
                a[k] = v(a[k])
            else:
                a[k] = v
        return a

    return make


def _poke(index: tuple[int, ...], value: float) -> Callable[[np.ndarray], np.ndarray]:
    def f(x: np.ndarray) -> np.ndarray:
        x = x.copy()
        x[index] = value
        return x

    return f


BAD_UNROLLS: dict[str, tuple[Callable[[], dict[str, np.ndarray]], dict[str, Any], str]] = {
    "missing logp": (_with(logp=None), {}, "lacks array 'logp'"),
    "missing bootstrap_obs": (_with(bootstrap_obs=None), {}, "lacks array 'bootstrap_obs'"),
    "logp float64": (_with(logp=lambda x: x.astype(np.float64)), {}, "dtype float64"),
    "action int32": (_with(action=lambda x: x.astype(np.int32)), {}, "dtype int32"),
    "obs rank 2": (_with(obs=lambda x: x[:, :, 0]), {}, "rank 2"),
    "action [3, 4]": (_with(action=lambda x: x[:, :4]), {}, "'action' has shape"),
    "valid [2, 5]": (_with(valid=lambda x: x[:2]), {}, "'valid' has shape"),
    "obs [3, 4, 4]": (_with(obs=lambda x: x[:, :4]), {}, "'obs' has shape"),
    "bootstrap_obs [4, 4]": (
        _with(bootstrap_obs=np.zeros((4, 4), np.float32)),
        {},
        "'bootstrap_obs' has shape",
    ),
    "bootstrap_obs width": (
        _with(bootstrap_obs=np.zeros((3, 5), np.float32)),
        {},
        "widths differ",
    ),
    "NaN obs": (_with(obs=_poke((1, 2, 0), np.nan)), {}, "'obs' holds NaN"),
    "inf obs": (_with(obs=_poke((0, 0, 3), -np.inf)), {}, "'obs' holds NaN"),
    "NaN logp": (_with(logp=_poke((2, 4), np.nan)), {}, "'logp' holds NaN"),
    "inf logp": (_with(logp=_poke((2, 4), -np.inf)), {}, "'logp' holds NaN"),
    "NaN reward": (_with(reward=_poke((0, 0), np.nan)), {}, "'reward' holds NaN"),
    "inf bootstrap_obs": (_with(bootstrap_obs=_poke((1, 1), np.inf)), {}, "'bootstrap_obs'"),
    "no version": (unroll_arrays, {"weights_version": None}, "weights version"),
    "bool version": (unroll_arrays, {"weights_version": True}, "weights version"),
    "float version": (unroll_arrays, {"weights_version": 1.5}, "weights version"),
    "str version": (unroll_arrays, {"weights_version": "3"}, "weights version"),
    "negative version": (unroll_arrays, {"weights_version": -1}, "weights version"),
}


@pytest.mark.parametrize("case", list(BAD_UNROLLS))
def test_assemble_unrolls_rejects_malformed(case):
    make, meta_changes, match = BAD_UNROLLS[case]
    meta: dict[str, Any] = {"weights_version": 3, "actor": 0}
    meta.update(meta_changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(P.ProtocolError, match=match):
        assemble_unrolls(as_message(make(), **meta))


# ----------------------------------------------------------------------------- A3C params


def a3c_config(**a3c: Any) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "a3c-test",
            "seed": 5,
            "algo": "a3c",
            "env": {"id": "CartPole-v1", "num_envs": 2},
            "model": {"hidden": HIDDEN},
            "broker": BROKER,
            "roles": {"actors": 1, "replay": 0, "learners": 0, "params": 1, "evaluator": 0},
            "actor": {"trajectory_length": 8},
            "a3c": {"lr": 0.01, "grad_clip": 0.5, "max_lag": 1, **a3c},
        }
    )


def initial_model(cfg: ExperimentConfig) -> ActorCritic:
    """The parameter server's initialisation: seeded with the run seed, then built."""
    probe = make_vector_env(cfg.env, num_envs=1)
    torch.manual_seed(cfg.seed)
    model = build_actor_critic(
        probe.single_observation_space,
        probe.single_action_space,
        cfg.model.hidden,
        cfg.model.activation,
    )
    probe.close()
    return model


def some_gradient(model: ActorCritic, seed: int, scale: float = 20.0) -> dict[str, np.ndarray]:
    """An actor-critic gradient of ``model`` on random CartPole-like inputs, by name (large
    enough that the server's clipping matters)."""
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(12, model.obs_dim, generator=gen)
    actions = torch.randint(model.num_actions, (12,), generator=gen)
    logits, values = model(obs)
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None])[:, 0]
    adv, ret = torch.randn(12, generator=gen), torch.randn(12, generator=gen) * 5
    loss, _ = a2c_loss(logp, values, ret, adv, categorical_entropy(logits), 0.01, 0.5)
    model.zero_grad(set_to_none=True)
    (scale * loss).backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert set(grads) == {n for n, _ in model.named_parameters()}
    return grads


class LocalServer:
    """What the parameter server should do: clip the combined gradient, one Adam step."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.model = initial_model(cfg)
        self.optimizer = make_adam(self.model.parameters(), cfg.section(A3CConfig).lr)

    def step(self, *grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        combined = reduce_gradients(
            [{k: torch.from_numpy(v) for k, v in g.items()} for g in grads],
            self.cfg.section(A3CConfig).reduce,
        )
        for name, p in self.model.named_parameters():
            p.grad = combined[name].clone()
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.section(A3CConfig).grad_clip
        )
        assert float(norm) > self.cfg.section(A3CConfig).grad_clip  # the clip is exercised
        self.optimizer.step()
        return model_to_arrays(self.model)


def assert_close_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def gradients_message(grads: dict[str, np.ndarray], **meta: Any) -> P.Message:
    return P.Message(P.GRADIENTS, meta=meta, arrays=grads)


def start_a3c_params(inproc: InProc, cfg: ExperimentConfig) -> tuple[ParameterServer, Channel]:
    inproc.start_broker(cfg)
    sub = inproc.sub(P.WEIGHTS_TOPIC)
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    early = inproc.wait_subscribed(sub)  # the subscription travels through the XPUB/XSUB device
    # The initial version 1 was published during setup; we may or may not have seen it.
    assert [m.meta["version"] for m in early + collect(sub, quiet=0.2)] in ([], [1])
    return ps, sub


def gradient_server(ps: ParameterServer) -> A3CGradientServer:
    server = ps.gradient_server
    assert isinstance(server, A3CGradientServer)
    return server


def test_a3c_params_applies_gradients_drops_stale_and_malformed(inproc, zmq_ctx):
    cfg = a3c_config()
    ps, sub = start_a3c_params(inproc, cfg)
    gs = gradient_server(ps)
    assert ps.version == 1  # its own initialisation, published as version 1
    local = LocalServer(cfg)  # built after the server's setup: no race on torch's global RNG
    initial = request_latest_weights(zmq_ctx, [{"rpc": ps.rpc_endpoint}], 2**24, timeout=2.0)
    assert initial is not None and initial.kind == P.WEIGHTS and initial.meta["version"] == 1
    assert_close_arrays(initial.arrays, model_to_arrays(local.model))  # same seed, same init

    # One gradient on version 1 -> exactly one Adam step on the clipped gradient -> version 2.
    push = inproc.push("gradients", sender="actor-0")
    g1 = some_gradient(local.model, seed=1)
    assert push.send(gradients_message(g1, weights_version=1, actor=0))
    got = collect(sub, until=1, timeout=10)
    assert [m.meta["version"] for m in got] == [2]
    assert got[0].meta["updates"] == 1
    assert_close_arrays(got[0].arrays, local.step(g1))
    assert gs.applied_gradients == 1 and gs.updates == 1 and gs.stale_gradients == 0

    # A gradient computed 2 versions back (max_lag 1) is counted and not applied.
    assert push.send(gradients_message(some_gradient(local.model, 2), weights_version=0))
    wait_for(lambda: gs.stale_gradients == 1, timeout=5)
    settle(lambda: ps.version == 2 and gs.updates == 1, 0.3)
    assert collect(sub, quiet=0.2) == []

    # Malformed gradients are dropped (and counted on the stream), never applied.
    good = some_gradient(local.model, 3)
    first = next(iter(good))
    bad: list[P.Message] = [
        P.Message(P.TRAJECTORY, meta={"weights_version": 2}, arrays=good),
        gradients_message(good),  # no version
        gradients_message(good, weights_version=True),
        gradients_message(good, weights_version="2"),
        gradients_message({k: v.astype(np.float64) for k, v in good.items()}, weights_version=2),
        gradients_message({**good, first: good[first][:1]}, weights_version=2),
        gradients_message({k: v for k, v in good.items() if k != first}, weights_version=2),
        gradients_message({**good, "extra.weight": np.zeros(3, np.float32)}, weights_version=2),
        gradients_message({**good, first: np.full_like(good[first], np.nan)}, weights_version=2),
        gradients_message({**good, first: np.full_like(good[first], np.inf)}, weights_version=2),
    ]
    dropped0 = ps.stats.snapshot()["gradients"]["dropped"]
    for msg in bad:
        assert push.send(msg)
    wait_for(lambda: ps.stats.snapshot()["gradients"]["dropped"] == dropped0 + len(bad), timeout=5)
    settle(lambda: ps.version == 2 and gs.updates == 1, 0.3)
    assert gs.stale_gradients == 1 and gs.applied_gradients == 1

    # In a3c mode the server owns the weights: WEIGHTS from a "learner" are refused.
    rpc = Rpc(zmq_ctx, ps.rpc_endpoint)
    try:
        rpc_dropped0 = ps.stats.snapshot()["rpc"]["dropped"]
        rpc.send(P.Message(P.WEIGHTS, arrays=model_to_arrays(local.model)))
        wait_for(lambda: ps.stats.snapshot()["rpc"]["dropped"] == rpc_dropped0 + 1, timeout=5)
    finally:
        rpc.close()
    assert ps.version == 2

    # A gradient one version behind is within max_lag: applied, with Adam's state carried on.
    g4 = some_gradient(local.model, seed=4)
    assert push.send(gradients_message(g4, weights_version=1))
    got = collect(sub, until=1, timeout=10)
    assert [m.meta["version"] for m in got] == [3]
    assert_close_arrays(got[0].arrays, local.step(g4))
    assert gs.applied_gradients == 2 and gs.stale_gradients == 1
    assert ps.heartbeat_info()["stale_gradients"] == 1
    assert inproc.alive(ps) and inproc.error_of(ps) is None


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a3c_params_combines_gradients_per_update(inproc, reduce):
    cfg = a3c_config(reduce=reduce, gradients_per_update=2, max_lag=4)
    ps, sub = start_a3c_params(inproc, cfg)
    gs = gradient_server(ps)
    local = LocalServer(cfg)
    push = inproc.push("gradients", sender="actor-0")
    g1, g2 = some_gradient(local.model, 10), some_gradient(local.model, 11)
    assert push.send(gradients_message(g1, weights_version=1))
    wait_for(lambda: len(gs.accumulated) == 1, timeout=5)
    settle(lambda: ps.version == 1 and gs.updates == 0, 0.3)
    assert push.send(gradients_message(g2, weights_version=1))
    got = collect(sub, until=1, timeout=10)
    assert [m.meta["version"] for m in got] == [2]
    assert gs.updates == 1 and gs.applied_gradients == 2
    assert_close_arrays(got[0].arrays, local.step(g1, g2))


def test_a3c_params_resumes_its_model_and_refuses_gradients_from_the_future(inproc, tmp_path):
    cfg = a3c_config(max_lag=4)
    cfg.checkpoint.dir = str(tmp_path)
    ps, sub = start_a3c_params(inproc, cfg)
    local = LocalServer(cfg)
    push = inproc.push("gradients", sender="actor-0")
    for seed in (20, 21):
        g = some_gradient(local.model, seed)
        assert push.send(gradients_message(g, weights_version=ps.version))
        want = local.step(g)
        got = collect(sub, until=1, timeout=10)
    assert ps.version == 3 and gradient_server(ps).updates == 2
    assert_close_arrays(got[-1].arrays, want)
    inproc.stop_role(ps)  # teardown writes the checkpoint
    assert (tmp_path / "params-0.pt").is_file()

    # A restarted server continues: same weights, same version, same Adam state.
    again = inproc.start(ParameterServer, index=0)
    assert isinstance(again, ParameterServer)
    assert again.version == 3 and gradient_server(again).updates == 2
    assert_close_arrays(again.arrays, want)
    g = some_gradient(local.model, 22)
    assert push.send(gradients_message(g, weights_version=3))
    wait_for(lambda: again.version == 4, timeout=10)
    assert_close_arrays(again.arrays, local.step(g))

    # A gradient computed on a version this server never published is dropped and counted.
    assert push.send(gradients_message(g, weights_version=99))
    wait_for(lambda: gradient_server(again).future_gradients == 1, timeout=5)
    settle(lambda: again.version == 4, 0.3)


# ----------------------------------------------------------------------------- Actor (on-policy)

E, T = 2, 16


def ppo_config(mode: str) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "onpolicy-actor-test",
            "seed": 9,
            "algo": "ppo",
            "env": {"id": "CartPole-v1", "num_envs": E},
            "model": {"hidden": HIDDEN},
            "broker": BROKER,
            "roles": {"actors": 1, "replay": 0, "learners": 1, "params": 1, "evaluator": 0},
            "actor": {"trajectory_length": T},
            "ppo": {"mode": mode, "max_lag": 1},
        }
    )


def other_weights(cfg: ExperimentConfig, seed: int) -> dict[str, np.ndarray]:
    probe = make_vector_env(cfg.env, num_envs=1)
    torch.manual_seed(seed)
    model = build_actor_critic(
        probe.single_observation_space,
        probe.single_action_space,
        cfg.model.hidden,
        cfg.model.activation,
    )
    probe.close()
    # Sharper than the 0.01-gain init, so log-probabilities differ visibly between versions.
    with torch.no_grad():
        model.policy_head.weight.mul_(100.0)
    return model_to_arrays(model)


def publish_until(pub: Channel, actor: Actor, version: int, arrays) -> None:
    """Publish weights ``version`` until the actor has it (the first publish may precede the
    subscription reaching the device)."""

    def adopted() -> bool:
        if actor.weights.version >= version:
            return True
        msg = P.Message(P.WEIGHTS, meta={"version": version}, arrays=arrays)
        pub.send(msg, topic=P.WEIGHTS_TOPIC)
        return False

    wait_for(adopted, timeout=10, interval=0.1)


def check_rollout(msg: P.Message, version: int, weights: dict[str, np.ndarray]) -> None:
    assert msg.kind == P.TRAJECTORY and msg.sender == "actor-0"
    assert msg.meta["weights_version"] == version and msg.meta["actor"] == 0
    shapes = {name: (E,) if name == "bootstrap_obs" else (E, T) for name in UNROLL.arrays}
    a = {k: np.array(v) for k, v in msg.arrays.items()}  # writable copies for torch
    assert set(a) == set(UNROLL.arrays)
    for name, spec in UNROLL.arrays.items():
        assert spec.dtype_ok(a[name].dtype) and a[name].ndim == len(spec.dims), name
        assert a[name].shape[: len(shapes[name])] == shapes[name], name
    assert a["obs"].shape[2] == a["bootstrap_obs"].shape[1] == 4
    assert set(np.unique(a["action"])) <= {0, 1}
    # Behaviour log-probabilities: the model at that version, on the recorded observations.
    model = ActorCritic(4, 2, HIDDEN, "relu")
    load_arrays(model, weights)
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(a["obs"].reshape(E * T, 4)))
        logp = torch.log_softmax(logits, -1).gather(1, torch.from_numpy(a["action"].reshape(-1, 1)))
    np.testing.assert_allclose(a["logp"], logp.numpy().reshape(E, T), rtol=1e-5, atol=1e-5)
    # NEXT_STEP autoreset: a step is invalid exactly after an episode end.
    done = a["terminated"] | a["truncated"]
    np.testing.assert_array_equal(a["valid"][:, 1:], ~done[:, :-1])
    assert not done[~a["valid"]].any()
    assert np.all(a["reward"][a["valid"]] == 1.0) and np.all(a["reward"][~a["valid"]] == 0.0)


def may_collect(actor: Actor) -> bool:
    return actor.policy.may_collect(actor.weights.version)


def start_ppo_actor(inproc: InProc, mode: str) -> tuple[Actor, Channel, Channel]:
    inproc.start_broker(ppo_config(mode))
    rollouts = inproc.sub(P.ROLLOUTS_TOPIC)
    # Actors take weights only from a params role the broker lists: "params-0" below is it.
    inproc.start(ParameterServer, index=0)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(actor.policy, PPOPolicy)
    pub = inproc.pub("params-0")
    inproc.wait_subscribed(rollouts)
    inproc.wait_for_subscriber(P.WEIGHTS_TOPIC, pub=pub)
    return actor, rollouts, pub


def test_ppo_sync_actor_sends_one_rollout_per_version(inproc):
    cfg = ppo_config("sync")
    actor, rollouts, pub = start_ppo_actor(inproc, "sync")
    # Version 0 is its own initialisation: it waits for the learner's weights.
    settle(lambda: actor.trajectories == 0 and not may_collect(actor), 0.4)
    assert collect(rollouts, quiet=0.1) == []
    assert "waiting_for_weights_s" in actor.heartbeat_info()

    w1, w2 = other_weights(cfg, 1), other_weights(cfg, 2)
    publish_until(pub, actor, 1, w1)
    first = collect(rollouts, until=1, timeout=10)
    assert len(first) == 1
    # One rollout per version: nothing more until version 2.
    settle(lambda: actor.trajectories == 1, 0.4)
    assert collect(rollouts, quiet=0.1) == []
    assert isinstance(actor.policy, PPOPolicy)
    assert not may_collect(actor) and actor.policy.sent_per_version == {1: 1}
    check_rollout(first[0], 1, w1)
    assert first[0].arrays["valid"][:, 0].all()  # nothing to reset before the first step

    publish_until(pub, actor, 2, w2)
    second = collect(rollouts, until=1, timeout=10)
    assert len(second) == 1
    settle(lambda: actor.trajectories == 2, 0.3)
    assert collect(rollouts, quiet=0.1) == []
    check_rollout(second[0], 2, w2)
    # The second rollout continues where the first stopped.
    a, b = first[0].arrays, second[0].arrays
    np.testing.assert_array_equal(b["obs"][:, 0], a["bootstrap_obs"])
    done_last = a["terminated"][:, -1] | a["truncated"][:, -1]
    np.testing.assert_array_equal(b["valid"][:, 0], ~done_last)
    assert inproc.error_of(actor) is None


def test_ppo_async_actor_sends_max_lag_plus_one_rollouts_per_version(inproc):
    cfg = ppo_config("async")
    actor, rollouts, pub = start_ppo_actor(inproc, "async")
    settle(lambda: actor.trajectories == 0, 0.3)
    w1 = other_weights(cfg, 1)
    publish_until(pub, actor, 1, w1)
    got = collect(rollouts, until=2, timeout=10)
    settle(lambda: actor.trajectories == 2, 0.5)
    got += collect(rollouts, quiet=0.1)
    assert [m.meta["weights_version"] for m in got] == [1, 1]  # max_lag + 1 = 2
    for m in got:
        check_rollout(m, 1, w1)
    publish_until(pub, actor, 2, other_weights(cfg, 2))
    more = collect(rollouts, until=2, timeout=10)
    assert [m.meta["weights_version"] for m in more] == [2, 2]
    assert inproc.error_of(actor) is None


def test_a3c_actor_pushes_the_gradient_of_its_rollout(inproc):
    """With no parameter server the worker acts with its initial weights (version 0) and
    pushes the A2C gradient of each rollout; it matches the loss recomputed here."""
    cfg = a3c_config()
    # Built before the actor's thread runs: torch's global RNG is shared with it.
    model = initial_model(cfg)
    inproc.start_broker(cfg)
    gradients = inproc.pull("gradients")
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor) and isinstance(actor.policy, A3CPolicy)
    got = collect(gradients, until=1, timeout=10)
    assert len(got) == 1
    msg = got[0]
    assert msg.kind == P.GRADIENTS and msg.meta["weights_version"] == 0
    names = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert {k: v.shape for k, v in msg.arrays.items()} == names
    assert all(v.dtype == np.float32 and np.all(np.isfinite(v)) for v in msg.arrays.values())
    assert any(np.any(v != 0) for v in msg.arrays.values())
    assert isinstance(msg.meta["samples"], int) and 0 < msg.meta["samples"] <= E * 8
    assert np.isfinite(msg.meta["loss"])
    # Its loss is the A2C loss of some rollout under these weights: the reported parts are
    # consistent with each other (loss = policy + value_coef * value - entropy_coef * entropy).
    c = cfg.section(A3CConfig)
    want = msg.meta["policy_loss"] + c.value_coef * msg.meta["value_loss"]
    want -= c.entropy_coef * msg.meta["entropy"]
    assert msg.meta["loss"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    # And the same computation on a rollout we build gives the same gradient as the actor's
    # code path (its policy's finish), so the server applies what the loss says.
    rng = np.random.default_rng(0)
    rollout: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(E, 8, 4)).astype(np.float32),
        "action": rng.integers(2, size=(E, 8)).astype(np.int64),
        "reward": np.ones((E, 8), np.float32),
        "terminated": np.zeros((E, 8), bool),
        "truncated": np.zeros((E, 8), bool),
        "valid": np.ones((E, 8), bool),
        "bootstrap_obs": rng.normal(size=(E, 4)).astype(np.float32),
    }
    rollout["terminated"][0, 3], rollout["valid"][0, 4], rollout["reward"][0, 4] = True, False, 0
    inproc.stop_role(actor)  # its model is ours to use now
    # The worker starts from the same initialisation as the parameter server's.
    assert_close_arrays(model_to_arrays(actor.model), model_to_arrays(model))
    produced = actor.policy.finish(unroll_trajectory(rollout))
    assert produced.kind == P.GRADIENTS
    with torch.no_grad():
        values = model.value(torch.from_numpy(rollout["obs"].reshape(-1, 4))).numpy()
        boot = model.value(torch.from_numpy(rollout["bootstrap_obs"])).numpy()
    adv, ret = rollout_gae(
        rollout["reward"],
        values.reshape(E, 8),
        rollout["terminated"],
        rollout["truncated"],
        rollout["valid"],
        boot,
        c.gamma,
        c.gae_lambda,
    )
    valid = torch.from_numpy(rollout["valid"].reshape(-1))
    logits, v = model(torch.from_numpy(rollout["obs"].reshape(-1, 4)))
    logp = torch.log_softmax(logits, -1).gather(
        1, torch.from_numpy(rollout["action"].reshape(-1, 1))
    )[:, 0]
    loss, _ = a2c_loss(
        logp[valid],
        v[valid],
        torch.from_numpy(ret.reshape(-1))[valid],
        torch.from_numpy(adv.reshape(-1))[valid],
        categorical_entropy(logits[valid]),
        c.entropy_coef,
        c.value_coef,
    )
    loss.backward()
    assert produced.meta["samples"] == int(valid.sum())
    for n, p in model.named_parameters():
        assert p.grad is not None
        np.testing.assert_allclose(produced.arrays[n], p.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_a3c_actor_and_params_train_together(inproc):
    """Worker and server end to end: gradients flow, versions advance, the worker follows."""
    cfg = a3c_config(max_lag=8)
    inproc.start_broker(cfg)
    ps = inproc.start(ParameterServer, index=0)
    assert isinstance(ps, ParameterServer)
    actor = inproc.start(Actor, index=0)
    assert isinstance(actor, Actor)
    wait_for(lambda: gradient_server(ps).updates >= 3 and actor.weights.version >= 3, timeout=15)
    assert ps.stats.snapshot()["gradients"]["dropped"] == 0
    assert inproc.error_of(ps) is None and inproc.error_of(actor) is None


def test_dd_ppo_leader_waits_for_every_learner_before_the_first_weights(inproc):
    """DD-PPO start-up: learner 0 opens the group's store and shows its address in its
    heartbeat; it publishes no weights (which would start the actors) until the follower,
    started late, found that address through the broker and the process group formed."""
    cfg = ExperimentConfig.model_validate(
        {
            **ppo_config("sync").model_dump(),
            "roles": {"actors": 1, "replay": 0, "learners": 2, "params": 1, "evaluator": 0},
        }
    )
    inproc.start_broker(cfg)
    params = inproc.start(ParameterServer, index=0)
    assert isinstance(params, ParameterServer)
    leader_role = inproc.start(Learner, index=0)
    assert isinstance(leader_role, Learner)
    leader = leader_role.update
    assert isinstance(leader, PPOUpdate) and leader.leader and leader.group is not None
    address = leader.group.address
    assert address is not None
    # The broker shows the store's address in learner-0's row (the follower's way to it).
    wait_for(lambda: (leader_role.role_info("learner-0") or {}).get("group_store") == address)
    settle(lambda: not leader.group_ready and params.version == 0, 0.8)

    follower_role = inproc.start(Learner, index=1)
    assert isinstance(follower_role, Learner)
    follower = follower_role.update
    assert isinstance(follower, PPOUpdate) and follower.group is not None
    wait_for(lambda: leader.group_ready and follower.group_ready, timeout=10)
    assert follower.group.leader_address == address and follower.group.address is None
    assert follower.heartbeat_info()["group_rank"] == 1
    wait_for(lambda: params.version >= 1, timeout=10)  # now the first weights go out
