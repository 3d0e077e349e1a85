"""Experiment configuration: the typed schema ``ExperimentConfig``, YAML loading, ``--set``
overrides.

A config is one YAML file; every role receives the whole resolved config from
the broker (the experiment spec) and reads its own section. Validation is done
by pydantic with ``extra="forbid"``, so a typo is an error naming the key path,
never a silently ignored setting.

The sections every algorithm shares are ``zrl.config.sections``. The
sections only one algorithm reads are defined in its package
(``zrl/algos/<name>/config.py``) and named by its ``Algorithm.config``: ``ExperimentConfig``
validates them under their YAML keys beside its own fields, from the registry, so adding an
algorithm adds nothing here; the algorithm reads its section with ``cfg.section(PPOConfig)``.
The did-you-mean help for a config that does not validate is ``zrl.config.help``.

A config is input like any other: YAML is read with ``BoundedLoader`` (no alias expansion
bombs), every float is finite (``zrl.config.base``), ``name`` is one path component and every
size has a ceiling (``zrl.config.sections``), and ``check_fits_machine`` measures the roles
this host runs against its cores and memory before anything starts (``zrl.run.preflight``).
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails
from yaml.composer import ComposerError

from zrl.config.base import Section
from zrl.config.catalog import catalog
from zrl.config.help import format_validation_error
from zrl.config.league import MAIN, LeagueConfig
from zrl.config.multiagent import is_multiagent
from zrl.config.pbt import PBTConfig, member_names
from zrl.config.sections import (
    ROLE_COUNT_KEYS,
    ActorConfig,
    BrokerConfig,
    CheckpointConfig,
    EnvConfig,
    EvaluatorConfig,
    HostConfig,
    InferenceConfig,
    LearnerConfig,
    LimitsConfig,
    LoggingConfig,
    ModelConfig,
    ReplayConfig,
    RolesConfig,
    StopConfig,
)

MAX_CONFIG_FILE_BYTES = 2**20
"""A config file bigger than this is refused unread (the shipped ones are under 4 KB)."""
MAX_CONFIG_VALUES = 100_000
"""Values (scalars, lists, mappings) a YAML document may hold with its aliases expanded: a
1 KB alias bomb, each anchor a list of ten aliases of the one before, expands to billions."""
MAX_CONFIG_DEPTH = 64
"""Lists and mappings nested deeper than this are refused."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.+ -]{0,98}[A-Za-z0-9_.+-])?")
"""``name``: one path component (the run directory is ``runs/<name>-<time>-<pid>``)."""
ROLES_PER_CORE = 8
"""Role processes a host may run per core (``check_fits_machine``)."""
ROLE_PROCESS_BYTES = 150 * 2**20
"""Resident memory a role process needs at least (Python, numpy, torch, ZeroMQ)."""
ENVS_PER_CORE = 1024
"""Environments the actors of a host may step per core (``env.num_envs`` x its actors)."""

ALGORITHM_SECTIONS_AFTER = "learner"
"""The algorithms' own sections stand after this one in a dumped config (``zrl config show``)."""

S = TypeVar("S", bound=Section)


def algo_sections() -> dict[str, tuple[str, ...]]:
    """The algorithm-specific sections each ``algo`` reads (the keys are the algorithms); every
    other section applies to all of them. ``zrl config show`` prints only what ``algo`` uses."""
    return {name: catalog().get(name).reads for name in catalog().names()}


class ConfigError(ValueError):
    """A config that cannot be loaded or does not validate; the message is user-facing."""


class ExperimentConfig(Section):
    """A whole experiment: the sections every algorithm shares as fields, and the sections
    the registered algorithms define beside them (``section``), under their own YAML keys."""

    name: str = "experiment"
    """The experiment's name: one path component (letters, digits, ``_.+-`` and inner spaces;
    not starting with a dot), as the run directory ``runs/<name>-<time>-<pid>`` is named
    after it."""
    algo: str = Field(default_factory=lambda: catalog().default())
    """One of ``zrl.algos.registry.BUILT_IN`` (or an algorithm a script registered); by
    default the registry's first, apex_dqn."""
    seed: int = 0
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environments: a gymnasium or PettingZoo id, how many one actor steps and how they
    are stepped together (``vectorization``), Atari preprocessing, multi-agent seats."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """zrl's network for ``algo``: MLP torso, image encoder, recurrent core. The actors, the
    learners, the parameter server and the evaluator each build it from this section."""
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    """The broker's address, role liveness (heartbeats), its streams and topic bus (queue
    depths, socket buffers, message sizes) and its registry's bounds."""
    roles: RolesConfig = Field(default_factory=RolesConfig)
    """How many of each role the experiment runs; ``hosts`` places some on other hosts."""
    actor: ActorConfig = Field(default_factory=ActorConfig)
    """The actors: trajectory length, Ape-X exploration, unacknowledged trajectories in
    flight, torch threads and double-buffered sampling (``env_groups``)."""
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    """The inference roles (``roles.inference``): the device they run the policy on and the
    size of one batched forward."""
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """The replay shards, for the algorithms that replay: table kind, capacity, priorities,
    n-step returns, batches and the sample-to-insert ratio."""
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    """The learners: learning rate, DQN's loss and target network, gradient clipping, how
    often weights are published, threads and device."""
    # Here, in a dumped config: the algorithms' own sections (``section``).
    league: LeagueConfig = Field(default_factory=LeagueConfig)
    """Self-play for multi-agent games when ``roles.league`` is 1: the learning players,
    snapshots of them and how each episode's opponent is drawn."""
    pbt: PBTConfig = Field(default_factory=PBTConfig)
    """Population-based training of PPO when ``pbt.members`` > 0 (and ``roles.pbt`` is 1):
    the members, how often they are ranked, exploit and explore (``docs/pbt.md``)."""
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    """How often the evaluator plays and how many episodes an evaluation has."""
    stop: StopConfig = Field(default_factory=StopConfig)
    """When the experiment ends: an evaluation return (confirmed by a window of evaluations
    or by fresh episodes), env steps or wall time, whichever comes first."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Where and how often the learners and replay shards save, and whether the replay
    tables are saved with them."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """Resource limits of every role process (resident memory)."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Where `zrl run` writes its scalars (TensorBoard, CSV, W&B, MLflow) and under which
    project and run name."""
    hosts: list[HostConfig] = Field(default_factory=list)
    """Placement: roles on other hosts; the rest of `roles` runs where `zrl run` runs."""
    _algorithm_sections: dict[str, Section] = PrivateAttr(default_factory=dict)
    """Every section of ``catalog().sections()`` (``zrl.config.catalog``), by YAML key
    (defaults where the config has none), whichever algorithm runs: ``--all`` shows them, a
    config keeps them."""

    def section(self, model: type[S]) -> S:
        """The algorithm config section of class ``model``: ``cfg.section(PPOConfig).clip``."""
        for section in self._algorithm_sections.values():
            if isinstance(section, model):
                return section
        raise KeyError(f"no algorithm this process knows defines the section {model.__name__}")

    @model_serializer(mode="wrap")
    def _dump_algorithm_sections(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        sections = {k: s.model_dump(mode=info.mode) for k, s in self._algorithm_sections.items()}
        items = list(data.items())
        keys = [k for k, _ in items]
        at = keys.index(ALGORITHM_SECTIONS_AFTER) + 1 if ALGORITHM_SECTIONS_AFTER in keys else 0
        return dict([*items[:at], *sections.items(), *items[at:]])

    @model_validator(mode="after")
    def _sections_agree(self) -> ExperimentConfig:
        """The rules that span sections: each method raises ValueError if its rule is broken,
        in this order."""
        self._placement_fits()
        self._roles_fit_registry()
        self._env_groups_divide()
        self._multiagent_fits()
        self._exploiters_fit()
        self._inference_fits()
        self._pbt_fits()
        return self

    def _placement_fits(self) -> None:
        for key in ROLE_COUNT_KEYS:
            placed = sum(h.roles.get(key, 0) for h in self.hosts)
            total = getattr(self.roles, key)
            if total != "auto" and placed > total:  # auto: this host's actors plus theirs
                raise ValueError(f"hosts place {placed} {key} but roles.{key} is {total}")

    def _roles_fit_registry(self) -> None:
        planned = {  # an auto count is checked once the head has resolved it
            key: getattr(self.roles, key)
            for key in ROLE_COUNT_KEYS
            if getattr(self.roles, key) != "auto"
        }
        if sum(planned.values()) > self.broker.max_roles:
            counts = ", ".join(f"roles.{k}: {n}" for k, n in planned.items() if n)
            raise ValueError(
                f"{sum(planned.values())} roles planned ({counts}) but the registry holds at "
                f"most broker.max_roles: {self.broker.max_roles}"
            )

    def _env_groups_divide(self) -> None:
        if self.env.num_envs % self.actor.env_groups:
            raise ValueError(
                f"env.num_envs ({self.env.num_envs}) must be a multiple of actor.env_groups "
                f"({self.actor.env_groups})"
            )

    def _multiagent_fits(self) -> None:
        multiagent = is_multiagent(self.env.id)
        if multiagent and self.actor.env_groups > 1:
            raise ValueError(
                f"actor.env_groups: {self.actor.env_groups}: a PettingZoo env steps its games "
                "in one process; set actor.env_groups: 1"
            )
        if multiagent and self.env.multiagent.self_play_seats == "both":
            why = ""
            if not catalog().get(self.algo).both_seats:
                both = [a for a in catalog().names() if catalog().get(a).both_seats]
                why = (
                    f"algo {self.algo!r} learns from one seat's moves ({' and '.join(both)} "
                    "learn from both)"
                )
            elif self.model.core != "none":
                why = "a recurrent model (model.core) carries one seat's memory"
            if why:
                raise ValueError(f"env.multiagent.self_play_seats: both: {why}; set it to learning")
        if self.roles.league and not multiagent:
            raise ValueError(
                f"roles.league: the league picks opponents in multi-agent envs "
                f"(pettingzoo/<game>), not in {self.env.id!r}"
            )

    def _exploiters_fit(self) -> None:
        lc, r = self.league, self.roles
        if not lc.main_exploiters and not lc.league_exploiters:
            return
        keys = (
            f"league.main_exploiters ({lc.main_exploiters}) + league.league_exploiters "
            f"({lc.league_exploiters})"
        )
        players = len(lc.players)
        if not r.league:
            raise ValueError(f"{keys}: exploiters are league players; set roles.league: 1")
        if r.learners != players:
            raise ValueError(
                f"roles.learners ({r.learners}) must be 1 + {keys} = {players}: each learning "
                "player has its own learner"
            )
        if r.actors != "auto" and r.actors < players:
            raise ValueError(
                f"roles.actors ({r.actors}) must be at least 1 + {keys} = {players}: each "
                "learning player needs an actor"
            )
        wiring = catalog().get(self.algo).wiring
        if wiring.learner_input != "rollouts":
            # A replay shard's table holds one policy's experience, so its batches could
            # not tell the learners apart.
            able = [
                a for a in catalog().names() if catalog().get(a).wiring.learner_input == "rollouts"
            ]
            raise ValueError(
                f"{keys}: algo {self.algo!r} sends experience through replay, which carries "
                "one policy; exploiters need an algorithm whose actors publish rollouts to "
                f"the learners ({', '.join(able)})"
            )

    def _inference_fits(self) -> None:
        if not self.roles.inference:
            return
        why = ""
        # An actor that moves for every seat of its games plays no opponent model; every
        # other multi-agent actor does.
        plays_every_move = self.env.multiagent.plays_every_move
        if self.roles.league or (is_multiagent(self.env.id) and not plays_every_move):
            why = "the actors of multi-agent games play their opponents with models of their own"
        elif self.actor.random_policy:
            why = "actor.random_policy never runs the model"
        if why:
            raise ValueError(
                f"roles.inference: {self.roles.inference}: {why}; set roles.inference: 0 "
                "(the actors run their own model)"
            )

    def _pbt_fits(self) -> None:
        n, r = self.pbt.members, self.roles
        if r.evaluator > 1 and not (n and self.pbt.fitness == "evaluation"):
            raise ValueError(
                f"roles.evaluator ({r.evaluator}): one evaluator evaluates the policy; more are "
                "a population's, one per member (pbt.fitness: evaluation); set roles.evaluator: 1"
            )
        if not n:
            if r.pbt:
                raise ValueError("roles.pbt: 1 needs a population: set pbt.members (>= 2)")
            return
        key = f"pbt.members ({n})"
        why = ""
        changes = catalog().get(self.algo).population
        unknown = sorted(set(self.pbt.hyperparameters) - set(changes))
        if not changes:
            able = [a for a in catalog().names() if catalog().get(a).population]
            why = f"algo {self.algo!r}: PBT is implemented for {' and '.join(able)} only"
        elif unknown:
            key = "pbt.hyperparameters"
            why = f"unknown hyperparameter(s) {unknown}: PBT changes {', '.join(changes)}"
        elif r.league:
            why = "roles.league: a league's players and a population cannot share one run"
        elif r.learners < n or r.learners % n:
            why = (
                f"roles.learners ({r.learners}) must be a multiple of it: each member has one "
                "learner, or a DD-PPO group of as many as every other member"
            )
        elif r.actors != "auto" and r.actors < n:
            why = f"roles.actors ({r.actors}) must be at least it: each member needs an actor"
        elif self.pbt.fitness == "training" and r.evaluator:
            why = (
                f"roles.evaluator ({r.evaluator}): with pbt.fitness: training the members are "
                "ranked by their training returns; set roles.evaluator: 0, or pbt.fitness: "
                f"evaluation with roles.evaluator: {n} (one evaluator per member)"
            )
        elif self.pbt.fitness == "evaluation" and r.evaluator != n:
            why = (
                f"roles.evaluator ({r.evaluator}) must equal it with pbt.fitness: evaluation "
                "(evaluator i evaluates member_<i>)"
            )
        elif self.pbt.fitness == "evaluation" and self.evaluator.interval >= (
            self.pbt.ready_interval_s
        ):
            why = (
                f"evaluator.interval ({self.evaluator.interval}) must be below "
                f"pbt.ready_interval_s ({self.pbt.ready_interval_s}): each round ranks "
                "evaluations of the members' newest weights"
            )
        elif not r.pbt:
            why = "set roles.pbt: 1 (the role that ranks the members and exploits)"
        elif self.checkpoint.interval > self.pbt.ready_interval_s:
            why = (
                f"checkpoint.interval ({self.checkpoint.interval}) must be at most "
                f"pbt.ready_interval_s ({self.pbt.ready_interval_s}): an exploit copies the "
                "better member's newest checkpoint"
            )
        if why:
            raise ValueError(f"{key}: {why}")

    def _pbt_bounds_hold(self) -> None:
        """The config's hyperparameters lie in the PBT bounds (after the algorithms'
        sections are in: ``ppo.entropy_coef`` is one of them)."""
        if not self.pbt.members:
            return
        for name, bounds in self.pbt.hyperparameters.items():
            value = self.hyperparameter(name)
            if not bounds.low <= value <= bounds.high:
                raise ValueError(
                    f"pbt.hyperparameters.{name}: the config's {name} ({value}) is outside "
                    f"[{bounds.low}, {bounds.high}]"
                )

    def hyperparameter(self, name: str) -> float:
        """The config's value of a PBT hyperparameter (one of ``Algorithm.population``):
        ``<section>.<field>`` of a common or an algorithm's section."""
        section, field = name.split(".", 1)
        owner = self._algorithm_sections.get(section) or getattr(self, section)
        return float(getattr(owner, field))

    def indices_by_host(self, key: str) -> dict[str | None, list[int]]:
        """The indices of ``roles.<key>`` on each host as ``zrl run`` places them: its own host
        (None) takes the first ones, then each of ``hosts`` in the order listed (indices are
        global per role kind, so seeds and exploration stay distinct)."""
        total = self.roles.count(key)
        placed = [h.roles.get(key, 0) for h in self.hosts]
        out: dict[str | None, list[int]] = {None: list(range(total - sum(placed)))}
        start = total - sum(placed)
        for host, n in zip(self.hosts, placed, strict=True):
            out[host.name] = list(range(start, start + n))
            start += n
        return out

    def beside(self, key: str, index: int, other: str) -> list[int]:
        """The indices of ``roles.<other>`` placed on the host of ``<key>`` number ``index``
        (``indices_by_host``); empty when it has none or ``index`` is not planned."""
        for host, indices in self.indices_by_host(key).items():
            if index in indices:
                return self.indices_by_host(other)[host]
        return []

    # --- learning policies (weights streams) ---------------------------------------------

    @property
    def policies(self) -> list[str]:
        """The learning policies, each a weights stream with its own versions, learners and
        actors: the league's players when it has exploiters, a population's members
        (``pbt.members``), else the one default policy."""
        if self.pbt.members:
            return member_names(self.pbt.members)
        if self.roles.league and (self.league.main_exploiters or self.league.league_exploiters):
            return self.league.players
        return [MAIN]

    def learner_policy(self, index: int) -> str:
        """The policy learner ``index`` trains: in a run with several policies learners
        ``i * k`` .. ``i * k + k - 1`` train policies[i] (``k = learners_per_policy()``: one
        each in a league, DD-PPO groups of k in a population), every learner the default one
        otherwise."""
        policies = self.policies
        if len(policies) == 1:
            return MAIN
        return policies[min(index // self.learners_per_policy(), len(policies) - 1)]

    def learners_per_policy(self) -> int:
        """Learners training each policy together (DD-PPO when more than one)."""
        return max(1, self.roles.learners) // len(self.policies)

    def learner_rank(self, index: int) -> int:
        """Learner ``index``'s place among its policy's learners (0: the group's leader)."""
        return index % self.learners_per_policy()

    def actor_policy(self, index: int) -> str:
        """The policy actor ``index`` acts for: round-robin over the policies. Fixed for the
        actor's life, as each AlphaStar agent has its own actors: an actor's envs, model and
        trajectories all belong to one policy, and its rollouts form that policy's rounds."""
        policies = self.policies
        return policies[index % len(policies)]

    def evaluator_policy(self, index: int) -> str:
        """The policy evaluator ``index`` evaluates: ``member_<index>`` in a population ranked
        by evaluations (``pbt.fitness: evaluation``), else the default one."""
        if self.pbt.members and self.pbt.fitness == "evaluation":
            return member_names(self.pbt.members)[index % self.pbt.members]
        return MAIN

    def policy_actors(self, policy: str) -> int:
        """How many actors act for ``policy`` (a PPO round is one rollout from each)."""
        return sum(
            self.actor_policy(i) == policy for i in range(max(1, self.roles.count("actors")))
        )

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str) -> str:
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(
                f"name {name!r} is not one path component: 1 to 100 letters, digits, '_.+-' "
                "or inner spaces, not starting with '.' or '-' (the run directory is named "
                "after it)"
            )
        return name

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, algo: str) -> str:
        catalog().get(algo)  # ValueError naming the known algorithms
        return algo

    @model_validator(mode="wrap")
    @classmethod
    def _algorithm_sections_and_checks(
        cls, data: Any, handler: ModelWrapValidatorHandler[ExperimentConfig]
    ) -> ExperimentConfig:
        # Defined last, so it wraps every validator above: the algorithm's checks come after
        # the common ones, as they read what those checked. Validating an instance (an
        # assignment) keeps its sections.
        cfg = cls._with_sections(data, handler) if isinstance(data, dict) else handler(data)
        catalog().get(cfg.algo).check(cfg)  # after the sections: the checks read them
        cfg._pbt_bounds_hold()
        return cfg

    @classmethod
    def _with_sections(
        cls, data: dict[str, Any], handler: ModelWrapValidatorHandler[ExperimentConfig]
    ) -> ExperimentConfig:
        """Validate the algorithms' sections of ``data`` with their models and the rest with
        the fields; the errors of both together, located as if the sections were fields."""
        models = catalog().sections()
        clash = models.keys() & cls.model_fields.keys()
        if clash:
            raise ValueError(f"an algorithm defines the config section(s) {sorted(clash)}")
        errors: list[InitErrorDetails] = []
        sections: dict[str, Section] = {}
        for key, model in models.items():
            try:
                sections[key] = model.model_validate(data.get(key, {}))
            except ValidationError as err:
                errors += _located(err, key)
        try:
            cfg = handler({k: v for k, v in data.items() if k not in models})
        except ValidationError as err:
            errors += _located(err)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        cfg._algorithm_sections = sections
        return cfg


def _located(err: ValidationError, *prefix: str) -> list[InitErrorDetails]:
    """The errors of ``err``, their locations under ``prefix``, to raise again together."""
    return [
        InitErrorDetails(
            type=e["type"], loc=(*prefix, *e["loc"]), input=e["input"], ctx=e.get("ctx", {})
        )
        for e in err.errors()
    ]


def config_schema() -> dict[str, Any]:
    """Every top-level key of a config, in the order a dumped config has them, and its type (a
    section model for a section): ``ExperimentConfig``'s fields, and the algorithms' own
    sections after ``learner``."""
    fields = [(k, f.annotation) for k, f in ExperimentConfig.model_fields.items()]
    at = [k for k, _ in fields].index(ALGORITHM_SECTIONS_AFTER) + 1
    return dict([*fields[:at], *catalog().sections().items(), *fields[at:]])


def sections_used(algo: str) -> list[str]:
    """The top-level keys of a config that ``algo`` reads, in schema order."""
    sections = algo_sections()
    specific = {s for used in sections.values() for s in used}
    return [k for k in config_schema() if k not in specific or k in sections.get(algo, ())]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses, while it composes and before anything is built, a
    document of more than ``MAX_CONFIG_VALUES`` values once its aliases are expanded (an alias
    bomb: each value is counted with the size of what it expands to, so this costs one pass),
    nested deeper than ``MAX_CONFIG_DEPTH``, or with an alias inside what it names."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> values it expands to
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                raise ComposerError(
                    problem=f"nested deeper than {MAX_CONFIG_DEPTH} levels", problem_mark=mark
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:
            return None
        if alias:
            if id(node) not in self._expanded:
                raise ComposerError(
                    problem="an alias inside the value it names (a recursive value)",
                    problem_mark=mark,
                )
            return node
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._expanded[id(item)] for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(self._expanded[id(k)] + self._expanded[id(v)] for k, v in node.value)
        if size > MAX_CONFIG_VALUES:
            raise ComposerError(
                problem=f"expands to more than {MAX_CONFIG_VALUES} values (aliases repeat "
                "what they name: an alias bomb?)",
                problem_mark=mark,
            )
        self._expanded[id(node)] = size
        return node


def load_yaml(text: str) -> Any:
    """``text`` as YAML with ``BoundedLoader``; a yaml.YAMLError for anything it refuses."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value parsed as YAML, so types survive)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override {item!r}: value is not valid YAML ({_one_line(exc)})"
        ) from None
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"override {item!r}: {where} is not a section")
            node = child
        node[path[-1]] = value
    return data


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    data = apply_overrides(copy.deepcopy(data), list(overrides or []))
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        algo = data.get("algo")
        algo = algo if algo in catalog().names() else catalog().default()
        why = format_validation_error(err, config_schema(), algo, sections_used(algo))
        raise ConfigError(f"invalid config: {why}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate a YAML config; every failure is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    size = p.stat().st_size
    if size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"{p}: {size} bytes, more than a config may have ({MAX_CONFIG_FILE_BYTES})"
        )
    try:
        data = load_yaml(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    try:
        return config_from_dict(data, overrides)
    except ConfigError as err:
        raise ConfigError(f"{p}: {err}") from None


def machine_size() -> tuple[int, int]:
    """This host's cores (those this process may run on) and memory in bytes."""
    import psutil

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1, int(psutil.virtual_memory().total)


def check_fits_machine(
    cfg: ExperimentConfig, cores: int | None = None, memory_bytes: int | None = None
) -> None:
    """ConfigError naming the key, its value and the bound unless the roles this host runs (the
    config's roles less those ``hosts`` places elsewhere) fit its cores and memory (default:
    ``machine_size()``): ``ROLES_PER_CORE`` role processes per core, each of at least
    ``ROLE_PROCESS_BYTES``; ``ENVS_PER_CORE`` envs per core over its actors; its replay shards'
    ``replay.capacity_bytes`` within its memory. Made where a config is started (``zrl run``,
    ``zrl start broker``, ``zrl config check``), not by roles validating the broker's spec."""
    if cores is None or memory_bytes is None:
        measured = machine_size()
        cores, memory_bytes = cores or measured[0], memory_bytes or measured[1]
    local = {
        key: cfg.roles.count(key) - sum(h.roles.get(key, 0) for h in cfg.hosts)
        for key in ROLE_COUNT_KEYS
    }
    machine = f"this host's {cores} cores and {memory_bytes / 2**30:.1f} GiB"
    processes = sum(local.values())
    most = min(ROLES_PER_CORE * cores, memory_bytes // ROLE_PROCESS_BYTES)
    if processes > most:
        counts = ", ".join(f"roles.{k}: {n}" for k, n in local.items() if n)
        raise ConfigError(
            f"{processes} role processes on this host ({counts}) exceed {most}, what "
            f"{machine} run ({ROLES_PER_CORE} per core, {ROLE_PROCESS_BYTES // 2**20} MiB each)"
        )
    envs = cfg.env.num_envs * local["actors"]
    if envs > ENVS_PER_CORE * cores:
        raise ConfigError(
            f"env.num_envs: {cfg.env.num_envs} x {local['actors']} actors on this host = {envs} "
            f"envs exceed {ENVS_PER_CORE * cores} ({ENVS_PER_CORE} per core of {machine})"
        )
    capacity_bytes = cfg.replay.capacity_bytes
    if capacity_bytes is not None and capacity_bytes * local["replay"] > memory_bytes:
        raise ConfigError(
            f"replay.capacity_bytes: {capacity_bytes} x {local['replay']} replay shards on this "
            f"host exceed the memory of {machine} ({memory_bytes} bytes)"
        )


def config_to_yaml(cfg: ExperimentConfig, all_sections: bool = True) -> str:
    """The config as YAML; without ``all_sections`` only what its ``algo`` uses, and a last
    comment line naming the sections left out."""
    data = cfg.model_dump(mode="json")
    if all_sections:
        return yaml.safe_dump(data, sort_keys=False)
    used = sections_used(cfg.algo)
    text = yaml.safe_dump({k: v for k, v in data.items() if k in used}, sort_keys=False)
    unused = [k for k in data if k not in used]
    if unused:
        text += f"# not used by {cfg.algo}: {', '.join(unused)} (--all shows them)\n"
    return text


__all__ = [
    "BoundedLoader",
    "ConfigError",
    "ExperimentConfig",
    "algo_sections",
    "apply_overrides",
    "check_fits_machine",
    "config_from_dict",
    "config_schema",
    "config_to_yaml",
    "load_config",
    "load_yaml",
    "machine_size",
    "parse_override",
    "sections_used",
]
