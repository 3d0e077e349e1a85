"""Experiment configuration: typed schema, YAML loading, ``--set`` overrides.

A config is one YAML file; every role receives the whole resolved config from
the broker (the experiment spec) and reads its own section. Validation is done
by pydantic with ``extra="forbid"``, so a typo is an error naming the key path,
never a silently ignored setting.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from zrl.algos import algorithm_names, get_algorithm

DEFAULT_STREAMS = ("experience", "batches", "priorities", "gradients")


def algo_sections() -> dict[str, tuple[str, ...]]:
    """The algorithm-specific sections each ``algo`` reads (the keys are the algorithms); every
    other section applies to all of them. ``zrl config show`` prints only what ``algo`` uses."""
    return {name: get_algorithm(name).sections for name in algorithm_names()}


class ConfigError(ValueError):
    """A config that cannot be loaded or does not validate; the message is user-facing."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EnvConfig(_Section):
    id: str = "CartPole-v1"
    """gymnasium environment id."""
    num_envs: int = Field(16, ge=1)
    """Environments stepped together by one actor (one batched forward pass per step)."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """auto: the env's native vectorized form where it has one, else sync."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make."""


class ModelConfig(_Section):
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    """Hidden layer sizes of the MLP torso."""
    dueling: bool = True
    """Dueling value/advantage heads (Q-networks)."""
    activation: Literal["relu", "tanh"] = "relu"
    """Hidden-layer activation of the actor-critic networks (impala, a3c, ppo)."""


class BrokerConfig(_Section):
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
    streams: list[str] = Field(default_factory=lambda: list(DEFAULT_STREAMS))
    """Named PUSH/PULL streams the broker runs a device for."""
    stream_hwm: int = Field(4, ge=1)
    """High-water mark (messages) of each side of a stream device. Small on purpose: deep
    queues only make the data a learner sees older."""
    stream_buffer_bytes: int = Field(256 * 1024, ge=4096)
    """Kernel socket buffer (SO_SNDBUF/SO_RCVBUF) of stream sockets, bounding hidden queues."""
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


class RolesConfig(_Section):
    actors: int = Field(2, ge=0)
    replay: int = Field(1, ge=0)
    params: int = Field(1, ge=0, le=1)
    learners: int = Field(1, ge=0)
    evaluator: int = Field(1, ge=0, le=1)


ROLE_COUNT_KEYS = ("actors", "replay", "params", "learners", "evaluator")


class HostConfig(_Section):
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


class ActorConfig(_Section):
    trajectory_length: int = Field(32, ge=1)
    """Steps per env in one pushed trajectory."""
    epsilon: float = Field(0.4, ge=0, le=1)
    """Ape-X base epsilon: slot i of N explores with epsilon ** (1 + alpha * i / (N - 1))."""
    epsilon_alpha: float = Field(7.0, ge=0)
    """Ape-X epsilon exponent spread."""
    max_in_flight: int = Field(2, ge=1)
    """Trajectories sent but not yet acknowledged by a replay shard; bounds data staleness."""
    torch_threads: int = Field(1, ge=1)


class ReplayConfig(_Section):
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


class LearnerConfig(_Section):
    lr: float = Field(1e-3, gt=0)
    double: bool = True
    target_update_interval: int = Field(500, ge=1)
    """Updates between hard target-network copies."""
    grad_clip: float = Field(10.0, gt=0)
    huber_delta: float = Field(1.0, gt=0)
    publish_interval: int = Field(20, ge=1)
    """Updates between sending weights to the parameter server."""
    torch_threads: int = Field(1, ge=1)


class ImpalaConfig(_Section):
    """IMPALA (Espeholt et al. 2018): unrolls through a FIFO replay table, V-trace learner."""

    gamma: float = Field(0.99, ge=0, le=1)
    rho_bar: float = Field(1.0, gt=0)
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = Field(1.0, gt=0)
    """Clip of the trace-cutting coefficients."""
    vtrace_lambda: float = Field(1.0, ge=0, le=1)
    """Scales the traces, c_t = lambda * min(c_bar, ratio): below 1 the targets are
    lambda-returns (less variance, more bias), as GAE's lambda."""
    entropy_coef: float = Field(0.01, ge=0)
    value_coef: float = Field(0.5, ge=0)
    max_lag: int = Field(20, ge=0)
    """Unrolls collected with weights more than this many versions behind the learner's are
    dropped and counted (status: stale_unrolls), never used."""
    epochs: int = Field(1, ge=1)
    """V-trace updates on each batch (RLlib's and Sample Factory's num_epochs): 1 is the
    paper's IMPALA; more train on each unroll again, V-trace correcting for the policy having
    moved, so actors spend less CPU per update."""


class PPOConfig(_Section):
    """PPO (Schulman et al. 2017) over rounds of rollouts, optionally DD-PPO across learners."""

    mode: Literal["sync", "async"] = "sync"
    """sync: every rollout of a round was collected with the weights version the round trains;
    actors wait for each new version. async: actors keep collecting, rollouts up to max_lag
    versions old are used, older ones dropped and counted."""
    max_lag: int = Field(1, ge=0)
    """async only: the oldest usable rollout, in weights versions behind the learner."""
    gamma: float = Field(0.98, ge=0, le=1)
    gae_lambda: float = Field(0.8, ge=0, le=1)
    clip: float = Field(0.2, gt=0)
    value_clip: float | None = Field(None, gt=0)
    """PPO2 value clipping range; null disables it."""
    epochs: int = Field(20, ge=1)
    minibatch_size: int = Field(256, ge=1)
    """Samples per gradient step, split evenly across the learners (DD-PPO)."""
    entropy_coef: float = Field(0.0, ge=0)
    value_coef: float = Field(0.5, ge=0)
    normalize_advantages: bool = True
    round_timeout: float = Field(30.0, gt=0)
    """Seconds a learner waits for a full round (one rollout per actor) before training on
    the rollouts it has (a dead actor must not stop training); counted as short rounds."""


class A3CConfig(_Section):
    """A3C (Mnih et al. 2016): workers push gradients, the parameter server applies them."""

    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(1.0, ge=0, le=1)
    """1.0 gives A3C's n-step returns; lower values use GAE."""
    entropy_coef: float = Field(0.01, ge=0)
    value_coef: float = Field(0.5, ge=0)
    lr: float = Field(1e-3, gt=0)
    """Learning rate of the parameter server's optimizer."""
    grad_clip: float = Field(0.5, gt=0)
    """Global L2 norm the combined gradient is clipped to before each step."""
    reduce: Literal["sum", "mean"] = "mean"
    """How the parameter server combines the gradients of one update."""
    gradients_per_update: int = Field(1, ge=1)
    """Gradients (from any workers) combined into one optimizer step."""
    max_lag: int = Field(8, ge=0)
    """Gradients computed on weights more than this many versions old are dropped and counted."""


class DDPGConfig(_Section):
    """Ape-X DDPG (Horgan et al. 2018), with TD3's tricks (Fujimoto et al. 2018) as options.

    n-step, gamma, batch size and the replay table come from ``replay:``; ``learner.grad_clip``
    and ``learner.publish_interval`` apply as for DQN."""

    noise_sigma: float = Field(0.3, ge=0)
    """Largest std of the actors' Gaussian exploration noise, as a fraction of the action
    half-range ``(high - low) / 2``. Env slot k of all N = actors x envs slots uses the Ape-X
    spread ``noise_sigma ** (1 + noise_alpha * k / (N - 1))`` (as ``actor.epsilon``), so some
    slots explore widely and others stay close to the deterministic policy."""
    noise_alpha: float = Field(2.0, ge=0)
    """Spread exponent of the per-slot noise (0: every slot uses noise_sigma)."""
    twin: bool = False
    """TD3 clipped double-Q: a second critic, targets use min(Q'1, Q'2)."""
    target_noise: float = Field(0.0, ge=0)
    """TD3 target policy smoothing: std of the noise added to mu'(s'), as a fraction of the
    half-range (TD3 uses 0.2); 0 disables it."""
    target_noise_clip: float = Field(0.5, ge=0)
    """The smoothing noise is clipped to +- this fraction of the half-range."""
    policy_delay: int = Field(1, ge=1)
    """Update the actor and the targets every this many critic updates (TD3 uses 2)."""
    tau: float = Field(0.005, gt=0, le=1)
    """Polyak rate of the target networks (1 = hard copy every update)."""
    actor_lr: float = Field(1e-3, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    huber_delta: float | None = Field(None, gt=0)
    """Huber loss of the critics with this delta; null: squared error."""
    warmup_steps: int = Field(1000, ge=0)
    """Env steps (per actor, over all its envs) of uniform random actions before the policy acts."""


class SACConfig(_Section):
    """Soft actor-critic (Haarnoja et al. 2018) with the automatic entropy temperature.

    Uniform or prioritized replay (``replay.table``); n-step, gamma and the batch size come
    from ``replay:``."""

    actor_lr: float = Field(1e-3, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    alpha_lr: float = Field(1e-3, gt=0)
    """Learning rate of log(alpha)."""
    tau: float = Field(0.005, gt=0, le=1)
    """Polyak rate of the target critics."""
    init_alpha: float = Field(1.0, gt=0)
    """Initial temperature (SB3's ent_coef 'auto' starts at 1)."""
    target_entropy: float | None = None
    """Entropy the temperature steers the policy towards; null: -act_dim."""
    fixed_alpha: float | None = Field(None, ge=0)
    """A constant temperature instead of the automatic one."""
    warmup_steps: int = Field(1000, ge=0)
    """Env steps (per actor, over all its envs) of uniform random actions before the policy acts."""


class EvaluatorConfig(_Section):
    interval: float = Field(5.0, gt=0)
    """Seconds between evaluations (only when a new weights version exists)."""
    episodes: int = Field(20, ge=1)


class CheckpointConfig(_Section):
    dir: str | None = None
    """Where the learner and replay shards save and resume from (`zrl run` sets RUN_DIR/checkpoints)."""
    interval: float = Field(30.0, gt=0)
    """Seconds between checkpoints (written atomically: write, then rename)."""
    replay: bool = True
    """Also snapshot the replay tables (items, priorities, order, rate limiter)."""


class LimitsConfig(_Section):
    memory_mb: float | None = Field(None, gt=0)
    """A role whose resident memory passes this stops with a clear message (per process)."""


class LoggingConfig(_Section):
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


class StopConfig(_Section):
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


class ExperimentConfig(_Section):
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
    impala: ImpalaConfig = Field(default_factory=ImpalaConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    a3c: A3CConfig = Field(default_factory=A3CConfig)
    ddpg: DDPGConfig = Field(default_factory=DDPGConfig)
    sac: SACConfig = Field(default_factory=SACConfig)
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    hosts: list[HostConfig] = Field(default_factory=list)
    """Placement: roles on other hosts; the rest of `roles` runs where `zrl run` runs."""

    @model_validator(mode="after")
    def _placement_fits(self) -> ExperimentConfig:
        for key in ROLE_COUNT_KEYS:
            placed = sum(h.roles.get(key, 0) for h in self.hosts)
            total = getattr(self.roles, key)
            if placed > total:
                raise ValueError(f"hosts place {placed} {key} but roles.{key} is {total}")
        return self

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, algo: str) -> str:
        get_algorithm(algo)  # ValueError naming the known algorithms
        return algo

    @model_validator(mode="after")
    def _roles_fit_algo(self) -> ExperimentConfig:
        check = get_algorithm(self.algo).check_config
        if check is not None:
            check(self)
        return self


def sections_used(algo: str) -> list[str]:
    """The top-level keys of a config that ``algo`` reads, in schema order."""
    sections = algo_sections()
    specific = {s for used in sections.values() for s in used}
    return [
        k for k in ExperimentConfig.model_fields
        if k not in specific or k in sections.get(algo, ())
    ]  # fmt: skip


# What users of SB3, CleanRL, RLlib and Sample Factory call zrl's keys: an unknown key with
# one of these names is suggested the zrl key, per algo ("*": any algo). Spelling mistakes of
# zrl's own names need no entry: they are found by closeness to the schema.
_ON_POLICY_ROLLOUT = {a: "actor.trajectory_length" for a in ("impala", "ppo", "a3c")}
_OFF_POLICY_N_STEP = {a: "replay.n_step" for a in ("apex_dqn", "apex_ddpg", "sac")}
_REPLAY_ALGOS = ("apex_dqn", "impala", "apex_ddpg", "sac")
_LR = {
    "apex_dqn": "learner.lr", "impala": "learner.lr", "ppo": "learner.lr", "a3c": "a3c.lr",
    "apex_ddpg": "ddpg.actor_lr or ddpg.critic_lr", "sac": "sac.actor_lr or sac.critic_lr",
}  # fmt: skip
_GAMMA = {"impala": "impala.gamma", "ppo": "ppo.gamma", "a3c": "a3c.gamma", "*": "replay.gamma"}
_ENTROPY = {"impala": "impala.entropy_coef", "a3c": "a3c.entropy_coef", "sac": "sac.fixed_alpha",
            "*": "ppo.entropy_coef"}  # fmt: skip
_VALUE = {"impala": "impala.value_coef", "a3c": "a3c.value_coef", "*": "ppo.value_coef"}
_EPOCHS = {"impala": "impala.epochs", "*": "ppo.epochs"}
_GRAD_CLIP = {"a3c": "a3c.grad_clip", "*": "learner.grad_clip"}
_TAU = {"sac": "sac.tau", "*": "ddpg.tau"}
_EPSILON = {"*": "actor.epsilon", "apex_ddpg": "ddpg.noise_sigma"}
KEY_ALIASES: dict[str, dict[str, str]] = {
    "learning_rate": _LR, "lr": _LR,
    "gamma": _GAMMA, "discount": _GAMMA,
    "n_steps": {**_OFF_POLICY_N_STEP, **_ON_POLICY_ROLLOUT},
    "num_steps": _ON_POLICY_ROLLOUT, "rollout_length": _ON_POLICY_ROLLOUT,
    "rollout": _ON_POLICY_ROLLOUT, "unroll_length": _ON_POLICY_ROLLOUT,
    "n_step": _OFF_POLICY_N_STEP,
    "batch_size": {"ppo": "ppo.minibatch_size", **{a: "replay.batch_size" for a in _REPLAY_ALGOS}},
    "num_minibatches": {"*": "ppo.minibatch_size"},
    "ent_coef": _ENTROPY, "entropy_coef": _ENTROPY, "ent_coeff": _ENTROPY,
    "entropy_coeff": _ENTROPY, "exploration_loss_coeff": _ENTROPY,
    "vf_coef": _VALUE, "value_coef": _VALUE, "vf_loss_coeff": _VALUE, "value_loss_coeff": _VALUE,
    "clip_range": {"*": "ppo.clip"}, "clip_coef": {"*": "ppo.clip"},
    "clip_param": {"*": "ppo.clip"}, "ppo_clip_ratio": {"*": "ppo.clip"},
    "clip_range_vf": {"*": "ppo.value_clip"}, "vf_clip_param": {"*": "ppo.value_clip"},
    "n_epochs": _EPOCHS, "update_epochs": _EPOCHS, "num_epochs": _EPOCHS,
    "num_sgd_iter": _EPOCHS, "epochs": _EPOCHS,
    "gae_lambda": {"impala": "impala.vtrace_lambda", "a3c": "a3c.gae_lambda",
                   "*": "ppo.gae_lambda"},
    "lambda": {"impala": "impala.vtrace_lambda", "a3c": "a3c.gae_lambda", "*": "ppo.gae_lambda"},
    "norm_adv": {"*": "ppo.normalize_advantages"},
    "max_grad_norm": _GRAD_CLIP, "grad_clip": _GRAD_CLIP, "grad_norm_clipping": _GRAD_CLIP,
    "max_grad_norm_clip": _GRAD_CLIP,
    "target_update_interval": {"*": "learner.target_update_interval"},
    "target_network_frequency": {"*": "learner.target_update_interval"},
    "target_network_update_freq": {"*": "learner.target_update_interval"},
    "tau": _TAU, "polyak": _TAU,
    "buffer_size": {"*": "replay.capacity"}, "replay_size": {"*": "replay.capacity"},
    "replay_buffer_size": {"*": "replay.capacity"},
    "learning_starts": {"*": "replay.min_size"},
    "exploration_final_eps": _EPSILON, "exploration_initial_eps": _EPSILON,
    "exploration_fraction": _EPSILON, "start_e": _EPSILON, "end_e": _EPSILON,
    "epsilon": _EPSILON, "exploration_noise": {"*": "ddpg.noise_sigma"},
    "action_noise": {"*": "ddpg.noise_sigma"},
    "policy_delay": {"*": "ddpg.policy_delay"}, "policy_frequency": {"*": "ddpg.policy_delay"},
    "target_policy_noise": {"*": "ddpg.target_noise"}, "policy_noise": {"*": "ddpg.target_noise"},
    "target_noise_clip": {"*": "ddpg.target_noise_clip"},
    "noise_clip": {"*": "ddpg.target_noise_clip"},
    "q_lr": {"apex_ddpg": "ddpg.critic_lr", "*": "sac.critic_lr"},
    "policy_lr": {"apex_ddpg": "ddpg.actor_lr", "*": "sac.actor_lr"},
    "autotune": {"*": "sac.fixed_alpha"}, "target_entropy": {"*": "sac.target_entropy"},
    "n_envs": {"*": "env.num_envs"}, "num_envs": {"*": "env.num_envs"},
    "num_envs_per_worker": {"*": "env.num_envs"}, "num_envs_per_env_runner": {"*": "env.num_envs"},
    "num_workers": {"*": "roles.actors"}, "num_env_runners": {"*": "roles.actors"},
    "total_timesteps": {"*": "stop.env_steps"}, "train_for_env_steps": {"*": "stop.env_steps"},
    "train_for_seconds": {"*": "stop.wall_time"}, "time_limit": {"*": "stop.wall_time"},
    "env_id": {"*": "env.id"}, "env_name": {"*": "env.id"},
    "env_kwargs": {"*": "env.kwargs"}, "env_config": {"*": "env.kwargs"},
    "max_episode_steps": {"*": "env.kwargs.max_episode_steps"},
    "net_arch": {"*": "model.hidden"}, "hidden_sizes": {"*": "model.hidden"},
    "fcnet_hiddens": {"*": "model.hidden"}, "activation_fn": {"*": "model.activation"},
    "fcnet_activation": {"*": "model.activation"},
    "double_q": {"*": "learner.double"}, "double_dqn": {"*": "learner.double"},
    "train_freq": {"*": "replay.samples_per_insert"},
    "gradient_steps": {"*": "replay.samples_per_insert"},
    "replay_ratio": {"*": "replay.samples_per_insert"},
    "prioritized_replay_alpha": {"*": "replay.alpha"},
    "prioritized_replay_beta": {"*": "replay.beta"},
    "eval_freq": {"*": "evaluator.interval"}, "n_eval_episodes": {"*": "evaluator.episodes"},
    "reward_threshold": {"*": "stop.eval_return"}, "target_return": {"*": "stop.eval_return"},
}  # fmt: skip


def _fields_at(loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys of the schema section at ``loc`` (list indices skipped), or None where
    ``loc`` is no section (a free-form mapping such as env.kwargs)."""
    model: type[BaseModel] = ExperimentConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        if get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return list(model.model_fields)


def _close(word: str, candidates: list[str], cutoff: float) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return found[0] if found else None


def suggest_key(loc: tuple[int | str, ...], algo: str = "apex_dqn") -> str | None:
    """The key path an unknown key at ``loc`` was most likely meant to be, or None.

    A near miss in the same section wins (a typo); then a name other libraries use for a zrl
    key (``learning_rate`` -> ``learner.lr``); then a looser match in the same section; then
    a close name in another section, sections that ``algo`` uses first."""
    *parent, last = loc
    key = str(last).lower().replace("-", "_")
    here = [str(p) for p in parent]
    fields = _fields_at(tuple(parent)) or []
    near = _close(key, fields, 0.8)
    if near is not None:
        return ".".join([*here, near])
    alias = KEY_ALIASES.get(key)
    if alias is not None:
        target = alias.get(algo) or alias.get("*")
        if target is not None:
            return target
    near = _close(key, fields, 0.6)
    if near is not None:
        return ".".join([*here, near])
    used = set(sections_used(algo))
    ranked = []
    for section in ExperimentConfig.model_fields:
        for name in _fields_at((section,)) or []:
            score = difflib.SequenceMatcher(None, key, name).ratio()
            if score >= 0.8 and f"{section}.{name}" != ".".join(map(str, loc)):
                ranked.append((section not in used, -score, f"{section}.{name}"))
    return min(ranked)[2] if ranked else None


def _format_validation_error(err: ValidationError, algo: str = "apex_dqn") -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            suggestion = suggest_key(tuple(e["loc"]), algo)
            if suggestion is not None:
                msg += f" (did you mean {suggestion}?)"
        elif "input" in e and e["type"] != "missing":
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{path}: {msg}")
    return "; ".join(lines)


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
        raise ConfigError(f"invalid config: {_format_validation_error(err, algo)}") from None


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
