"""The record of an algorithm (:class:`Algorithm`) and how its data moves between the generic
roles (:class:`Wiring`); ``zrl.algos.api`` says what each field means to the roles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from zrl.algos.api.actor import ActorPolicy, ActorSetup
    from zrl.algos.api.learner import (
        GradientServer,
        GradientServerSetup,
        LearnerSetup,
        LearnerUpdate,
    )
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
class Pieces:
    """An algorithm's heavy pieces (they import torch): what :attr:`Algorithm.pieces` returns,
    the objects themselves, imported by the function that builds this record."""

    policy: Callable[[ActorSetup], ActorPolicy]
    """Its :class:`ActorPolicy` class, or a function choosing one (PPO: feed-forward or
    recurrent), called with an :class:`ActorSetup`."""
    model: Callable[..., Any]
    """The function building zrl's network for it:
    ``f(observation_space, action_space, model_cfg, **model_options(config)) -> nn.Module``."""
    update: Callable[[LearnerSetup], LearnerUpdate] | None = None
    """Its :class:`LearnerUpdate` class, called with a :class:`LearnerSetup` (None when it has
    no learner)."""
    gradient_server: Callable[[GradientServerSetup], GradientServer] | None = None
    """Its :class:`GradientServer` class, called with a :class:`GradientServerSetup`
    (required when ``wiring.experience`` is "gradients", None otherwise)."""
    search_player: Callable[..., Any] | None = None
    """A player that searches with the model, called ``f(model, config, game, seed)`` for a
    board game (``zrl.envs.multiagent.games``); it returns None when the config asks for no
    search, else an object with the model's ``act(obs, deterministic=True)``: the evaluator
    plays it beside the greedy policy and reports it as ``search_<opponent>_...``
    (AlphaZero). None for none (then :attr:`Algorithm.searches` is False)."""


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    wiring: Wiring
    pieces: Callable[[], Pieces]
    """Imports and returns its heavy pieces (:class:`Pieces`): a function whose imports are
    inside it, so that the record, and the config that validates against it, stay light
    (no torch) and only a process that runs a piece imports it. Called once per process
    (:meth:`loaded`); ``policy``, ``update``, ``model``, ``gradient_server`` and
    ``search_player`` are its pieces."""
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
    population: tuple[str, ...] = ()
    """The hyperparameters population-based training (``pbt.members``, ``roles.pbt``) may
    change for it, as ``<section>.<field>`` config keys its learner can set live (PPO:
    ``learner.lr``, ``ppo.entropy_coef``); empty: no PBT. Each member's learners take the
    member's values (``pbt.hyperparameters``) and report its fitness."""
    searches: bool = False
    """Its pieces have a ``search_player`` (AlphaZero's): the evaluator plays it beside the
    greedy policy and reports it as ``search_<opponent>_...``; light, for the supervisor,
    which lists those columns without importing the pieces."""
    config: Mapping[str, type[Section]] = field(default_factory=dict)
    """The config sections it defines, YAML key -> section model (``{"ppo": PPOConfig}``):
    ``ExperimentConfig`` validates them beside its own, and the algorithm reads its section
    with ``cfg.section(PPOConfig)``."""
    sections: tuple[str, ...] = ()
    """The shared config sections it reads that not every algorithm does (``replay``,
    ``learner``): ``zrl config show`` prints these and its own (:attr:`reads`)."""
    key_aliases: Mapping[str, str] = field(default_factory=dict)
    """What users of other libraries (SB3, CleanRL, RLlib, Sample Factory) call its keys,
    ``{"learning_rate": "learner.lr"}``: an unknown key of a config of this algorithm with
    one of these names (or a typo of one) is suggested the zrl key (``zrl.config.help``)."""
    shared_key_aliases: Mapping[str, str] = field(default_factory=dict)
    """Other libraries' names for keys of its own sections (``{"ent_coef":
    "ppo.entropy_coef"}``), suggested whichever algorithm runs where that one has no
    ``key_aliases`` entry of its own for the name."""
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

    def loaded(self) -> Pieces:
        """Its :class:`Pieces`, imported on the first call in this process (``pieces()``),
        checked against the record: a gradient server exactly when its actors send gradients,
        a search player exactly when ``searches``."""
        cached: Pieces | None = self.__dict__.get("_loaded")
        if cached is not None:
            return cached
        pieces = self.pieces()
        if (self.wiring.experience == "gradients") != (pieces.gradient_server is not None):
            raise ValueError(
                f"algorithm {self.name}: gradient_server must give the class that applies the "
                "actors' gradients exactly when wiring.experience is 'gradients'"
            )
        if self.searches != (pieces.search_player is not None):
            raise ValueError(
                f"algorithm {self.name}: search_player must be given exactly when searches"
            )
        object.__setattr__(self, "_loaded", pieces)  # a cache, not a field: frozen all the same
        return pieces

    @property
    def policy(self) -> Callable[[ActorSetup], ActorPolicy]:
        return self.loaded().policy

    @property
    def update(self) -> Callable[[LearnerSetup], LearnerUpdate] | None:
        return self.loaded().update

    @property
    def model(self) -> Callable[..., Any]:
        return self.loaded().model

    @property
    def gradient_server(self) -> Callable[[GradientServerSetup], GradientServer] | None:
        return self.loaded().gradient_server

    @property
    def search_player(self) -> Callable[..., Any] | None:
        return self.loaded().search_player
