"""The sections of an experiment config that every algorithm shares (``env:``, ``broker:``,
``roles:``, ``replay:``, ...), one pydantic model each with a doc line per field.

``zrl.config.experiment`` composes them into ``ExperimentConfig`` (and re-exports them); an
algorithm's own sections are in its package. Pydantic only: it imports nothing from zrl but the
base of every section and the ``multiagent`` section, so the CLI stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticKnownError

from zrl.config.base import Section
from zrl.config.multiagent import MultiAgentConfig

DEFAULT_STREAMS = ("experience", "batches", "priorities", "gradients")

# Ceilings of the sizes, whatever the machine: a config (or a forged spec) cannot make a role
# allocate past them. ``zrl.config.experiment.check_fits_machine`` measures a config against the
# cores and memory of the host that starts it.
MAX_ROLES = 16_384
"""Roles of an experiment (and registry entries, ``broker.max_roles``)."""
MAX_NUM_ENVS = 16_384
"""Environments one actor steps (``env.num_envs``)."""
MAX_THREADS = 1024
"""Threads of one role (torch, ale-py)."""
MAX_LAYER_WIDTH = 65_536
"""Units of one layer of the model (``model.hidden``, ``model.core_size``)."""
MAX_LAYERS = 64
"""Hidden layers of the model's MLP torso."""
MAX_STEPS = 65_536
"""Steps of one trajectory (``actor.trajectory_length``), n-step returns."""
MAX_ITEMS = 2**32
"""Items of one replay shard (``replay.capacity``, ``replay.min_size``)."""
MAX_BATCH = 2**20
"""Items of one sampled batch (``replay.batch_size``)."""
MAX_QUEUE = 4096
"""Messages a role queues or keeps in flight (``actor.max_in_flight``, ``replay.prefetch``)."""
MAX_EPISODES = 100_000
"""Episodes of one evaluation."""


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
    num_threads: int = Field(0, ge=0, le=MAX_THREADS)
    """Threads of ale-py's AtariVectorEnv (vectorization auto/native); 0: its default."""


class EnvConfig(Section):
    id: str = "CartPole-v1"
    """gymnasium environment id, or a PettingZoo env: ``pettingzoo/<name>`` (the classic
    games, ...) or ``mpe2/<name>`` (see ``multiagent``)."""
    num_envs: int = Field(16, ge=1, le=MAX_NUM_ENVS)
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
    hidden: list[Annotated[int, Field(le=MAX_LAYER_WIDTH)]] = Field(
        default_factory=lambda: [64, 64], max_length=MAX_LAYERS
    )
    """Hidden layer sizes of the MLP torso."""
    dueling: bool = True
    """Dueling value/advantage heads (Q-networks)."""
    activation: Literal["relu", "tanh"] = "relu"
    """Hidden-layer activation of the actor-critic networks (impala, appo, a3c, ppo)."""
    encoder: Literal["auto", "nature_cnn", "impala_resnet", "mlp"] = "auto"
    """Observation encoder of the discrete-action models: auto is nature_cnn for [C, H, W]
    image observations (uint8 pixels are scaled to [0, 1] in the model) and the hidden MLP
    otherwise; impala_resnet is the IMPALA deep ResNet. The CNNs ignore hidden."""
    normalize_input: bool = False
    """Normalize image observations per pixel by running mean and variance (Sample Factory's
    normalize_input), updated by the learner and sent with the weights; with Box actions the
    Gaussian actor-critic's flat observations likewise. The learners of impala, appo and ppo
    update them."""
    core: Literal["none", "lstm", "gru"] = "none"
    """A recurrent core after the encoder (r2d2, and the recurrent actor-critic of ppo, impala
    and appo): its state is carried per env by the actors, sent with every sequence or unroll
    and replayed by the learners. r2d2 always has one (an lstm when this is none)."""
    core_size: int = Field(128, ge=1, le=MAX_LAYER_WIDTH)
    """Units of the LSTM/GRU core."""


class BrokerConfig(Section):
    host: str = "127.0.0.1"
    """Address `zrl run` binds the broker on; 0.0.0.0 (or a LAN address) when hosts join."""
    advertise: str | None = None
    """The broker address other hosts connect to (default: host, or this machine's address)."""
    heartbeat_interval: float = Field(0.5, gt=0)
    """Seconds between a role's heartbeats (from its loop, or from its heartbeat thread while
    a step holds the loop)."""
    heartbeat_timeout: float = Field(10.0, gt=0)
    """A role silent this long is marked dead. Its heartbeats come from a thread of its own, so
    silence means a process gone, a host lost or a process frozen whole, not a long step; 10 s
    leaves room for a core starved at load 20 on two cores (docs/architecture.md)."""
    stall_after: float = Field(30.0, gt=0)
    """A role that heartbeats but whose loop has not turned this long (a step that goes on: a
    slow update, a hung call) is shown stalled, with since when, in `zrl status`, the head's
    display and log; it stays alive and nothing acts on it."""
    orphan_timeout: float | None = Field(600.0, gt=0)
    """Seconds a registered role keeps reconnecting to a broker that stopped answering before
    it stops itself, saying so in its log (exit code 0): the roles of a plain ``zrl start
    broker`` end some time after it. null: reconnect for ever. Keep it well above the time a
    broker takes to restart (``zrl run`` restarts a killed broker at once)."""
    setup_grace: float = Field(60.0, gt=0)
    """Seconds a role setting up (imports, envs, models) may be silent: before its first
    heartbeat, and while native code holds the GIL from its heartbeat thread (building
    Atari envs at load 20). One still setting up this long is shown stalled."""
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
    """Largest message any socket accepts (ZMQ_MAXMSGSIZE); libzmq disconnects a peer that sends
    more."""
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
    max_roles: int = Field(2048, ge=1, le=MAX_ROLES)
    """Registry entries at most (live, dead and stopped); a HELLO beyond them is refused."""
    max_info_bytes: int = Field(8192, ge=256)
    """Largest heartbeat `info` (msgpack bytes) the registry stores; a bigger one is dropped
    and counted, and the role keeps its previous info."""
    forget_after: float = Field(300.0, gt=0)
    """Seconds a dead or stopped role stays in the registry before it is forgotten."""


class RolesConfig(Section):
    actors: int | Literal["auto"] = 2
    """A number, or auto: as many as the cores of the host that runs `zrl run` leave once
    the broker and this host's other roles have their share (``zrl.run.sizing``: a learner on
    a GPU half a core, one on the CPU its learner.torch_threads), at least 1, plus those
    ``hosts`` place elsewhere. `zrl run` prints what it chose; roles only see the number."""
    replay: int = Field(1, ge=0, le=MAX_ROLES)
    params: int = Field(1, ge=0, le=1)
    learners: int = Field(1, ge=0, le=MAX_ROLES)
    evaluator: int = Field(1, ge=0, le=64)
    """1: an evaluator of the policy (0: none); a population ranked by evaluations
    (``pbt.fitness: evaluation``) has one per member, and only it more than one."""
    league: int = Field(0, ge=0, le=1)
    """1: a league role picks the opponents of multi-agent games and snapshots the learning
    policy (see ``league:``); 0: ``env.multiagent.opponent`` plays them."""
    pbt: int = Field(0, ge=0, le=1)
    """1: the pbt role ranks a population's members and exploits/explores (``pbt:``)."""
    inference: int = Field(0, ge=0, le=MAX_ROLES)
    """Inference roles: each serves batched forwards of the policy for the actors of its host
    (``inference:``; on a GPU host, one with ``inference.device: cuda`` keeps the actors'
    cores for their envs). 0: every actor runs its own model on its CPU."""

    @field_validator("actors", mode="before")
    @classmethod
    def _number_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            # Known error types only: a config's errors are raised again by type, all together.
            expected = f"a number from 0 to {MAX_ROLES}, or auto"
            raise PydanticKnownError("literal_error", {"expected": expected})
        if value > MAX_ROLES:
            raise PydanticKnownError("less_than_equal", {"le": MAX_ROLES})
        return value

    def count(self, key: str) -> int:
        """``roles.<key>`` as a number; ValueError for ``actors: auto``, which the head resolves
        (``zrl.run.sizing``) before any role starts."""
        value = getattr(self, key)
        if value == "auto":
            raise ValueError(
                f"roles.{key}: auto is resolved by the head (zrl run, zrl start broker) "
                "before any role starts; a role's config must carry a number"
            )
        return int(value)

    def counts(self) -> dict[str, int]:
        """Every ``roles`` count as a number (:meth:`count`), by key: what the run's planned
        ids are made of (``zrl.transport.senders.planned_ids``)."""
        return {key: self.count(key) for key in ROLE_COUNT_KEYS}


ROLE_COUNT_KEYS = (
    "actors",
    "replay",
    "params",
    "learners",
    "evaluator",
    "league",
    "inference",
    "pbt",
)


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
    trajectory_length: int = Field(32, ge=1, le=MAX_STEPS)
    """Steps per env in one pushed trajectory."""
    epsilon: float = Field(0.4, ge=0, le=1)
    """Ape-X base epsilon: slot i of N explores with epsilon ** (1 + alpha * i / (N - 1))."""
    epsilon_alpha: float = Field(7.0, ge=0)
    """Ape-X epsilon exponent spread."""
    max_in_flight: int = Field(2, ge=1, le=MAX_QUEUE)
    """Trajectories sent but not yet acknowledged by a replay shard; bounds data staleness."""
    random_policy: bool = False
    """Uniform random actions without the model (impala, appo): measures the pipeline without
    inference (benchmarks/atari.py section c)."""
    torch_threads: int = Field(1, ge=1, le=MAX_THREADS)
    env_groups: int = Field(1, ge=1, le=MAX_NUM_ENVS)
    """2: double-buffered sampling, the envs as two vector envs of env.num_envs / 2 each; the
    actor computes one group's actions while the other steps (Atari: ale-py's threads)."""


class InferenceConfig(Section):
    """The inference roles (``roles.inference``): where they run the policy and how much one
    forward may take."""

    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    """auto (a GPU if torch sees one, else cpu), cpu, cuda or cuda:N."""
    max_batch_rows: int = Field(4096, ge=1, le=MAX_NUM_ENVS)
    """Observations of one batched forward: the requests waiting when the server looks are
    joined up to this many rows (one actor's request is never split)."""
    torch_threads: int = Field(1, ge=1, le=MAX_THREADS)
    """Threads torch may use in an inference role on the CPU."""
    request_timeout_s: float = Field(10.0, gt=0, le=3600)
    """How long an actor waits for a reply before it asks again (the same or another
    inference role of its host); it resends until one answers or the run stops."""


class ReplayConfig(Section):
    table: Literal["uniform", "prioritized", "fifo"] = "prioritized"
    capacity: int = Field(100_000, ge=1, le=MAX_ITEMS)
    """Items per replay shard; the oldest is evicted first."""
    capacity_bytes: int | None = Field(None, ge=1)
    """Also cap a shard by memory: capacity = min(capacity, capacity_bytes / item size)."""
    alpha: float = Field(0.6, ge=0)
    """Priority exponent (prioritized table)."""
    beta: float = Field(0.4, ge=0, le=1)
    """Importance-sampling exponent (prioritized table)."""
    n_step: int = Field(3, ge=1, le=MAX_STEPS)
    gamma: float = Field(0.99, ge=0, le=1)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    min_size: int = Field(1000, ge=1, le=MAX_ITEMS)
    """Items a shard must hold before it samples."""
    samples_per_insert: float = Field(8.0, ge=0)
    """Target sampled items per inserted item (0 disables the ratio limit)."""
    samples_per_insert_tolerance: float = Field(4096.0, ge=0)
    """Error buffer of the ratio, in sampled items (Reverb's error_buffer)."""
    prefetch: int = Field(4, ge=1, le=MAX_QUEUE)
    """Sampled batches queued ahead of the learners (send high-water mark)."""


class LearnerConfig(Section):
    lr: float = Field(1e-3, gt=0)
    adam_eps: float = Field(1e-8, gt=0)
    """Adam's epsilon (torch's default; Sample Factory and CleanRL use 1e-5 on Atari)."""
    double: bool = True
    target_update_interval: int = Field(500, ge=1)
    """Updates between hard target-network copies."""
    grad_clip: float = Field(10.0, gt=0)
    huber_delta: float = Field(1.0, gt=0)
    publish_interval: int = Field(20, ge=1)
    """Updates between sending weights to the parameter server."""
    publish_every_s: float = Field(0.0, ge=0, le=3600)
    """Least seconds between two such sends (0: none): a fast learner (on a GPU, say) then
    copies and sends its weights at the rate the actors can use, not after every few updates."""
    torch_threads: int = Field(1, ge=1, le=MAX_THREADS)
    """Threads torch may use in the learner (the actors have actor.torch_threads): keep the
    sum over a host's roles at most its cores, or they fight."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    """auto (a GPU if torch sees one, else cpu), cpu, cuda or cuda:N. On a GPU, batches are
    copied from pinned host memory without blocking, the next one while the current trains."""
    memory_format: Literal["auto", "channels_last", "contiguous"] = "auto"
    """Layout of the CNN encoders' weights and activations in the learner. auto: channels_last
    on the CPU (1.4-1.5x the samples per CPU-second of contiguous there), contiguous on a GPU."""
    group_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Several learners of one policy (DD-PPO, IMPALA, APPO): seconds the learners wait for
    each other to form their ``torch.distributed`` group (or to form it again after a
    learner died), and for a collective over it; past them the learner stops with an error
    naming the ranks that did not come."""


class EvaluatorConfig(Section):
    interval: float = Field(5.0, gt=0)
    """Seconds between evaluations (only when a new weights version exists)."""
    episodes: int = Field(20, ge=1, le=MAX_EPISODES)
    exploitability: Literal["auto"] | bool = "auto"
    """Also compute the exploitability of the greedy policy at each evaluation (the best
    response's win rate over both seats, by exhaustive search: eval.csv's `exploitability`).
    auto: for turn-based board games small enough to enumerate (tic-tac-toe); true: the same,
    an error for any other env; false: never."""


class CheckpointConfig(Section):
    dir: str | None = None
    """Where the learner and replay shards save and resume from (`zrl run` sets
    RUN_DIR/checkpoints)."""
    interval: float = Field(30.0, gt=0)
    """Seconds between checkpoints (written atomically: write, then rename)."""
    replay: bool = True
    """Also snapshot the replay tables (items, priorities, order, rate limiter)."""


class LimitsConfig(Section):
    memory_mb: float | None = Field(None, gt=0)
    """A role whose resident memory passes this stops with a clear message (per process)."""
    heap_keep_mb: int | None = Field(1024, ge=1, le=2047)
    """Freed memory each role process keeps for reuse (glibc only: big blocks come from the
    heap, not mmap, and up to this much stays mapped). A learner's per-step tensors then reuse
    their pages instead of faulting in fresh zeroed ones (Pong APPO on a CPU: a step a third
    cheaper); the kept memory counts in the role's RSS. null: glibc's defaults."""


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
    eval_window: int = Field(3, ge=1, le=MAX_EPISODES)
    """Evaluations averaged by confirm: window (1: any single evaluation stops the run)."""
    eval_episodes: int = Field(100, ge=1, le=MAX_EPISODES)
    """Episodes of the confirming evaluation of confirm: fresh (on seeds no evaluation used)."""
    exploitability: float | None = Field(None, ge=0.0, le=1.0)
    """Stop when the greedy policy's exploitability (evaluator.exploitability) is at most
    this (0: no seat can be beaten), as `confirm` says: every evaluation of the window, or a
    confirming evaluation of the same weights. With eval_return set too, both must hold."""
    eval_at_least: dict[str, float] = {}
    """eval.csv column -> bound: each evaluation the rule counts (the window's, or the
    confirming one) must have that figure at least this high, e.g.
    `search_alphabeta4_first_draw_rate`. With eval_return or exploitability set too, all
    must hold. The columns a run's evaluations write are in eval.csv's header."""
    eval_at_most: dict[str, float] = {}
    """As eval_at_least, an upper bound: `{search_alphabeta4_first_loss_rate: 0.1,
    search_alphabeta4_second_loss_rate: 0.1}` is "the search player wins or draws 90 % of
    its games against alpha-beta at depth 4 from each seat"."""
    env_steps: int | None = Field(None, ge=1)
    updates: int | None = Field(None, ge=1)
    """Stop once the learners' updates (summed, as progress.csv counts them) reach this: a
    run bounded by training rather than by the clock or the actors."""
    wall_time: float | None = Field(600.0, gt=0)
    """Seconds."""
    no_progress: float | None = Field(300.0, gt=0)
    """Seconds. The run fails (failed: true, exit 1, the reason named) when, after its first
    update, a learner makes no update for this long while the actors step, or params' weights
    version of its policy stays the same this long while the learner trains (null: never)."""

    @model_validator(mode="after")
    def _some_condition(self) -> StopConfig:
        if not self.on_evaluations and self.env_steps is None and self.wall_time is None:
            raise ValueError(
                "at least one of eval_return, exploitability, eval_at_least, eval_at_most, "
                "env_steps, wall_time must be set"
            )
        return self

    @property
    def on_evaluations(self) -> bool:
        """Whether the run has a target on evaluations (eval_return, exploitability or an
        eval.csv column's bound)."""
        return self.eval_return is not None or self.exploitability is not None or self.has_bounds

    @property
    def has_bounds(self) -> bool:
        """Whether eval_at_least or eval_at_most names a column."""
        return bool(self.eval_at_least or self.eval_at_most)

    def bounds_met(self, row: Mapping[str, Any]) -> bool:
        """Whether an evaluation's figures ``row`` (eval.csv's columns) meet eval_at_least
        and eval_at_most; a column the row lacks, or not a number, meets no bound."""
        for bounds, sign in ((self.eval_at_least, 1.0), (self.eval_at_most, -1.0)):
            for name, bound in bounds.items():
                value = row.get(name)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    return False
                if not math.isfinite(value) or sign * (value - bound) < 0:
                    return False
        return True


__all__ = [
    "DEFAULT_STREAMS",
    "MAX_BATCH",
    "MAX_EPISODES",
    "MAX_ITEMS",
    "MAX_LAYERS",
    "MAX_LAYER_WIDTH",
    "MAX_NUM_ENVS",
    "MAX_QUEUE",
    "MAX_ROLES",
    "MAX_STEPS",
    "MAX_THREADS",
    "ROLE_COUNT_KEYS",
    "ActorConfig",
    "AtariConfig",
    "BrokerConfig",
    "CheckpointConfig",
    "EnvConfig",
    "EvaluatorConfig",
    "HostConfig",
    "LearnerConfig",
    "LimitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "ReplayConfig",
    "RolesConfig",
    "StopConfig",
]
