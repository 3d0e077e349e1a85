"""``Learner``: Ape-X DQN updates on batches from the replay shards.

Sockets:

- PULL ``batches`` <- replay shards (via the broker): BATCH messages.
- PUB ``priorities/<shard>/`` (topic bus): PRIORITIES for the sampled keys, back
  to the shard that sampled them.
- PUB ``batch-acks/<shard>/`` (topic bus): an ACK of every batch as it is received, the
  credit that lets the shard sample another (at most ``replay.prefetch`` in flight).
- DEALER -> the parameter server's rpc ROUTER (found with LOOKUP "params"):
  WEIGHTS every ``publish_interval`` updates, answered with ACK {version}.

The update math is ``zrl.algos.dqn``; this class only moves data.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import zmq

from zrl.algos.dqn import NonFiniteLossError, dqn_update, soft_update
from zrl.models import model_to_arrays
from zrl.roles.base import Role, RoleError, load_checkpoint_file
from zrl.runtime import limit_torch_threads
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

BATCH_ARRAYS: dict[str, tuple[str | None, int | None]] = {
    "obs": ("float32", 2),
    "action": ("int64", 1),
    "reward": ("float32", 1),
    "discount": ("float32", 1),
    "next_obs": ("float32", 2),
    "weight": ("float32", 1),
    "key": ("int64", 1),
}
PARAMS_LOOKUP_INTERVAL_S = 1.0
PARAMS_ACK_TIMEOUT_S = 3.0
MAX_NON_FINITE_IN_A_ROW = 10


def make_adam(params: Any, lr: float) -> torch.optim.Optimizer:
    """Adam, fused where this torch supports it on the CPU (fewer kernel launches per step)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def check_transition_batch(msg: P.Message, spec: dict[str, tuple[str | None, int | None]]) -> str:
    """What every BATCH of replay transitions must be: the kind, the arrays of ``spec``, a
    shard id (priorities go back to it) and one length for all arrays. Returns the shard id;
    raises ProtocolError."""
    if msg.kind != P.BATCH:
        raise P.ProtocolError(f"batches stream carries {msg.kind!r}, expected batch")
    P.require_arrays(msg, spec)
    shard = msg.meta.get("shard")
    if not isinstance(shard, str):
        raise P.ProtocolError("batch without a shard id")
    n = len(msg.arrays["key"])
    if any(a.shape[0] != n for a in msg.arrays.values()):
        raise P.ProtocolError("batch arrays of different lengths")
    return shard


class Learner(Role):
    role = "learner"

    def setup(self) -> None:
        cfg = self.config
        limit_torch_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.seed)
        probe = self.make_envs(num_envs=1)  # only for the spaces
        self.online = self.make_model(probe.single_observation_space, probe.single_action_space)
        # Discrete actions only; continuous learners check actions against the model's bounds.
        self.num_actions = int(getattr(probe.single_action_space, "n", 0))
        probe.close()
        self.setup_updates()
        self.params: Channel | None = None
        self.params_endpoint = ""
        self._next_lookup = 0.0
        self._unacked_since: float | None = None
        self.updates = 0
        self.weights_version = 0
        self.last_loss = float("nan")
        self.resumed_from: int | None = None
        self.params_acked = False
        self.diverged = False
        self.non_finite_in_a_row = 0
        self.waiting_since: float | None = time.monotonic()
        self.started = time.monotonic()
        self.checkpoint = self.checkpoint_path()
        self.next_checkpoint = time.monotonic() + cfg.checkpoint.interval
        self.load_checkpoint()
        self.send_weights()  # every actor starts from the learner's (initial or resumed) weights

    def setup_updates(self) -> None:
        """What the algorithm updates with: DQN's target network, optimizer and sockets."""
        self.target = copy.deepcopy(self.online)
        self.optimizer = make_adam(self.online.parameters(), self.config.learner.lr)
        self.open_batches()
        self.priority_pub = self.open_publisher("priorities")

    def open_batches(self) -> None:
        """The ``batches`` PULL from the replay shards and the PUB of our acks back to them."""
        self.batches = self.open_pull("batches", hwm=2)
        self.batch_acks = self.open_publisher("batch-acks")

    # --- parameter server -------------------------------------------------------------

    def _connect_params(self) -> bool:
        if self.params is not None:
            return True
        now = time.monotonic()
        if now < self._next_lookup:
            return False
        self._next_lookup = now + PARAMS_LOOKUP_INTERVAL_S
        services = self.lookup("params", timeout=1.0)
        if not services:
            self.log.info("no parameter server registered yet")
            return False
        sock = self._sock(zmq.DEALER, sndhwm=4, sndtimeo_ms=0)
        sock.connect(services[0]["rpc"])
        self.params_endpoint = services[0]["rpc"]
        self.params = self._channel(sock, "params-rpc")
        return True

    def send_weights(self) -> None:
        if not self._connect_params():
            return
        assert self.params is not None
        msg = P.Message(
            P.WEIGHTS,
            # min_version: after a resume, versions continue instead of starting again at 1.
            meta={
                "updates": self.updates,
                "min_version": self.weights_version + 1,
                **self.weights_meta(),
            },
            arrays=model_to_arrays(self.online),
        )
        if self.params.send(msg, block=False) and self._unacked_since is None:
            self._unacked_since = time.monotonic()

    def weights_meta(self) -> dict[str, int]:
        """Extra integers published with the weights (the algorithm's progress)."""
        return {}

    def read_acks(self) -> None:
        if self.params is None:
            return
        while True:
            got = self.params.recv(block=False)
            if got is None:
                break
            if got[1].kind == P.ACK and isinstance(got[1].meta.get("version"), int):
                self.weights_version = got[1].meta["version"]
                self._unacked_since = None
                self.params_acked = True
        if (
            self._unacked_since is not None
            and time.monotonic() - self._unacked_since > PARAMS_ACK_TIMEOUT_S
        ):
            # The parameter server restarted elsewhere or died: find it again.
            self.log.warning(
                "parameter server %s stopped answering; looking it up again", self.params_endpoint
            )
            self.params.close()
            self._channels.remove(self.params)
            self.params = None
            self._unacked_since = None

    # --- updates ----------------------------------------------------------------------

    def on_batch(self, msg: P.Message) -> None:
        shard = check_transition_batch(msg, BATCH_ARRAYS)
        n = len(msg.arrays["key"])
        # A batch that does not fit the model must be dropped, not crash the update.
        obs_dim = getattr(self.online, "obs_dim", None)
        if obs_dim is not None and (
            msg.arrays["obs"].shape[1] != obs_dim or msg.arrays["next_obs"].shape[1] != obs_dim
        ):
            raise P.ProtocolError(f"batch observations are not {obs_dim} wide")
        actions = msg.arrays["action"]
        if n and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        for name in ("obs", "reward", "discount", "next_obs", "weight"):
            if not np.all(np.isfinite(msg.arrays[name])):
                raise P.ProtocolError(f"batch array {name!r} is not finite")
        batch = {k: torch.from_numpy(np.array(v)) for k, v in msg.arrays.items() if k != "key"}
        lc = self.config.learner
        started = time.perf_counter()
        try:
            result = dqn_update(
                self.online, self.target, self.optimizer, batch,
                double=lc.double, huber_delta=lc.huber_delta, grad_clip=lc.grad_clip,
            )  # fmt: skip
        except NonFiniteLossError as exc:
            self.on_non_finite(exc, f"a batch from {shard}")
        self.non_finite_in_a_row = 0
        self.updates += 1
        self.last_loss = result.loss
        self.train_stats.add(
            loss=result.loss, q_mean=result.q_mean, grad_norm=result.grad_norm,
            update_ms=(time.perf_counter() - started) * 1e3,
        )  # fmt: skip
        self.train_stats.add_array("td_error", result.td)
        self.priority_pub.send(
            P.Message(
                P.PRIORITIES,
                arrays={
                    "key": np.ascontiguousarray(msg.arrays["key"]),
                    "priority": result.td.astype(np.float32),
                },
            ),
            topic=P.priority_topic(shard),
            block=False,
        )
        if self.updates % lc.target_update_interval == 0:
            soft_update(self.target, self.online, 1.0)
        if self.updates % lc.publish_interval == 0:
            self.send_weights()

    def on_non_finite(self, exc: NonFiniteLossError, source: str) -> NoReturn:
        """A NaN/inf loss, raised before the optimizer step, so the weights are intact. One
        such batch (e.g. huge values from a peer) is dropped; a run of them means we diverged:
        stop cleanly, keeping the last good checkpoint and published weights."""
        self.non_finite_in_a_row += 1
        if self.non_finite_in_a_row < MAX_NON_FINITE_IN_A_ROW:
            raise P.ProtocolError(f"{source} gives a {exc}") from None
        self.diverged = True
        raise RoleError(
            f"{self.id}: {exc} at update {self.updates + 1} on {source}; "
            f"stopping without applying it (published weights v{self.weights_version} intact)"
        ) from None

    # --- checkpoints ------------------------------------------------------------------

    def checkpoint_path(self) -> Path | None:
        d = self.config.checkpoint.dir
        return Path(d) / f"{self.id}.pt" if d else None

    def save_checkpoint(self) -> None:
        if self.checkpoint is None:
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        state = {
            **self.checkpoint_state(),
            "updates": self.updates,
            "weights_version": self.weights_version,
            "torch_rng": torch.get_rng_state(),
            "time": time.time(),
        }
        tmp = self.checkpoint.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint)  # atomic: a crash mid-write leaves the old one
        self.checkpoints += 1

    def checkpoint_state(self) -> dict[str, Any]:
        """The algorithm's state in a checkpoint (networks and optimizer)."""
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])

    def load_checkpoint(self) -> None:
        self.checkpoints = 0
        if self.checkpoint is None or not self.checkpoint.is_file():
            return
        state = load_checkpoint_file(self.checkpoint)
        self.restore_checkpoint_state(state)
        self.updates = int(state["updates"])
        self.weights_version = int(state["weights_version"])
        torch.set_rng_state(state["torch_rng"])
        self.resumed_from = self.updates
        self.log.info(
            "resumed from %s: update %d, weights v%d",
            self.checkpoint,
            self.updates,
            self.weights_version,
        )

    def step(self) -> None:
        if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
            self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
            self.save_checkpoint()
        self.read_acks()
        if not self.params_acked and self._unacked_since is None:
            self.send_weights()  # until the parameter server has our first version
        got = self.batches.recv()  # waits up to the socket's 100 ms receive timeout
        if got is None:
            if self.waiting_since is None:
                self.waiting_since = time.monotonic()
            return
        self.waiting_since = None
        self.ack_batch(got[1])
        try:
            self.on_batch(got[1])
        except RoleError:
            raise
        except (P.ProtocolError, RuntimeError) as exc:  # RuntimeError: torch rejected the batch
            self.batches._drop(got[1].sender or "?", str(exc))

    def ack_batch(self, msg: P.Message) -> None:
        """Credit back to the shard: acked on receipt, before training, so the shard samples
        the next batch while this one trains. A malformed batch is acked too: it left the
        pipe all the same."""
        shard = msg.meta.get("shard")
        if isinstance(shard, str) and shard.startswith("replay-"):
            self.batch_acks.send(
                P.Message(P.ACK, meta={"seq": msg.seq}),
                topic=P.batch_ack_topic(shard),
                block=False,
            )

    def teardown(self) -> None:
        # A graceful stop resumes exactly where it stopped; a diverged learner keeps the last
        # good checkpoint instead of overwriting it.
        if getattr(self, "checkpoint", None) is not None and not self.diverged:
            self.save_checkpoint()

    def train_info(self) -> dict[str, float]:
        """The learning rate of the (first) optimizer: constant unless a scheduler moves it."""
        optimizer = getattr(self, "optimizer", None) or getattr(self, "critic_optimizer", None)
        if optimizer is None:
            return {}
        return {"lr": float(optimizer.param_groups[0]["lr"])}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "updates": self.updates,
            "weights_version": self.weights_version,
            "loss": round(self.last_loss, 5) if np.isfinite(self.last_loss) else None,
        }
        info["checkpoints"] = self.checkpoints
        if self.waiting_since is not None:
            info["waiting_for_batches_s"] = round(time.monotonic() - self.waiting_since, 1)
        return info
