"""What an algorithm package gives the generic roles, and what they give it.

An algorithm is a package ``zrl/algos/<name>/`` whose ``__init__.py`` defines ``ALGORITHM``,
an :class:`Algorithm`, and one line in ``zrl.algos.ALGORITHMS`` names it. The roles never ask
which algorithm runs; they ask the ``Algorithm``:

- ``wiring``: where actors send (a replay shard, every learner, or the parameter server), what
  a replay shard stores, what the learner reads, and the action space it is for.
- ``policy``: built once by the actor after WELCOME (:class:`ActorSetup` in); given a batch of
  observations it returns actions plus the extras the actor must record, and at the end of a
  trajectory it turns the recorded steps into the message to send (:class:`ActorPolicy`).
- ``update``: built once by the learner after WELCOME (:class:`LearnerSetup` in); it receives
  the messages of the learner's input, validated, and trains on them (:class:`LearnerUpdate`).
- ``gradient_server``: for an algorithm whose actors send gradients (A3C), built once by the
  parameter server (:class:`GradientServerSetup` in); it receives each gradient, validated,
  and steps the model it owns (:class:`GradientServer`).
- ``model``: the network zrl builds for it when the user gives none.
- ``config``: the config sections it defines (its pydantic models, by YAML key).
- ``check_config``: the checks of a config that only this algorithm needs.

The heavy parts (``policy``, ``update``, ``gradient_server``, ``model``) are ``"module:attribute"`` references,
imported only by the process that uses them: the config and the CLI never import torch.
This module imports nothing from zrl at run time, so every layer may use it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from zrl.config import ExperimentConfig
    from zrl.config_base import Section
    from zrl.roles.train_stats import TrainStats
    from zrl.transport.protocol import Message
    from zrl.transport.sockets import Channel


@dataclass(frozen=True)
class Wiring:
    """How an algorithm's data moves between the generic roles."""

    actions: Literal["discrete", "box"]
    """The env action space it is for: ``Discrete`` or a 1-D ``Box``."""
    experience: Literal["replay", "rollouts", "gradients"]
    """Where actors send what ``ActorPolicy.finish`` builds: PUSH ``experience`` to a replay
    shard (credit window of acknowledged inserts), PUB ``rollouts/`` to every learner, or PUSH
    ``gradients`` to the parameter server, whose :class:`GradientServer` (the algorithm's
    ``gradient_server``) applies them (A3C)."""
    replay_item: Literal["transitions", "unroll", "sequences", ""] = ""
    """What a replay shard stores of a TRAJECTORY: n-step transitions, whole unrolls (FIFO),
    or the fixed-length sequences the actor cut (R2D2); "" when the algorithm has no replay
    server."""
    replay_tables: tuple[str, ...] = ()
    """The ``replay.table`` values it works with."""
    learner_input: Literal["batches", "rollouts", ""] = "batches"
    """The learner's input: BATCH messages from replay shards, or the actors' rollouts; ""
    when it has no learner (the parameter server applies the actors' gradients)."""

    @classmethod
    def off_policy(cls, actions: Literal["discrete", "box"]) -> Wiring:
        """Ape-X's: actors -> replay shards of n-step transitions (uniform or prioritized)
        -> learners."""
        return cls(
            actions=actions,
            experience="replay",
            replay_item="transitions",
            replay_tables=("uniform", "prioritized"),
            learner_input="batches",
        )


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    wiring: Wiring
    policy: str
    """``module:attribute`` of its :class:`ActorPolicy` class, or of a function choosing one
    (PPO: feed-forward or recurrent), called with an :class:`ActorSetup`."""
    update: str
    """``module:Class`` of its :class:`LearnerUpdate`, called with a :class:`LearnerSetup`
    ("" when it has no learner)."""
    model: str
    """``module:function`` building zrl's network for it:
    ``f(observation_space, action_space, model_cfg, **model_options(config)) -> nn.Module``."""
    gradient_server: str = ""
    """``module:Class`` of its :class:`GradientServer`, called with a
    :class:`GradientServerSetup` (required when ``wiring.experience`` is "gradients", ""
    otherwise)."""
    recurrent: bool = False
    """Its policy and update carry a recurrent state, so ``model.core`` may be lstm or gru."""
    random_actions: bool = False
    """Its actor policy honours ``actor.random_policy`` (uniform random actions, no model)."""
    config: Mapping[str, type[Section]] = field(default_factory=dict)
    """The config sections it defines, YAML key -> section model (``{"ppo": PPOConfig}``):
    ``ExperimentConfig`` validates them beside its own, and the algorithm reads its section
    with ``cfg.section(PPOConfig)``."""
    sections: tuple[str, ...] = ()
    """The shared config sections it reads that not every algorithm does (``replay``,
    ``learner``): ``zrl config show`` prints these and its own (:attr:`reads`)."""
    check_config: Callable[[ExperimentConfig], None] | None = None
    """Raises ValueError (a user-facing message naming the key) on a config it cannot run."""
    model_options: Callable[[ExperimentConfig], dict[str, Any]] | None = None
    """Keyword arguments of ``model`` that its own config section sets (Ape-X DDPG: twin
    critics)."""

    @classmethod
    def box_off_policy(
        cls,
        name: str,
        summary: str,
        *,
        model: str,
        config: Mapping[str, type[Section]],
        model_options: Callable[[ExperimentConfig], dict[str, Any]] | None = None,
    ) -> Algorithm:
        """An algorithm for Box actions on the policy and update of ``zrl.algos.continuous``
        (Ape-X DDPG, SAC): Ape-X wiring, zrl's network ``model``, the config sections replay,
        learner and its own ``config``."""
        continuous = "zrl.algos.continuous"
        return cls(
            name=name, summary=summary, wiring=Wiring.off_policy("box"),
            policy=f"{continuous}:ContinuousPolicy", update=f"{continuous}:ContinuousUpdate",
            model=model, config=config, sections=("replay", "learner"),
            model_options=model_options,
        )  # fmt: skip

    @property
    def reads(self) -> tuple[str, ...]:
        """The config sections it reads beyond those every algorithm reads: the shared
        ``sections`` and its own ``config``."""
        return (*self.sections, *self.config)

    def check(self, cfg: ExperimentConfig) -> None:
        """Raise ValueError (naming the key) on a config this algorithm cannot run: what its
        wiring implies, then its own ``check_config``."""
        w, r = self.wiring, cfg.roles
        if cfg.actor.random_policy and not self.random_actions:
            raise ValueError(
                f"actor.random_policy: {self.name}'s actors have no random mode (impala and "
                "appo have)"
            )
        core = cfg.model.core
        if core != "none" and not self.recurrent:
            raise ValueError(
                f"model.core: {core}: {self.name} has no recurrent policy (r2d2, ppo, impala "
                "and appo have); set model.core: none"
            )
        if not w.replay_item and r.replay > 0:
            raise ValueError(
                f"{self.name} sends its experience past the replay server: set roles.replay: 0"
            )
        if w.replay_item and r.replay == 0 and (r.actors > 0 or r.learners > 0):
            raise ValueError(f"{self.name} learns from replay: set roles.replay >= 1")
        if w.replay_tables and r.replay > 0 and cfg.replay.table not in w.replay_tables:
            raise ValueError(
                f"{self.name} needs replay.table: {' or '.join(w.replay_tables)}, "
                f"not {cfg.replay.table}"
            )
        if not w.learner_input and r.learners > 0:
            raise ValueError(
                f"{self.name} has no learner (the parameter server applies the actors' "
                "gradients): set roles.learners: 0"
            )
        if (w.experience == "gradients") != bool(self.gradient_server):
            raise ValueError(
                f"algorithm {self.name}: gradient_server must name the class that applies the "
                "actors' gradients exactly when wiring.experience is 'gradients'"
            )
        if w.experience == "gradients" and r.params == 0:
            raise ValueError(
                f"{self.name} needs the parameter server (roles.params: 1) to apply gradients"
            )
        if self.check_config is not None:
            self.check_config(cfg)

    def load(self, ref: str) -> Any:
        """The object a ``module:attribute`` reference of this algorithm names."""
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)


# --- actor side --------------------------------------------------------------------------


@dataclass
class ActorSetup:
    """What the actor gives its policy: the experiment, its envs' spaces and its model."""

    config: ExperimentConfig
    observation_space: Any
    action_space: Any
    num_envs: int
    model: nn.Module
    actor_index: int
    seed: int
    rng: np.random.Generator
    log: logging.Logger
    train_stats: TrainStats


@dataclass
class Trajectory:
    """T steps of E envs as the actor recorded them, env-major ``[E, T, ...]``.

    ``valid[e, t]`` is False for the step after an episode end (it only reset the env);
    ``final_obs`` is the observation after the last step (the bootstrap state of an unroll);
    ``extras`` holds what ``ActorPolicy.act`` asked to record, in the same layout;
    ``weights_version`` is the version of the weights that acted (the message's meta carries
    it too; a policy that sends data spanning trajectories, R2D2's, keeps it per step)."""

    obs: np.ndarray
    next_obs: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    final_obs: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    weights_version: int = 0

    def transitions(self, priority: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of a ``transitions`` TRAJECTORY (``zrl.transport.messages``)."""
        assert self.next_obs is not None, "the policy must set records_next_obs"
        return {
            "obs": self.obs, "action": self.action, "reward": self.reward,
            "terminated": self.terminated, "truncated": self.truncated, "valid": self.valid,
            "next_obs": self.next_obs, "priority": priority,
        }  # fmt: skip

    def unroll(self) -> dict[str, np.ndarray]:
        """The arrays of an ``unroll`` TRAJECTORY (behaviour log-probs in ``extras``)."""
        return {
            "obs": self.obs, "action": self.action, "logp": self.extras["logp"],
            "reward": self.reward, "terminated": self.terminated, "truncated": self.truncated,
            "valid": self.valid, "bootstrap_obs": self.final_obs.copy(),
        }  # fmt: skip


@dataclass
class Outgoing:
    """What the actor sends for one trajectory: a message kind, its arrays and extra meta."""

    kind: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


class ActorPolicy(Protocol):
    """The actor-side half of an algorithm. The actor owns the envs, the buffers, sending,
    the credit window and the episode statistics; the policy only decides."""

    records_next_obs: bool
    """Whether the actor keeps every step's next observation (transitions need it)."""
    action_dtype: type
    action_shape: tuple[int, ...]
    """The per-env action: ``()`` int64 for Discrete, ``(act_dim,)`` float32 for a Box."""

    def begin(self, steps: int, env_steps: int) -> None:
        """A trajectory of ``steps`` steps starts (draw its exploration noise here, at once)."""

    def act(
        self, obs: np.ndarray, t: int, rows: slice | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions ``[E, *action_shape]`` for observations ``[E, ...]`` at step ``t`` of the
        trajectory, and per-step extras to record (``{"logp": [E]}``, ...).

        ``rows``: the observations are only those of envs ``rows`` of the E (double-buffered
        sampling, ``actor.env_groups`` > 1, acts for one group of envs at a time); per-env
        state (exploration draws of ``begin``, per-env epsilons) is indexed by it, and the
        actions and extras are ``[len(rows), ...]``. The actor passes it only when
        ``env_groups`` > 1: a policy without it runs with ``env_groups: 1``."""

    def finish(self, trajectory: Trajectory) -> Outgoing:
        """The message to send for a collected trajectory (adds priorities, or computes the
        gradient for A3C)."""

    def episodes_started(self, envs: np.ndarray) -> None:
        """The envs with these indices start a new episode at their next observation (after
        the step that only reset them, or after all envs were reset on an env error): a
        recurrent policy zeroes their state before it acts on that observation."""

    def may_collect(self, weights_version: int) -> bool:
        """False while the algorithm must wait for newer weights before collecting (PPO)."""

    def sent(self, weights_version: int) -> None:
        """A trajectory collected with ``weights_version`` left the actor."""

    def train_info(self) -> dict[str, float]:
        """Exploration figures for the training metrics (epsilons, noise scales, ...)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""


class BasePolicy:
    """Defaults of the optional :class:`ActorPolicy` methods, for policies to inherit."""

    def begin(self, steps: int, env_steps: int) -> None:
        pass

    def episodes_started(self, envs: np.ndarray) -> None:
        pass

    def may_collect(self, weights_version: int) -> bool:
        return True

    def sent(self, weights_version: int) -> None:
        pass

    def train_info(self) -> dict[str, float]:
        return {}

    def heartbeat_info(self) -> dict[str, Any]:
        return {}


# --- learner side ------------------------------------------------------------------------


class LearnerServices(Protocol):
    """What the learner role lends an update that talks to its peers (DD-PPO)."""

    id: str
    stop_event: threading.Event

    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Channel: ...

    def open_subscriber(self, topics: list[str], name: str, *, hwm: int = 1000) -> Channel: ...

    def tick(self) -> None:
        """Heartbeats and registry replies: call it during long work (every ~100 ms)."""

    def follow_weights(self, model: nn.Module) -> Any:
        """A ``WeightsFollower`` of the published weights for ``model``."""


@dataclass
class LearnerSetup:
    """What the learner gives its update: the experiment, its model and its place."""

    config: ExperimentConfig
    model: nn.Module
    observation_space: Any
    action_space: Any
    index: int
    log: logging.Logger
    train_stats: TrainStats
    services: LearnerServices
    device: torch.device | str = "cpu"
    """Where ``model`` lives (``learner.device``): batches go there (``zrl.algos.batches``)."""


@dataclass
class Priorities:
    """New priorities of sampled keys, for the shard that sampled them."""

    shard: str
    keys: np.ndarray
    priorities: np.ndarray


@dataclass
class UpdateResult:
    """What one call of ``LearnerUpdate.train`` did."""

    updates: int
    """Optimizer steps taken."""
    loss: float
    priorities: Priorities | None = None
    samples: int = 0
    """Distinct env steps (transitions) trained on, each counted once however many epochs
    used it: what ``samples_trained`` in progress.csv adds up."""
    publish: bool = False
    """Publish the weights now, whatever ``learner.publish_interval`` says (end of a round)."""


class BaseUpdate:
    """Defaults of the optional :class:`LearnerUpdate` methods, for updates to inherit."""

    def may_publish(self) -> bool:
        return True

    def weights_meta(self) -> dict[str, int]:
        return {}

    def train_info(self) -> dict[str, float]:
        return {}

    def heartbeat_info(self) -> dict[str, Any]:
        return {}

    def summary(self) -> str:
        return ""


class NonFiniteLossError(FloatingPointError):
    """A NaN/inf loss or gradient norm, raised before the optimizer step that would apply it."""

    def __init__(self, loss: float, grad_norm: float, source: str = "") -> None:
        super().__init__(f"non-finite loss {loss} (gradient norm {grad_norm})")
        self.loss = loss
        self.grad_norm = grad_norm
        self.source = source


class LearnerUpdate(Protocol):
    """The learner-side half of an algorithm. The learner owns receiving, acks, checkpoints,
    publishing the weights and non-finite handling; the update only trains."""

    model: nn.Module
    """The network whose weights are published."""

    def receive(self, msg: Message, version: int) -> None:
        """Validate one message of the learner's input and keep it (ProtocolError: dropped).
        ``version`` is the learner's current weights version."""

    def train(self, version: int) -> UpdateResult | None:
        """Train on what was received, if it is enough; None otherwise. Raises
        NonFiniteLossError before applying a non-finite step."""

    def may_publish(self) -> bool:
        """Whether this learner publishes weights (DD-PPO: only learner 0, once all learners
        hear each other)."""

    def weights_meta(self) -> dict[str, int]:
        """Extra integers published with the weights (the algorithm's progress)."""

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's state in a checkpoint (networks, optimizers, counters)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def train_info(self) -> dict[str, float]:
        """Figures for the training metrics that are not per update (learning rates)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""

    def summary(self) -> str:
        """One line for the log when the learner stops ("" for none)."""


# --- parameter server side ---------------------------------------------------------------


@dataclass
class GradientServerSetup:
    """What the parameter server gives its gradient server: the experiment and its model."""

    config: ExperimentConfig
    model: nn.Module
    """Built by the parameter server (seeded with ``config.seed``, as the actors' copies)."""
    observation_space: Any
    action_space: Any
    log: logging.Logger
    train_stats: TrainStats


class GradientServer(Protocol):
    """The parameter-server half of an algorithm whose actors send gradients (A3C). The
    parameter server owns the ``gradients`` stream, drop counting, the checkpoint file and
    storing and publishing every weights version; the gradient server owns the model's
    optimizer, the combining of gradients and its counters."""

    model: nn.Module
    """The network whose weights the parameter server publishes after each update."""
    updates: int
    """Optimizer steps taken (published with the weights, restored from the checkpoint)."""

    def receive(self, msg: Message, version: int) -> bool:
        """Validate one message of the ``gradients`` stream (ProtocolError: dropped) and keep
        or apply it; True when it completed an update, so ``model`` holds a new weights
        version. ``version`` is the server's current weights version."""

    def state_dict(self) -> dict[str, Any]:
        """Its state in the parameter server's checkpoint (model, optimizer, counters), which
        adds the key ``version``."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def train_info(self) -> dict[str, float]:
        """Figures for the training metrics that are not per update (learning rates)."""

    def heartbeat_info(self) -> dict[str, Any]:
        """Extra heartbeat fields."""

    def summary(self) -> str:
        """One line for the log when the parameter server stops ("" for none)."""
