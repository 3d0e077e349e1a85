"""``ImpalaLearner``: V-trace actor-critic updates on unrolls from the replay queue.

Sockets (those of ``Learner``, without priorities):

- PULL ``batches`` <- replay shards' FIFO queues: BATCH messages of whole unrolls, each
  carrying the weights version it was collected with; PUB ``batch-acks/<shard>/``: the
  credit for each (see ``Learner``).
- DEALER -> the parameter server's rpc: WEIGHTS every ``learner.publish_interval`` updates.

Unrolls more than ``impala.max_lag`` versions behind the learner are dropped and counted
(``stale_unrolls``), never trained on: V-trace corrects a small lag, not an arbitrary one.
The update math is ``zrl.algos.vtrace.impala_update``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.dqn import NonFiniteLossError
from zrl.algos.vtrace import impala_update
from zrl.roles.learner import Learner, make_adam
from zrl.transport import protocol as P

UNROLL_BATCH_ARRAYS: dict[str, tuple[str | None, int | None]] = {
    "obs": ("float32", 3),
    "action": ("int64", 2),
    "logp": ("float32", 2),
    "reward": ("float32", 2),
    "terminated": ("bool", 2),
    "valid": ("bool", 2),
    "bootstrap_obs": ("float32", 2),
    "weights_version": ("int64", 1),
}


class ImpalaLearner(Learner):
    role = "learner"

    def setup_updates(self) -> None:
        self.optimizer = make_adam(self.online.parameters(), self.config.learner.lr)
        self.open_batches()
        self.stale_unrolls = 0
        self.trained_unrolls = 0
        self.mean_rho = float("nan")

    def checkpoint_state(self) -> dict[str, Any]:
        return {"online": self.online.state_dict(), "optimizer": self.optimizer.state_dict()}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])

    def fresh_rows(self, versions: np.ndarray) -> np.ndarray:
        """Indices of the unrolls at most ``impala.max_lag`` versions behind our weights."""
        lag = self.weights_version - versions
        return np.flatnonzero(lag <= self.config.impala.max_lag)

    def on_batch(self, msg: P.Message) -> None:
        if msg.kind != P.BATCH:
            raise P.ProtocolError(f"batches stream carries {msg.kind!r}, expected batch")
        P.require_arrays(msg, UNROLL_BATCH_ARRAYS)
        a = msg.arrays
        B, T = a["reward"].shape
        for name in UNROLL_BATCH_ARRAYS:
            want = (B,) if name in ("bootstrap_obs", "weights_version") else (B, T)
            if a[name].shape[: len(want)] != want:
                raise P.ProtocolError(f"batch array {name!r} has shape {a[name].shape}")
        obs_dim = getattr(self.online, "obs_dim", None)
        if obs_dim is not None and (
            a["obs"].shape[2] != obs_dim or a["bootstrap_obs"].shape[1] != obs_dim
        ):
            raise P.ProtocolError(f"batch observations are not {obs_dim} wide")
        if B and (a["action"].min() < 0 or a["action"].max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        for name in ("obs", "logp", "reward", "bootstrap_obs"):
            if not np.all(np.isfinite(a[name])):
                raise P.ProtocolError(f"batch array {name!r} is not finite")
        rows = self.fresh_rows(a["weights_version"])
        self.stale_unrolls += B - len(rows)
        if len(rows) == 0:
            return
        batch = {
            name: torch.from_numpy(np.ascontiguousarray(a[name][rows]))
            for name in UNROLL_BATCH_ARRAYS
            if name != "weights_version"
        }
        c = self.config.impala
        lag = float(np.mean(self.weights_version - a["weights_version"][rows]))
        for _ in range(c.epochs):
            started = time.perf_counter()
            try:
                result = impala_update(
                    self.online, self.optimizer, batch, gamma=c.gamma, rho_bar=c.rho_bar,
                    c_bar=c.c_bar, entropy_coef=c.entropy_coef, value_coef=c.value_coef,
                    grad_clip=self.config.learner.grad_clip, lambda_=c.vtrace_lambda,
                )  # fmt: skip
            except NonFiniteLossError as exc:
                self.on_non_finite(exc, f"a batch from {msg.meta.get('shard', '?')}")
            self.non_finite_in_a_row = 0
            self.updates += 1
            self.last_loss = result.parts["loss"]
            self.mean_rho = result.mean_rho
            self.train_stats.add(
                **result.parts, grad_norm=result.grad_norm, mean_rho=result.mean_rho,
                policy_lag=lag, update_ms=(time.perf_counter() - started) * 1e3,
            )  # fmt: skip
            if self.updates % self.config.learner.publish_interval == 0:
                self.send_weights()
        self.trained_unrolls += len(rows)

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "stale_unrolls"):
            self.log.info(
                "%s: %d updates on %d unrolls, %d stale unrolls dropped (max_lag %d)",
                self.id, self.updates, self.trained_unrolls, self.stale_unrolls,
                self.config.impala.max_lag,
            )  # fmt: skip

    def heartbeat_info(self) -> dict[str, Any]:
        info = super().heartbeat_info()
        info["stale_unrolls"] = self.stale_unrolls
        info["trained_unrolls"] = self.trained_unrolls
        if np.isfinite(self.mean_rho):
            info["mean_rho"] = round(self.mean_rho, 3)
        return info
