"""Experiment configuration: typed schema, YAML loading, ``--set`` overrides.

A config is one YAML file; every role receives the whole resolved config from
the broker (the experiment spec) and reads its own section. Validation is done
by pydantic with ``extra="forbid"``, so a typo is an error naming the key path,
never a silently ignored setting.

The sections only one algorithm reads are defined in its package
(``zrl/algos/<name>/config.py``) and named by its ``Algorithm.config``: ``ExperimentConfig``
validates them under their YAML keys beside its own fields, from the registry, so adding an
algorithm adds nothing here; the algorithm reads its section with ``cfg.section(PPOConfig)``.
The did-you-mean help for a config that does not validate is ``zrl.config_help``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, TypeVar

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

from zrl.algos import algorithm_names, algorithm_sections, get_algorithm
from zrl.config_base import Section
from zrl.config_help import format_validation_error
from zrl.league.config import MAIN, LeagueConfig
from zrl.multiagent.config import MultiAgentConfig, is_multiagent

DEFAULT_STREAMS = ("experience", "batches", "priorities", "gradients")


ALGORITHM_SECTIONS_AFTER = "learner"
"""The algorithms' own sections stand after this one in a dumped config (``zrl config show``)."""

S = TypeVar("S", bound=Section)


def algo_sections() -> dict[str, tuple[str, ...]]:
    """The algorithm-specific sections each ``algo`` reads (the keys are the algorithms); every
    other section applies to all of them. ``zrl config show`` prints only what ``algo`` uses."""
    return {name: get_algorithm(name).reads for name in algorithm_names()}


class ConfigError(ValueError):
    """A config that cannot be loaded or does not validate; the message is user-facing."""


class AtariConfig(Section):
    """Preprocessing of Atari envs (ALE/<Game>-v5, <Game>NoFrameskip-v4); others ignore it."""

    noop_max: int = Field(30, ge=0)
    """Up to this many no-op frames after each reset, at random (0: none)."""
    frameskip: int = Field(4, ge=1)
    """Emulator frames per env step (the action repeats; the last two frames are max-pooled)."""
    episodic_life: bool = True
    """Training only: a lost life ends the episode (the evaluator always plays whole games)."""
    fire_reset: bool = True
    """Press FIRE after each reset in games that have it (Breakout, ...) so play starts."""
    clip_rewards: bool = True
    """Training only: rewards clipped to [-1, 1] (the evaluator reports true game scores)."""
    screen_size: int = Field(84, ge=8, le=210)
    """Frames resized to screen_size x screen_size."""
    grayscale: bool = True
    """Grey frames (one channel); false: RGB (a trailing channel axis of 3)."""
    stack: int = Field(4, ge=1, le=32)
    """Newest frames stacked on a leading axis, oldest first (zeros after a reset)."""
    repeat_action_probability: float = Field(0.0, ge=0, lt=1)
    """Sticky actions: the chance each frame repeats the previous action (0: NoFrameskip-v4's)."""
    max_episode_frames: int = Field(108_000, ge=1)
    """Emulator frames after which an episode is truncated (108000 = 30 minutes at 60 fps)."""
    num_threads: int = Field(0, ge=0)
    """Threads of ale-py's AtariVectorEnv (vectorization auto/native); 0: its default."""


class EnvConfig(Section):
    id: str = "CartPole-v1"
    """gymnasium environment id, or a PettingZoo env: ``pettingzoo/<name>`` (the classic
    games, ...) or ``mpe2/<name>`` (see ``multiagent``)."""
    num_envs: int = Field(16, ge=1)
    """Environments stepped together by one actor (one batched forward pass per step)."""
    vectorization: Literal["auto", "native", "sync", "async", "envpool"] = "auto"
    """auto: the env's native vectorized form where it has one, else sync (Atari: ale-py's
    AtariVectorEnv; sync/async: gymnasium wrappers; envpool: Atari in envpool)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make (Atari auto/native: for AtariVectorEnv)."""
    atari: AtariConfig = Field(default_factory=AtariConfig)
    """Atari preprocessing (ignored by other envs)."""
    multiagent: MultiAgentConfig = Field(default_factory=MultiAgentConfig)
    """PettingZoo envs (``pettingzoo/<name>``, ``mpe2/<name>``): which policy plays each agent
    (ignored by other envs)."""


class ModelConfig(Section):
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    """Hidden layer sizes of the MLP torso."""
    dueling: bool = True
    """Dueling value/advantage heads (Q-networks)."""
    activation: Literal["relu", "tanh"] = "relu"
    """Hidden-layer activation of the actor-critic networks (impala, appo, a3c, ppo)."""
    encoder: Literal["auto", "nature_cnn", "impala_resnet", "mlp"] = "auto"
    """Observation encoder of the discrete-action models: auto is nature_cnn for [C, H, W]
    image observations (uint8 pixels are scaled to [0, 1] in the model) and the hidden MLP
    otherwise; impala_resnet is the IMPALA deep ResNet. The CNNs ignore hidden."""
    core: Literal["none", "lstm", "gru"] = "none"
    """A recurrent core after the encoder (r2d2, and the recurrent actor-critic of ppo, impala
    and appo): its state is carried per env by the actors, sent with every sequence or unroll
    and replayed by the learners. r2d2 always has one (an lstm when this is none)."""
    core_size: int = Field(128, ge=1)
    """Units of the LSTM/GRU core."""


class BrokerConfig(Section):
    host: str = "127.0.0.1"
    """Address `zrl run` binds the broker on; 0.0.0.0 (or a LAN address) when hosts join."""
    advertise: str | None = None
    """The broker address other hosts connect to (default: host, or this machine's address)."""
    heartbeat_interval: float = Field(0.5, gt=0)
    """Seconds between a role's heartbeats."""
    heartbeat_timeout: float = Field(3.0, gt=0)
    """A role silent this long is marked dead."""
    setup_grace: float = Field(60.0, gt=0)
    """Seconds a role may take between HELLO and its first heartbeat (imports, envs, models)."""
    wait_for_roles: float | None = Field(300.0, gt=0)
    """Seconds the head waits for the roles placed on other hosts (`hosts`, or every role of
    `zrl start broker --run-dir`) to register; past it the run fails, naming them. null: wait
    for ever."""
    streams: list[str] = Field(default_factory=lambda: list(DEFAULT_STREAMS))
    """Named PUSH/PULL streams the broker runs a device for."""
    stream_hwm: int = Field(4, ge=1)
    """High-water mark (messages) of each side of a stream device. Small on purpose: deep
    queues only make the data a learner sees older."""
    stream_buffer_bytes: int = Field(256 * 1024, ge=4096)
    """Kernel socket buffer (SO_SNDBUF/SO_RCVBUF) of stream sockets, bounding hidden queues."""
    ipc: bool = True
    """A tcp broker also listens on ipc:// (a private directory under the temp directory), and
    roles on its machine connect there instead of through the loopback TCP stack."""
    max_message_bytes: int = Field(256 * 2**20, ge=1024)
    """Largest message any socket accepts (ZMQ_MAXMSGSIZE); libzmq disconnects a peer that sends more."""
    small_topic_message_bytes: int = Field(64 * 1024, ge=1024)
    """Topic messages up to this size (acks, priorities, metrics, eval) go out on the topic
    bus's small lane, which queues `topic_hwm` of them per subscriber: bursts of thousands
    pass. Bigger ones (weights, rollouts) take the bulk lane."""
    topic_hwm: int = Field(1000, ge=1)
    """Small-lane messages the topic bus queues per subscriber before it drops for that one."""
    max_topic_message_bytes: int = Field(16 * 2**20, ge=1024)
    """Largest message on the topic bus (capped at max_message_bytes); the broker drops bigger
    ones. 16 MiB holds an Atari CNN's weights (about 7 MB)."""
    bulk_topic_hwm: int = Field(8, ge=1)
    """Bulk-lane messages the topic bus queues per subscriber. A subscriber that never reads
    costs the broker at most topic_hwm x small_topic_message_bytes + bulk_topic_hwm x
    max_topic_message_bytes + 2 x topic_buffer_bytes (64 MiB + 128 MiB + 2 MiB by default),
    whatever is published. Only the newest weights matter to a follower, so dropping old ones
    at a slow subscriber loses nothing it needs."""
    topic_buffer_bytes: int = Field(2**20, ge=4096)
    """Kernel socket buffer (SO_SNDBUF/SO_RCVBUF) of the topic bus sockets."""
    max_roles: int = Field(2048, ge=1)
    """Registry entries at most (live, dead and stopped); a HELLO beyond them is refused."""
    max_info_bytes: int = Field(8192, ge=256)
    """Largest heartbeat `info` (msgpack bytes) the registry stores; a bigger one is dropped
    and counted, and the role keeps its previous info."""
    forget_after: float = Field(300.0, gt=0)
    """Seconds a dead or stopped role stays in the registry before it is forgotten."""


class RolesConfig(Section):
    actors: int = Field(2, ge=0)
    replay: int = Field(1, ge=0)
    params: int = Field(1, ge=0, le=1)
    learners: int = Field(1, ge=0)
    evaluator: int = Field(1, ge=0, le=1)
    league: int = Field(0, ge=0, le=1)
    """1: a league role picks the opponents of multi-agent games and snapshots the learning
    policy (see ``league:``); 0: ``env.multiagent.opponent`` plays them."""


ROLE_COUNT_KEYS = ("actors", "replay", "params", "learners", "evaluator", "league")


class HostConfig(Section):
    """Roles that run on another host, started there with `zrl start` (zrl run prints how)."""

    name: str
    """A label for the host (shown in zrl run's instructions)."""
    address: str | None = None
    """How this host reaches the broker's host, if not the broker's advertised address."""
    roles: dict[str, int] = Field(default_factory=dict)
    """Role counts placed on this host, e.g. {actors: 4, replay: 1}."""

    @model_validator(mode="after")
    def _known_roles(self) -> HostConfig:
        for key, count in self.roles.items():
            if key not in ROLE_COUNT_KEYS:
                raise ValueError(f"unknown role {key!r} (roles are {', '.join(ROLE_COUNT_KEYS)})")
            if count < 0:
                raise ValueError(f"{key}: count must be >= 0, got {count}")
        return self


class ActorConfig(Section):
    trajectory_length: int = Field(32, ge=1)
    """Steps per env in one pushed trajectory."""
    epsilon: float = Field(0.4, ge=0, le=1)
    """Ape-X base epsilon: slot i of N explores with epsilon ** (1 + alpha * i / (N - 1))."""
    epsilon_alpha: float = Field(7.0, ge=0)
    """Ape-X epsilon exponent spread."""
    max_in_flight: int = Field(2, ge=1)
    """Trajectories sent but not yet acknowledged by a replay shard; bounds data staleness."""
    random_policy: bool = False
    """Uniform random actions without the model (impala, appo): measures the pipeline without
    inference (benchmarks/atari.py section c)."""
    torch_threads: int = Field(1, ge=1)
    env_groups: int = Field(1, ge=1)
    """2: double-buffered sampling, the envs as two vector envs of env.num_envs / 2 each; the
    actor computes one group's actions while the other steps (Atari: ale-py's threads)."""


class ReplayConfig(Section):
    table: Literal["uniform", "prioritized", "fifo"] = "prioritized"
    capacity: int = Field(100_000, ge=1)
    """Items per replay shard; the oldest is evicted first."""
    capacity_bytes: int | None = Field(None, ge=1)
    """Also cap a shard by memory: capacity = min(capacity, capacity_bytes / item size)."""
    alpha: float = Field(0.6, ge=0)
    """Priority exponent (prioritized table)."""
    beta: float = Field(0.4, ge=0, le=1)
    """Importance-sampling exponent (prioritized table)."""
    n_step: int = Field(3, ge=1)
    gamma: float = Field(0.99, ge=0, le=1)
    batch_size: int = Field(64, ge=1)
    min_size: int = Field(1000, ge=1)
    """Items a shard must hold before it samples."""
    samples_per_insert: float = Field(8.0, ge=0)
    """Target sampled items per inserted item (0 disables the ratio limit)."""
    samples_per_insert_tolerance: float = Field(4096.0, ge=0)
    """Error buffer of the ratio, in sampled items (Reverb's error_buffer)."""
    prefetch: int = Field(4, ge=1)
    """Sampled batches queued ahead of the learners (send high-water mark)."""


class LearnerConfig(Section):
    lr: float = Field(1e-3, gt=0)
    double: bool = True
    target_update_interval: int = Field(500, ge=1)
    """Updates between hard target-network copies."""
    grad_clip: float = Field(10.0, gt=0)
    huber_delta: float = Field(1.0, gt=0)
    publish_interval: int = Field(20, ge=1)
    """Updates between sending weights to the parameter server."""
    torch_threads: int = Field(1, ge=1)
    """Threads torch may use in the learner (the actors have actor.torch_threads): keep the
    sum over a host's roles at most its cores, or they fight."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    """auto (a GPU if torch sees one, else cpu), cpu, cuda or cuda:N. On a GPU, batches are
    copied from pinned host memory without blocking, the next one while the current trains."""


class EvaluatorConfig(Section):
    interval: float = Field(5.0, gt=0)
    """Seconds between evaluations (only when a new weights version exists)."""
    episodes: int = Field(20, ge=1)


class CheckpointConfig(Section):
    dir: str | None = None
    """Where the learner and replay shards save and resume from (`zrl run` sets RUN_DIR/checkpoints)."""
    interval: float = Field(30.0, gt=0)
    """Seconds between checkpoints (written atomically: write, then rename)."""
    replay: bool = True
    """Also snapshot the replay tables (items, priorities, order, rate limiter)."""


class LimitsConfig(Section):
    memory_mb: float | None = Field(None, gt=0)
    """A role whose resident memory passes this stops with a clear message (per process)."""


class LoggingConfig(Section):
    backends: list[Literal["tensorboard", "csv", "wandb", "mlflow"]] = ["tensorboard", "csv"]
    """Where `zrl run` writes its scalars. The CSV files are always written (resume and
    `zrl plot` read them); wandb and mlflow need `pip install "zrl[wandb]"` / `"zrl[mlflow]"`."""
    project: str = "zrl"
    """The W&B project and the MLflow experiment."""
    run_name: str | None = None
    """The W&B / MLflow run name (default: the run directory's name)."""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """offline: RUN_DIR/wandb, upload later with `wandb sync`; online needs `wandb login`."""
    wandb_entity: str | None = None
    tracking_uri: str | None = None
    """MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the file store RUN_DIR/mlruns)."""


class StopConfig(Section):
    eval_return: float | None = 475.0
    """Stop when the evaluations reach this mean return, as `confirm` says."""
    confirm: Literal["window", "fresh"] = "window"
    """window: the mean of the last `eval_window` evaluations reaches eval_return. fresh: an
    evaluation reaches it, then the evaluator at once plays `eval_episodes` new episodes with
    the same weights, and their mean reaches it too. One lucky evaluation stops neither."""
    eval_window: int = Field(3, ge=1)
    """Evaluations averaged by confirm: window (1: any single evaluation stops the run)."""
    eval_episodes: int = Field(100, ge=1)
    """Episodes of the confirming evaluation of confirm: fresh (on seeds no evaluation used)."""
    env_steps: int | None = Field(None, ge=1)
    wall_time: float | None = Field(600.0, gt=0)
    """Seconds."""

    @model_validator(mode="after")
    def _some_condition(self) -> StopConfig:
        if self.eval_return is None and self.env_steps is None and self.wall_time is None:
            raise ValueError("at least one of eval_return, env_steps, wall_time must be set")
        return self


class ExperimentConfig(Section):
    name: str = "experiment"
    algo: str = "apex_dqn"
    """One of ``zrl.algos.ALGORITHMS`` (or an algorithm a script registered)."""
    seed: int = 0
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    roles: RolesConfig = Field(default_factory=RolesConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    # Here, in a dumped config: the algorithms' own sections (``section``).
    league: LeagueConfig = Field(default_factory=LeagueConfig)
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    hosts: list[HostConfig] = Field(default_factory=list)
    """Placement: roles on other hosts; the rest of `roles` runs where `zrl run` runs."""
    _algorithm_sections: dict[str, Section] = PrivateAttr(default_factory=dict)
    """Every section of ``zrl.algos.algorithm_sections()``, by YAML key (defaults where the
    config has none), whichever algorithm runs: ``--all`` shows them, a config keeps them."""

    def section(self, model: type[S]) -> S:
        """The algorithm config section of class ``model``: ``cfg.section(PPOConfig).clip``."""
        for section in self._algorithm_sections.values():
            if isinstance(section, model):
                return section
        raise KeyError(f"no algorithm this process knows defines the section {model.__name__}")

    @model_validator(mode="wrap")
    @classmethod
    def _algorithm_sections_and_checks(
        cls, data: Any, handler: ModelWrapValidatorHandler[ExperimentConfig]
    ) -> ExperimentConfig:
        # Validating an instance (an assignment) keeps its sections.
        cfg = cls._with_sections(data, handler) if isinstance(data, dict) else handler(data)
        get_algorithm(cfg.algo).check(cfg)  # after the sections: the checks read them
        return cfg

    @classmethod
    def _with_sections(
        cls, data: dict[str, Any], handler: ModelWrapValidatorHandler[ExperimentConfig]
    ) -> ExperimentConfig:
        """Validate the algorithms' sections of ``data`` with their models and the rest with
        the fields; the errors of both together, located as if the sections were fields."""
        models = algorithm_sections()
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

    @model_serializer(mode="wrap")
    def _dump_algorithm_sections(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        sections = {k: s.model_dump(mode=info.mode) for k, s in self._algorithm_sections.items()}
        at = list(data).index(ALGORITHM_SECTIONS_AFTER) + 1
        items = list(data.items())
        return dict([*items[:at], *sections.items(), *items[at:]])

    @model_validator(mode="after")
    def _placement_fits(self) -> ExperimentConfig:
        for key in ROLE_COUNT_KEYS:
            placed = sum(h.roles.get(key, 0) for h in self.hosts)
            total = getattr(self.roles, key)
            if placed > total:
                raise ValueError(f"hosts place {placed} {key} but roles.{key} is {total}")
        return self

    @model_validator(mode="after")
    def _env_groups_divide(self) -> ExperimentConfig:
        if self.env.num_envs % self.actor.env_groups:
            raise ValueError(
                f"env.num_envs ({self.env.num_envs}) must be a multiple of actor.env_groups "
                f"({self.actor.env_groups})"
            )
        return self

    @model_validator(mode="after")
    def _multiagent_fits(self) -> ExperimentConfig:
        multiagent = is_multiagent(self.env.id)
        if multiagent and self.actor.env_groups > 1:
            raise ValueError(
                f"actor.env_groups: {self.actor.env_groups}: a PettingZoo env steps its games "
                "in one process; set actor.env_groups: 1"
            )
        if self.roles.league and not multiagent:
            raise ValueError(
                f"roles.league: the league picks opponents in multi-agent envs "
                f"(pettingzoo/<game>), not in {self.env.id!r}"
            )
        return self

    @model_validator(mode="after")
    def _exploiters_fit(self) -> ExperimentConfig:
        lc, r = self.league, self.roles
        if not lc.main_exploiters and not lc.league_exploiters:
            return self
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
        if r.actors < players:
            raise ValueError(
                f"roles.actors ({r.actors}) must be at least 1 + {keys} = {players}: each "
                "learning player needs an actor"
            )
        wiring = get_algorithm(self.algo).wiring
        if wiring.learner_input != "rollouts":
            # A replay shard's table holds one policy's experience, so its batches could
            # not tell the learners apart.
            raise ValueError(
                f"{keys}: algo {self.algo!r} sends experience through replay, which carries "
                "one policy; exploiters need an algorithm whose actors publish rollouts to "
                "the learners (ppo)"
            )
        return self

    # --- learning policies (weights streams) ---------------------------------------------

    @property
    def policies(self) -> list[str]:
        """The learning policies, each a weights stream with its own versions, learners and
        actors: the league's players when it has exploiters, else the one default policy."""
        if self.roles.league and (self.league.main_exploiters or self.league.league_exploiters):
            return self.league.players
        return [MAIN]

    def learner_policy(self, index: int) -> str:
        """The policy learner ``index`` trains: learner i trains policies[i] in a run with
        several (one learner each), every learner the default one otherwise (DD-PPO)."""
        policies = self.policies
        return policies[index] if len(policies) > 1 else MAIN

    def learners_per_policy(self) -> int:
        """Learners training each policy together (DD-PPO when more than one)."""
        return max(1, self.roles.learners) // len(self.policies)

    def learner_rank(self, index: int) -> int:
        """Learner ``index``'s place among its policy's learners (0: the DD-PPO leader)."""
        return index if len(self.policies) == 1 else 0

    def actor_policy(self, index: int) -> str:
        """The policy actor ``index`` acts for: round-robin over the policies. Fixed for the
        actor's life, as each AlphaStar agent has its own actors: an actor's envs, model and
        trajectories all belong to one policy, and its rollouts form that policy's rounds."""
        policies = self.policies
        return policies[index % len(policies)]

    def policy_actors(self, policy: str) -> int:
        """How many actors act for ``policy`` (a PPO round is one rollout from each)."""
        return sum(self.actor_policy(i) == policy for i in range(max(1, self.roles.actors)))

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, algo: str) -> str:
        get_algorithm(algo)  # ValueError naming the known algorithms
        return algo


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
    return dict([*fields[:at], *algorithm_sections().items(), *fields[at:]])


def sections_used(algo: str) -> list[str]:
    """The top-level keys of a config that ``algo`` reads, in schema order."""
    sections = algo_sections()
    specific = {s for used in sections.values() for s in used}
    return [
        k for k in config_schema()
        if k not in specific or k in sections.get(algo, ())
    ]  # fmt: skip


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value parsed as YAML, so types survive)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
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
        algo = algo if algo in algorithm_names() else "apex_dqn"
        why = format_validation_error(err, config_schema(), algo, sections_used(algo))
        raise ConfigError(f"invalid config: {why}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate a YAML config; every failure is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(data).__name__}")
    try:
        return config_from_dict(data, overrides)
    except ConfigError as err:
        raise ConfigError(f"{p}: {err}") from None


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
