"""Stand-ins for the peers of the role under test: a learner's rpc to the parameter server, and
an actor's experience for a replay shard.

- :class:`Rpc`: a DEALER to a parameter server's (or the league's) rpc ROUTER, as the learner
  (an actor) opens it; given the broker, it registers as that role and shows its connection's
  key in its heartbeats (``zrl.roles.rpc_identity``), so the server takes its guarded requests.
- :class:`FakeClock`: a clock that stands still until the test sets ``t`` (a league's).
- :func:`config_model`, :func:`model_weights`: the model a config builds for its env, and
  random weights in its layout (what a parameter server takes).
- :func:`trajectory`: a TRAJECTORY's arrays, all steps valid, with recognisable observations.
- :func:`sequences`: an R2D2 TRAJECTORY's arrays: sequences with stored states, all steps real.
- :func:`cue_recall`: one episode of a task that needs memory, acted by a policy.
- :func:`as_message`: arrays as a receiver sees them (a TRAJECTORY with read-only arrays).
- :func:`actor_setup`, :func:`learner_setup`: what an actor gives its policy and a learner its
  update, for an algorithm's parts built alone (a single learner: no peers, no sockets).
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import zmq

from zrl.algos.api.actor import ActorSetup, Trajectory
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.api.train_stats import TrainStats
from zrl.config.experiment import ExperimentConfig
from zrl.roles.base import Role
from zrl.roles.rpc_identity import ClientKeys, connect_with_key
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel, TransportStats, make_socket


class FakeClock:
    """A ``time.monotonic`` stand-in: returns ``t``, which only the test moves."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Registered(Role):
    """The registry side of a fake peer: a role entry that heartbeats the keys of ``Rpc``."""

    def __init__(self, broker: str, role: str, index: int, ctx: zmq.Context) -> None:
        self.role = role  # type: ignore[misc]  # an instance's role: the fake plays any
        super().__init__(broker, index=index, ctx=ctx, connect_timeout=10)
        self.rpc_keys = ClientKeys()

    def heartbeat_info(self) -> dict[str, Any]:
        return self.rpc_keys.info()

    def heartbeat(self) -> None:
        """A heartbeat now (with the keys), acknowledged by the broker."""
        self.heartbeat_now()


class Rpc:
    """A DEALER to a server's rpc ROUTER as ``sender`` (``<role>-<n>``) opens it. With
    ``broker``, it registers as that role first and heartbeats its key (at most a second
    apart, before each request), as the real role does; without, it is an unregistered
    peer, whose guarded requests the server refuses."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        sender: str = "learner-0",
        broker: str | None = None,
        server: str = "params",
    ) -> None:
        sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=3000, sndtimeo_ms=1000)
        self.registered: _Registered | None = None
        self.next_heartbeat = 0.0
        if broker is not None:
            role, _, index = sender.rpartition("-")
            self.registered = _Registered(broker, role, int(index), ctx)
            self.registered.connect()
            connect_with_key(sock, endpoint, self.registered.rpc_keys.renew(server))
            self._heartbeat()
        else:
            sock.connect(endpoint)
        self.ch = Channel(sock, "params-rpc", sender, TransportStats())

    def _heartbeat(self) -> None:
        if self.registered is not None and time.monotonic() >= self.next_heartbeat:
            self.next_heartbeat = time.monotonic() + 1.0
            self.registered.heartbeat()

    def request(self, msg: P.Message) -> P.Message:
        self._heartbeat()
        assert self.ch.send(msg)
        got = self.ch.recv()
        assert got is not None, f"no answer to {msg.kind}"
        return got[1]

    def send(self, msg: P.Message) -> None:
        self._heartbeat()
        assert self.ch.send(msg)

    def close(self) -> None:
        self.ch.close()
        if self.registered is not None:
            self.registered.close()


def config_model(cfg: ExperimentConfig) -> Any:
    """The model ``cfg`` builds for its env's spaces, as every role builds it."""
    from zrl.algos.models import experiment_model
    from zrl.envs.vector import make_vector_env

    probe = make_vector_env(cfg.env, 1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    return experiment_model(cfg, *spaces)


_layouts: dict[str, dict[str, tuple[tuple[int, ...], np.dtype]]] = {}


def model_weights(cfg: ExperimentConfig, seed: int) -> dict[str, np.ndarray]:
    """Random weights (normal) in the layout of ``cfg``'s model (built once per env, model
    and algorithm)."""
    from zrl.nets.wire import model_to_arrays

    key = f"{cfg.algo} {cfg.env.model_dump_json()} {cfg.model.model_dump_json()}"
    if key not in _layouts:
        arrays = model_to_arrays(config_model(cfg))
        _layouts[key] = {name: (a.shape, a.dtype) for name, a in arrays.items()}
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape).astype(dtype)
        for name, (shape, dtype) in _layouts[key].items()
    }


def trajectory(
    E: int = 2,
    T: int = 5,
    obs_dim: int = 4,
    *,
    base: float = 0.0,
    priority: float = 1.0,
) -> dict[str, np.ndarray]:
    """All-valid steps, no episode end: ``E * T`` transitions; obs[e, t, 0] = base + e*T + t."""
    idx = base + np.arange(E * T, dtype=np.float32).reshape(E, T)
    obs = np.repeat(idx[:, :, None], obs_dim, axis=2).astype(np.float32)
    obs[:, :, 1] = 0.25
    next_obs = obs.copy()
    next_obs[:, :, 1] = 0.75
    return {
        "obs": obs,
        "action": (np.arange(E * T, dtype=np.int64).reshape(E, T) % 2),
        "reward": np.ones((E, T), np.float32),
        "terminated": np.zeros((E, T), bool),
        "truncated": np.zeros((E, T), bool),
        "valid": np.ones((E, T), bool),
        "next_obs": next_obs,
        "priority": np.full((E, T), priority, np.float32),
    }


def sequences(
    n: int = 4, length: int = 6, obs_dim: int = 2, state_width: int = 16, seed: int = 0
) -> dict[str, np.ndarray]:
    """``n`` R2D2 sequences of ``length`` steps (``length + 1`` observations), every step real,
    random observations and stored states, priority 1, collected with weights version 1."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, length + 1, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 2, (n, length)),
        "reward": np.ones((n, length), np.float32),
        "terminated": np.zeros((n, length), bool),
        "mask": np.ones((n, length), bool),
        "first": np.zeros((n, length + 1), bool),
        "state": rng.normal(size=(n, state_width)).astype(np.float32),
        "priority": np.ones(n, np.float32),
        "weights_version": np.ones(n, np.int64),
    }


def as_message(arrays: dict[str, np.ndarray], **meta: Any) -> P.Message:
    """What a receiver sees: a TRAJECTORY message with read-only arrays (like decode's)."""
    frozen = {}
    for k, v in arrays.items():
        v = np.array(v)
        v.flags.writeable = False
        frozen[k] = v
    return P.Message(P.TRAJECTORY, meta=meta, arrays=frozen, sender="actor-0")


def unroll_trajectory(arrays: dict[str, np.ndarray]) -> Trajectory:
    """The ``Trajectory`` an actor would have recorded for the arrays of an ``unroll``
    TRAJECTORY (the inverse of ``Trajectory.unroll``, log-probs aside)."""
    return Trajectory(
        obs=arrays["obs"],
        next_obs=None,
        action=arrays["action"],
        reward=arrays["reward"],
        terminated=arrays["terminated"],
        truncated=arrays["truncated"],
        valid=arrays["valid"],
        final_obs=arrays["bootstrap_obs"],
    )


def cue_recall(
    policy: Any, rng: np.random.Generator, envs: int, steps: int, memory: bool = True
) -> tuple[Trajectory, float]:
    """One episode in each of ``envs`` envs of a task that needs memory, acted by a categorical
    ``policy``: a cue of +-1 seen only at the first step decides which action (0 or 1) the last
    step is rewarded for; a clock is visible throughout. Without ``memory`` the policy is told
    an episode starts before every step (its state zeroed: a feed-forward policy, in effect).
    Returns the trajectory the actor would record and the fraction of envs rewarded."""
    cue = rng.integers(2, size=envs)
    obs = np.zeros((envs, steps, 2), np.float32)
    obs[:, 0, 0] = 2.0 * cue - 1.0
    obs[:, :, 1] = np.arange(steps) / steps
    policy.episodes_started(np.arange(envs))
    policy.begin(steps, 0)
    acts, logp, first = [], [], []
    for t in range(steps):
        if not memory:
            policy.episodes_started(np.arange(envs))
        action, extras = policy.act(obs[:, t], t)
        acts.append(action)
        logp.append(extras["logp"])
        first.append(extras["first"])
    action = np.stack(acts, 1)
    reward = np.zeros((envs, steps), np.float32)
    reward[:, -1] = action[:, -1] == cue
    term = np.zeros((envs, steps), bool)
    term[:, -1] = True
    trajectory = Trajectory(
        obs=obs,
        next_obs=None,
        action=action,
        reward=reward,
        terminated=term,
        truncated=np.zeros_like(term),
        valid=np.ones_like(term),
        final_obs=obs[:, -1],
        extras={"logp": np.stack(logp, 1), "first": np.stack(first, 1)},
    )
    return trajectory, float(reward[:, -1].mean())


def actor_setup(
    cfg: ExperimentConfig,
    model: Any,
    observation_space: Any,
    action_space: Any,
    num_envs: int,
    *,
    seed: int = 0,
    actor_index: int = 0,
) -> ActorSetup:
    """An actor's :class:`ActorSetup` for a policy under test, its random stream from ``seed``."""
    return ActorSetup(
        config=cfg,
        observation_space=observation_space,
        action_space=action_space,
        num_envs=num_envs,
        model=model,
        actor_index=actor_index,
        seed=seed,
        rng=np.random.default_rng(seed),
        log=logging.getLogger("zrl.test.actor"),
        train_stats=TrainStats(),
    )


def learner_setup(
    cfg: ExperimentConfig,
    model: Any,
    observation_space: Any,
    action_space: Any,
    *,
    index: int = 0,
    services: Any = None,
) -> LearnerSetup:
    """A learner's :class:`LearnerSetup` for an update under test; ``services`` defaults to a
    lone learner's (an id, nothing else: an update that opens sockets fails)."""
    return LearnerSetup(
        config=cfg,
        model=model,
        observation_space=observation_space,
        action_space=action_space,
        index=index,
        log=logging.getLogger("zrl.test.learner"),
        train_stats=TrainStats(),
        services=services or SimpleNamespace(id=f"learner-{index}"),
    )


def welcome_message(
    spec: dict[str, Any], rid: str, factories: dict[str, str] | None = None
) -> P.Message:
    """A WELCOME as the broker sends it (or as a forger would): ``spec`` is the config it
    carries, ``rid`` the id it gives. A role's ``_on_welcome`` takes it directly."""
    return P.Message(
        P.WELCOME,
        meta={
            "id": rid,
            "spec": spec,
            "factories": dict(factories or {}),
            "endpoints": {},
            "heartbeat_interval": 0.5,
            "heartbeat_timeout": 3.0,
            "max_message_bytes": 2**20,
        },
    )
