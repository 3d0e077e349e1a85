"""``PPOLearner``: PPO rounds on the actors' rollouts, optionally DD-PPO across learners.

Sockets (besides the parameter-server DEALER of ``Learner``):

- SUB ``rollouts/`` (topic bus): every actor's rollouts reach every learner. A round is
  one rollout per actor (``roles.actors``); ``RoundBuffer`` decides which rollouts form it.
- PUB / SUB ``allreduce/`` (only with ``roles.learners > 1``): DD-PPO. Every learner holds
  the same round, cuts every minibatch into ``learners`` equal slices, computes the gradient
  of its slice, publishes it and averages it with the others' before the optimizer step, so
  all learners apply the same update. Learner 0 publishes the weights; the others follow
  them at the start of each round (and count any drift, which should stay 0). Before the
  first round the learners exchange READY messages there until each has heard every other
  one hear it: only then does learner 0 publish the first weights, which start the actors.
  Otherwise a learner still starting up misses the first rollouts and the others wait for
  it in every allreduce.
- SUB ``weights`` (DD-PPO followers only).

Sync mode: every rollout in a round was collected with the same weights version (the one
the round trains); actors wait for the next version before collecting again. Async mode:
rollouts up to ``ppo.max_lag`` versions old are used, older ones dropped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from zrl.algos.dqn import NonFiniteLossError
from zrl.algos.policy_gradient import normalize, ppo_loss, reduce_gradients
from zrl.algos.returns import rollout_gae
from zrl.algos.vtrace import categorical_entropy
from zrl.models import ActorCritic, load_arrays, model_to_arrays
from zrl.roles.learner import Learner, make_adam
from zrl.roles.weights import WeightsFollower, weights_version
from zrl.transport import protocol as P

ROLLOUT_ARRAYS: dict[str, tuple[str | None, int | None]] = {
    "obs": ("float32", 3),
    "action": ("int64", 2),
    "logp": ("float32", 2),
    "reward": ("float32", 2),
    "terminated": ("bool", 2),
    "truncated": ("bool", 2),
    "valid": ("bool", 2),
    "bootstrap_obs": ("float32", 2),
}
ALLREDUCE_TIMEOUT_S = 10.0
READY_INTERVAL_S = 0.05  # DD-PPO start-up: READY repeated until every peer confirms
HANDSHAKE_TIMEOUT_S = 30.0  # then start anyway; allreduce timeouts count what is missing
TICK_EVERY_STEPS = 16  # keep heartbeats going through a long round


@dataclass
class Rollout:
    version: int
    actor: int
    arrays: dict[str, np.ndarray]
    received: float = field(default_factory=time.monotonic)


class RoundBuffer:
    """Rollouts waiting to become a training round.

    sync: rollouts are grouped by weights version; a round is ``round_size`` rollouts of one
    version newer than the last round trained. A rollout of a version already trained (or
    superseded by a newer round) is stale and dropped. If a round stays incomplete for
    ``round_timeout`` seconds (an actor died) it is trained short rather than never.

    async: a round is the first ``round_size`` rollouts at most ``max_lag`` versions behind
    the learner's current version; older rollouts are dropped.
    """

    def __init__(self, mode: str, round_size: int, max_lag: int, round_timeout: float) -> None:
        self.mode = mode
        self.round_size = round_size
        self.max_lag = max_lag
        self.round_timeout = round_timeout
        self.pending: list[Rollout] = []
        self.trained_version = 0  # sync: newest version a round was trained on
        self.stale = 0
        self.short_rounds = 0

    def add(self, rollout: Rollout, current_version: int) -> bool:
        """Keep ``rollout`` if it can still be used; False (and counted) if it is stale."""
        if self._is_stale(rollout.version, current_version):
            self.stale += 1
            return False
        self.pending.append(rollout)
        return True

    def _is_stale(self, version: int, current_version: int) -> bool:
        if self.mode == "sync":
            return version <= self.trained_version
        return current_version - version > self.max_lag

    def take(self, current_version: int, now: float | None = None) -> list[Rollout] | None:
        """The next round, or None while it is not complete."""
        now = time.monotonic() if now is None else now
        before = len(self.pending)
        self.pending = [r for r in self.pending if not self._is_stale(r.version, current_version)]
        self.stale += before - len(self.pending)
        if not self.pending:
            return None
        if self.mode == "async":
            if len(self.pending) < self.round_size:
                return None
            chosen, self.pending = self.pending[: self.round_size], self.pending[self.round_size :]
            return chosen
        newest = max(r.version for r in self.pending)
        chosen = [r for r in self.pending if r.version == newest][: self.round_size]
        waited = now - min(r.received for r in chosen)
        if len(chosen) < self.round_size and waited < self.round_timeout:
            return None
        if len(chosen) < self.round_size:
            self.short_rounds += 1
        self.trained_version = newest
        kept = [r for r in self.pending if r.version > newest]
        # Older versions and extras of this one are superseded: counted, never trained on.
        self.stale += len(self.pending) - len(chosen) - len(kept)
        self.pending = kept
        return sorted(chosen, key=lambda r: r.actor)


def round_tensors(
    model: ActorCritic, rollouts: list[Rollout], gamma: float, lam: float
) -> dict[str, torch.Tensor]:
    """The valid samples of a round, flattened, with old values, GAE advantages and returns
    computed with the current weights (the behaviour weights, in sync mode)."""
    cat = {k: np.concatenate([r.arrays[k] for r in rollouts]) for k in ROLLOUT_ARRAYS}
    E, T = cat["reward"].shape
    with torch.no_grad():
        obs = torch.from_numpy(cat["obs"].reshape(E * T, -1))
        values = model.value(obs).numpy().reshape(E, T)
        bootstrap = model.value(torch.from_numpy(cat["bootstrap_obs"])).numpy()
    advantages, returns = rollout_gae(
        cat["reward"], values, cat["terminated"], cat["truncated"], cat["valid"], bootstrap,
        gamma, lam,
    )  # fmt: skip
    valid = cat["valid"].reshape(-1)
    return {
        "obs": obs[torch.from_numpy(valid)],
        "action": torch.from_numpy(cat["action"].reshape(-1)[valid]),
        "logp": torch.from_numpy(cat["logp"].reshape(-1)[valid]),
        "value": torch.from_numpy(values.reshape(-1)[valid].astype(np.float32)),
        "advantage": torch.from_numpy(advantages.reshape(-1)[valid]),
        "return": torch.from_numpy(returns.reshape(-1)[valid]),
    }


class PPOLearner(Learner):
    role = "learner"

    def setup_updates(self) -> None:
        cfg = self.config
        self.optimizer = make_adam(self.online.parameters(), cfg.learner.lr)
        self.rollouts = self.open_subscriber([P.ROLLOUTS_TOPIC], "rollouts", hwm=1000)
        self.learners = max(1, cfg.roles.learners)
        self.learner_index = self.index if self.index is not None else 0
        self.leader = self.learner_index == 0
        if self.learners > 1:
            self.allreduce_pub = self.open_publisher("allreduce")
            self.allreduce_sub = self.open_subscriber([P.ALLREDUCE_TOPIC], "allreduce")
            self.peer_grads: dict[tuple[int, int], dict[int, dict[str, np.ndarray]]] = {}
            self.allreduce_timeouts = 0
        self.heard: set[int] = set()  # DD-PPO peers whose READY reached us
        self.confirmed: set[int] = set()  # ... and who said they heard ours
        self.peers_ready = self.learners == 1
        self.handshake_started = time.monotonic()
        self.next_ready = 0.0
        if not self.leader:
            self.follow = WeightsFollower(self, self.online)
            self.weight_drift = 0.0
        c = cfg.ppo
        self.buffer = RoundBuffer(c.mode, max(1, cfg.roles.actors), c.max_lag, c.round_timeout)
        self.rounds = 0
        self.training_s = 0.0  # time in rounds, against the learner's uptime: is it the bottleneck?
        self.mixed_rounds = 0  # sync rounds whose rollouts came from several versions: must stay 0
        self.round_versions: list[int] = []
        self.last_parts: dict[str, float] = {}
        self.rng = torch.Generator().manual_seed(cfg.seed)

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rounds": self.rounds,
            "trained_version": self.buffer.trained_version,
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rounds = int(state["rounds"])
        self.buffer.trained_version = int(state["trained_version"])

    def send_weights(self) -> None:
        # DD-PPO: one learner speaks for all, once all hear each other (the first weights
        # start the actors).
        if self.leader and self.peers_ready:
            super().send_weights()

    # --- DD-PPO start-up handshake ------------------------------------------------------

    def send_ready(self) -> None:
        self.allreduce_pub.send(
            P.Message(P.READY, meta={"learner": self.learner_index, "heard": sorted(self.heard)}),
            topic=P.ALLREDUCE_TOPIC, block=False,
        )  # fmt: skip

    def on_ready(self, msg: P.Message) -> None:
        who, heard = msg.meta.get("learner"), msg.meta.get("heard")
        if not isinstance(heard, list):
            self.allreduce_sub._drop(msg.sender or "?", "READY without the peers it heard")
            return
        assert isinstance(who, int)  # checked by read_peer_grads
        newly_heard = who not in self.heard
        self.heard.add(who)
        if self.learner_index in heard:
            self.confirmed.add(who)
        if newly_heard or self.learner_index not in heard:
            # Tell it at once that we hear it (it may be new, or waiting only for that).
            self.send_ready()

    def handshake(self) -> None:
        """Until every other learner is heard and has heard us: READY at 20 Hz."""
        now = time.monotonic()
        if now >= self.next_ready:
            self.next_ready = now + READY_INTERVAL_S
            self.send_ready()
        self.read_peer_grads()
        others = set(range(self.learners)) - {self.learner_index}
        if self.heard >= others and self.confirmed >= others:
            self.peers_ready = True
            self.log.info(
                "DD-PPO: all %d learners hear each other (%.2f s)",
                self.learners, now - self.handshake_started,
            )  # fmt: skip
        elif now - self.handshake_started > HANDSHAKE_TIMEOUT_S:
            self.peers_ready = True
            self.log.warning(
                "DD-PPO: learners %s not heard within %.0f s; starting without them "
                "(their allreduce steps will time out)",
                sorted(others - (self.heard & self.confirmed)), HANDSHAKE_TIMEOUT_S,
            )  # fmt: skip
        else:
            self.allreduce_sub.sock.poll(20)

    # --- receiving --------------------------------------------------------------------

    def current_version(self) -> int:
        return self.weights_version if self.leader else self.follow.version

    def read_rollouts(self) -> None:
        for _ in range(256):
            got = self.rollouts.recv(block=False)
            if got is None:
                return
            msg = got[1]
            try:
                self.buffer.add(self.validate(msg), self.current_version())
            except P.ProtocolError as exc:
                self.rollouts._drop(msg.sender or "?", str(exc))

    def validate(self, msg: P.Message) -> Rollout:
        if msg.kind != P.TRAJECTORY:
            raise P.ProtocolError(f"rollouts topic carries {msg.kind!r}, expected trajectory")
        P.require_arrays(msg, ROLLOUT_ARRAYS)
        a = msg.arrays
        E, T = a["reward"].shape
        for name in ROLLOUT_ARRAYS:
            want = (E,) if name == "bootstrap_obs" else (E, T)
            if a[name].shape[: len(want)] != want:
                raise P.ProtocolError(f"rollout array {name!r} has shape {a[name].shape}")
        obs_dim = self.online.obs_dim
        if a["obs"].shape[2] != obs_dim or a["bootstrap_obs"].shape[1] != obs_dim:
            raise P.ProtocolError(f"rollout observations are not {obs_dim} wide")
        if a["action"].min() < 0 or a["action"].max() >= self.num_actions:
            raise P.ProtocolError(f"rollout actions outside [0, {self.num_actions})")
        for name in ("obs", "logp", "reward", "bootstrap_obs"):
            if not np.all(np.isfinite(a[name])):
                raise P.ProtocolError(f"rollout array {name!r} is not finite")
        version, actor = msg.meta.get("weights_version"), msg.meta.get("actor")
        if not isinstance(version, int) or not isinstance(actor, int):
            raise P.ProtocolError("rollout without integer weights_version and actor")
        return Rollout(version, actor, a)

    # --- training ---------------------------------------------------------------------

    def step(self) -> None:
        if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
            self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
            self.save_checkpoint()
        self.read_acks()
        if not self.peers_ready:
            self.handshake()
            return
        if self.leader and not self.params_acked and self._unacked_since is None:
            self.send_weights()  # until the parameter server has our first version
        if not self.leader:
            self.follow_leader()
        self.read_rollouts()
        chosen = self.buffer.take(self.current_version())
        if chosen is None:
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
            self.rollouts.sock.poll(20)
            return
        self.waiting_since = None
        started = time.monotonic()
        try:
            self.train_round(chosen)
        except NonFiniteLossError as exc:
            self.on_non_finite(exc, f"round {self.rounds + 1}")
        self.non_finite_in_a_row = 0
        if self.leader:
            self.send_weights()
        self.training_s += time.monotonic() - started

    def weights_meta(self) -> dict[str, int]:
        return {"rounds": self.rounds}

    def follow_leader(self) -> None:
        """DD-PPO followers take the leader's weights after the same round; with identical
        averaged updates these equal their own, and any drift (an allreduce that timed out)
        is measured and corrected. Weights from another round are only used for the version
        number: loading them would move this learner out of step."""
        while True:
            got = self.follow.sub.recv(block=False)
            if got is None:
                return
            msg = got[1]
            version, rounds = weights_version(msg.meta), msg.meta.get("rounds")
            if msg.kind != P.WEIGHTS or version is None:
                self.follow.sub._drop(msg.sender or "?", "not versioned weights")
                continue
            if not self.follow.from_params(msg.sender or "?"):
                self.follow.sub._drop(msg.sender or "?", "weights not from a params role")
                continue
            self.follow.version = max(self.follow.version, version)
            if rounds != self.rounds:
                continue
            before = model_to_arrays(self.online)
            try:
                load_arrays(self.online, msg.arrays)
            except ValueError as exc:
                self.follow.sub._drop(msg.sender or "?", f"weights do not fit the model: {exc}")
                continue
            self.weight_drift = max(
                float(np.max(np.abs(before[k] - msg.arrays[k]))) for k in before
            )

    def train_round(self, chosen: list[Rollout]) -> None:
        c = self.config.ppo
        versions = sorted({r.version for r in chosen})
        if c.mode == "sync" and len(versions) > 1:
            self.mixed_rounds += 1
        self.round_versions = versions
        # Policy lag: how many versions behind the weights being trained the data is.
        current = self.current_version()
        self.train_stats.add_with_max(
            policy_lag=float(np.mean([current - r.version for r in chosen]))
        )
        round_started = time.perf_counter()
        data = round_tensors(self.online, chosen, c.gamma, c.gae_lambda)
        n = len(data["obs"])
        if n == 0:
            return
        mb = c.minibatch_size
        # Steps per epoch from the configured round size, not from this round's count of valid
        # samples (autoreset steps vary): DD-PPO learners must take the same number of steps.
        nominal = self.buffer.round_size * self.config.env.num_envs
        per_epoch = max(1, nominal * self.config.actor.trajectory_length // mb)
        steps = 0
        for _ in range(c.epochs):
            order = torch.randperm(n, generator=self.rng)
            for j in range(per_epoch):
                idx = order[torch.arange(j * mb, (j + 1) * mb) % n]  # wraps on a short round
                self.minibatch_step({k: v[idx] for k, v in data.items()}, steps)
                steps += 1
                if steps % TICK_EVERY_STEPS == 0:
                    self.tick()
        self.rounds += 1
        self.train_stats.add(round_s=time.perf_counter() - round_started)

    def minibatch_step(self, mb: dict[str, torch.Tensor], step: int) -> None:
        c = self.config.ppo
        started = time.perf_counter()
        adv = normalize(mb["advantage"]) if c.normalize_advantages else mb["advantage"]
        if self.learners > 1:
            # Each learner takes its slice of the (identically ordered) minibatch.
            size = len(adv) // self.learners
            part = slice(self.learner_index * size, (self.learner_index + 1) * size)
            mb = {k: v[part] for k, v in mb.items()}
            adv = adv[part]
        logits, values = self.online(mb["obs"])
        log_probs = torch.log_softmax(logits, dim=-1)
        new_logp = log_probs.gather(1, mb["action"].unsqueeze(1))[:, 0]
        loss, parts = ppo_loss(
            new_logp, mb["logp"], adv, values, mb["value"], mb["return"],
            categorical_entropy(logits), c.clip, c.value_clip, c.entropy_coef, c.value_coef,
            normalize_advantages=False,
        )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.learners > 1:
            self.allreduce(step)
        grad_norm = nn.utils.clip_grad_norm_(
            self.online.parameters(), self.config.learner.grad_clip
        )
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            raise NonFiniteLossError(float(loss.item()), float(grad_norm.item()))
        self.optimizer.step()
        self.updates += 1
        self.last_loss = parts["loss"]
        self.last_parts = parts
        self.train_stats.add(
            **parts, grad_norm=grad_norm, update_ms=(time.perf_counter() - started) * 1e3
        )

    def allreduce(self, step: int) -> None:
        """Average this step's gradients with the other learners' (DD-PPO)."""
        key = (self.rounds, step)
        own = {
            name: p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32)
            for name, p in self.online.named_parameters()
        }
        self.allreduce_pub.send(
            P.Message(P.GRADIENTS, meta={"round": key[0], "step": key[1], "learner": self.learner_index}, arrays=own),
            topic=P.ALLREDUCE_TOPIC, block=False,
        )  # fmt: skip
        deadline = time.monotonic() + ALLREDUCE_TIMEOUT_S
        while len(self.peer_grads.get(key, {})) < self.learners - 1:
            if self.stop_event.is_set():
                break  # stopping: the other learners may be gone already
            if time.monotonic() > deadline:
                self.allreduce_timeouts += 1
                self.log.warning(
                    "allreduce of round %d step %d: peers missing; using own gradient", *key
                )
                break
            if self.allreduce_sub.sock.poll(50):
                self.read_peer_grads()
            else:
                self.tick()
        grads = {**self.peer_grads.pop(key, {}), self.learner_index: own}
        for old in [k for k in self.peer_grads if k <= key]:
            del self.peer_grads[old]
        # Summed in learner order on every learner, so all get bit-identical means.
        mean = reduce_gradients(
            [{k: torch.from_numpy(v) for k, v in grads[i].items()} for i in sorted(grads)], "mean"
        )
        for name, p in self.online.named_parameters():
            p.grad = mean[name].clone()

    def read_peer_grads(self) -> None:
        names = {name: tuple(p.shape) for name, p in self.online.named_parameters()}
        while True:
            got = self.allreduce_sub.recv(block=False)
            if got is None:
                return
            msg = got[1]
            r, s, who = msg.meta.get("round"), msg.meta.get("step"), msg.meta.get("learner")
            if who == self.learner_index:
                continue  # our own publication comes back through the bus
            if not isinstance(who, int) or not 0 <= who < self.learners:
                self.allreduce_sub._drop(msg.sender or "?", f"allreduce from learner {who!r}")
                continue
            if msg.kind == P.READY:
                self.on_ready(msg)
                continue
            if (
                msg.kind != P.GRADIENTS
                or not isinstance(r, int)
                or not isinstance(s, int)
                or set(msg.arrays) != set(names)
                or any(msg.arrays[k].shape != names[k] for k in names)
                or not all(np.all(np.isfinite(v)) for v in msg.arrays.values())
            ):
                self.allreduce_sub._drop(msg.sender or "?", "malformed allreduce gradients")
                continue
            # Copies: the received frames are read-only, and torch wants writable arrays.
            self.peer_grads.setdefault((r, s), {})[who] = {
                k: np.array(v) for k, v in msg.arrays.items()
            }

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "buffer"):
            drift = f", weight drift {self.weight_drift:g}" if not self.leader else ""
            timeouts = (
                f", allreduce timeouts {self.allreduce_timeouts}" if self.learners > 1 else ""
            )
            self.log.info(
                "%s: %d rounds (%s), %d updates, mixed-version rounds %d, stale rollouts %d, "
                "short rounds %d%s%s, %.1f s training of %.1f s",
                self.id, self.rounds, self.config.ppo.mode, self.updates, self.mixed_rounds,
                self.buffer.stale, self.buffer.short_rounds, drift, timeouts, self.training_s,
                time.monotonic() - self.started,
            )  # fmt: skip

    def heartbeat_info(self) -> dict[str, Any]:
        info = super().heartbeat_info()
        info.update(
            rounds=self.rounds,
            stale_rollouts=self.buffer.stale,
            short_rounds=self.buffer.short_rounds,
            mixed_rounds=self.mixed_rounds,
            round_versions=self.round_versions,
            busy=round(self.training_s / max(1e-9, time.monotonic() - self.started), 3),
        )
        if self.learners > 1:
            info["allreduce_timeouts"] = self.allreduce_timeouts
        if not self.leader:
            info["weight_drift"] = self.weight_drift
        for k in ("approx_kl", "clip_fraction", "entropy"):
            if k in self.last_parts:
                info[k] = round(self.last_parts[k], 4)
        return info
