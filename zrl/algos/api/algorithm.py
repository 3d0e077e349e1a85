"""The record of an algorithm (:class:`Algorithm`) and how its data moves between the generic
roles (:class:`Wiring`); ``zrl.algos.api`` says what each field means to the roles.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from zrl.config.base import Section
    from zrl.config.experiment import ExperimentConfig


@dataclass(frozen=True)
class Wiring:
    """How an algorithm's data moves between the generic roles."""

    actions: Literal["discrete", "box", "any"]
    """The env action space it is for: ``Discrete``, a 1-D ``Box``, or either (``any``: its
    model and actor policy follow the env's action space, PPO's, IMPALA's and APPO's)."""
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
    team: bool = False
    """Its actors send one transition per multi-agent game, not per slot (QMIX): the game's
    slot observations side by side, the joint action index, the team reward; the replay
    shard's layout is the team's (``zrl.replay.layout``)."""

    @classmethod
    def replayed(
        cls,
        actions: Literal["discrete", "box", "any"],
        item: Literal["transitions", "unroll", "sequences"],
        tables: tuple[str, ...],
    ) -> Wiring:
        """Actors -> replay shards that store ``item`` in one of ``tables`` -> learners, which
        PULL batches from the shards (Ape-X, IMPALA, R2D2)."""
        return cls(
            actions=actions,
            experience="replay",
            replay_item=item,
            replay_tables=tables,
            learner_input="batches",
        )

    @classmethod
    def off_policy(cls, actions: Literal["discrete", "box"]) -> Wiring:
        """Ape-X's: actors -> replay shards of n-step transitions (uniform or prioritized)
        -> learners."""
        return cls.replayed(actions, "transitions", ("uniform", "prioritized"))


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
    both_seats: bool = False
    """Its actor policy sends, and its learners read, the turn passes of a turn-based game
    played from both seats (``env.multiagent.self_play_seats: both``: ``turn_unroll``
    rollouts, negamax GAE), for a feed-forward model."""
    data_parallel: bool = False
    """Several learners of one policy (``roles.learners`` more than the policies) train it
    together in a ``torch.distributed`` group (``zrl.distributed.learner_group``; every built-in
    algorithm with a learner). Without it such learners would each train and publish a model
    of their own, so they are refused."""
    remote_inference: bool = False
    """Its actor policy only calls the model's forward methods (``forward``,
    ``policy_logits``, ``step``), so an inference role (``roles.inference``) can run them for
    its actors; one that needs the weights in the actor (PPO's synchronous rounds, A3C's
    gradients, the continuous policies' critics) has False."""
    search_player: str = ""
    """``module:function`` of a player that searches with the model, called
    ``f(model, config, game, seed)`` for a board game (``zrl.envs.multiagent.games``); it
    returns None when the config asks for no search, else an object with the model's
    ``act(obs, deterministic=True)``: the evaluator plays it beside the greedy policy and
    reports it as ``search_<opponent>_...`` (AlphaZero). "" for none."""
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
    sequence_length: Callable[[ExperimentConfig], int] | None = None
    """The steps in each sequence its actors cut, from its own config section (required when
    ``wiring.replay_item`` is "sequences": a replay shard fixes its layout with it, R2D2)."""
    recurrent_wiring: Wiring | None = None
    """Its wiring when ``model.core`` is set, if that differs from ``wiring`` (QMIX: the
    team's sequences instead of its transitions); the same actions, experience and learner
    input, only what the replay shard stores changes (:meth:`wiring_for`)."""

    def wiring_for(self, cfg: ExperimentConfig) -> Wiring:
        """The wiring of experiment ``cfg``: ``recurrent_wiring`` where it has one and
        ``model.core`` is set, else ``wiring``."""
        if self.recurrent_wiring is not None and cfg.model.core != "none":
            return self.recurrent_wiring
        return self.wiring

    @property
    def reads(self) -> tuple[str, ...]:
        """The config sections it reads beyond those every algorithm reads: the shared
        ``sections`` and its own ``config``."""
        return (*self.sections, *self.config)

    def check(self, cfg: ExperimentConfig) -> None:
        """Raise ValueError (naming the key) on a config this algorithm cannot run: what its
        wiring implies, then its own ``check_config``."""
        w, r = self.wiring_for(cfg), cfg.roles
        if cfg.actor.random_policy and not self.random_actions:
            raise ValueError(
                f"actor.random_policy: {self.name}'s actors have no random mode (impala and "
                "appo have)"
            )
        core = cfg.model.core
        if core != "none" and not self.recurrent:
            raise ValueError(
                f"model.core: {core}: {self.name} has no recurrent policy (r2d2, ppo, impala, "
                "appo and qmix have); set model.core: none"
            )
        if cfg.model.normalize_input and not (
            w.replay_item == "unroll" or w.learner_input == "rollouts"
        ):
            raise ValueError(
                f"model.normalize_input: {self.name}'s learner does not update the statistics "
                "(the learners of unrolls do: impala, appo and ppo); set "
                "model.normalize_input: false"
            )
        if r.inference and not self.remote_inference:
            raise ValueError(
                f"roles.inference: {r.inference}: {self.name}'s actors need the weights in "
                "their own model (apex_dqn, r2d2, impala and appo can act through inference "
                "roles); set roles.inference: 0"
            )
        if not w.replay_item and r.replay > 0:
            raise ValueError(
                f"{self.name} sends its experience past the replay server: set roles.replay: 0"
            )
        if w.replay_item and r.replay == 0 and (r.actors != 0 or r.learners > 0):
            raise ValueError(f"{self.name} learns from replay: set roles.replay >= 1")
        if w.replay_tables and r.replay > 0 and cfg.replay.table not in w.replay_tables:
            raise ValueError(
                f"{self.name} needs replay.table: {' or '.join(w.replay_tables)}, "
                f"not {cfg.replay.table}"
            )
        if w.learner_input and cfg.learners_per_policy() > 1 and not self.data_parallel:
            raise ValueError(
                f"roles.learners: {r.learners} for {len(cfg.policies)} learning "
                f"{'policy' if len(cfg.policies) == 1 else 'policies'}: {self.name}'s learners "
                "do not train one policy together (ppo, impala and appo do), each would publish "
                "a model of its own; set roles.learners: "
                f"{len(cfg.policies)}"
            )
        learners = cfg.learners_per_policy()
        shards, prefetch = r.replay, cfg.replay.prefetch
        if w.learner_input == "batches" and learners > 1 and shards * prefetch < learners:
            raise ValueError(
                f"roles.learners ({learners}): {self.name}'s learners each train their own "
                f"batches, in step, and at most roles.replay ({shards}) x replay.prefetch "
                f"({prefetch}) = {shards * prefetch} are in flight; make that product at "
                f"least {learners}"
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
        items = {self.wiring.replay_item}
        if self.recurrent_wiring is not None:
            items.add(self.recurrent_wiring.replay_item)
        if ("sequences" in items) != (self.sequence_length is not None):
            raise ValueError(
                f"algorithm {self.name}: sequence_length must give the steps of each sequence "
                "exactly when wiring.replay_item (or recurrent_wiring's) is 'sequences'"
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
