"""``ImpalaUpdate``: the learner side of IMPALA, V-trace actor-critic updates on unrolls.

The generic learner role owns the sockets: it acks every BATCH from the replay shards' FIFO
queues, hands it to :meth:`ImpalaUpdate.receive`, then calls :meth:`ImpalaUpdate.train` with
its current weights version, and publishes the weights of ``model`` every
``learner.publish_interval`` updates. IMPALA sends no priorities.

- ``receive``: a BATCH of :data:`zrl.transport.messages.UNROLL_BATCH` (whole unrolls, each
  with the weights version it was collected with), checked against the model (observation
  width, actions in ``[0, num_actions)``) and kept; a malformed one raises ProtocolError.
- ``train``: unrolls more than ``impala.max_lag`` versions behind the learner are dropped and
  counted (``stale_unrolls``), never trained on: V-trace corrects a small lag, not an
  arbitrary one. On the rest, ``impala.epochs`` updates; the result carries the last loss.

A NaN/inf loss raises :class:`NonFiniteLossError` before the optimizer step (the weights are
intact); the batch is dropped, never retried. The math is
``zrl.algos.impala.vtrace.impala_update``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from zrl.algos.api import BaseUpdate, LearnerSetup, NonFiniteLossError, UpdateResult
from zrl.algos.batches import to_device
from zrl.algos.impala.vtrace import impala_update
from zrl.algos.optim import make_adam
from zrl.transport import messages as M
from zrl.transport import protocol as P

# The arrays of an unroll batch that the update reads (weights_version only picks the rows).
TRAINED_ARRAYS = ("obs", "action", "logp", "reward", "terminated", "valid", "bootstrap_obs")


class ImpalaUpdate(BaseUpdate):
    """The actor-critic and its Adam; ``impala.epochs`` updates per batch of fresh unrolls."""

    def __init__(self, setup: LearnerSetup) -> None:
        self.config = setup.config
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.device = torch.device(setup.device)
        self.optimizer = make_adam(self.model.parameters(), self.config.learner.lr)
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        self.obs_shape = M.obs_shape(setup.observation_space)
        self.updates = 0
        """Updates this object made (for the summary); restored from the learner's
        ``updates`` when its checkpoint carries one."""
        self.stale_unrolls = 0
        self.trained_unrolls = 0
        self.mean_rho = math.nan
        self.pending: deque[tuple[str, dict[str, np.ndarray]]] = deque()
        """Received batches not trained on yet: (shard, arrays)."""

    def receive(self, msg: P.Message, version: int) -> None:
        dims = M.validate(msg, M.UNROLL_BATCH, O=self.obs_shape)
        actions = msg.arrays["action"]
        if dims["B"] and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        self.pending.append((str(msg.meta.get("shard", "?")), msg.arrays))

    def fresh_rows(self, versions: np.ndarray, version: int) -> np.ndarray:
        """Indices of the unrolls at most ``impala.max_lag`` versions behind ``version``."""
        lag = version - versions
        return np.flatnonzero(lag <= self.config.impala.max_lag)

    def train(self, version: int) -> UpdateResult | None:
        """``impala.epochs`` updates on the fresh unrolls of the oldest kept batch; None when
        there is none, or all of its unrolls are stale."""
        if not self.pending:
            return None
        shard, a = self.pending.popleft()  # dropped, not retried, if it raises
        rows = self.fresh_rows(a["weights_version"], version)
        self.stale_unrolls += len(a["weights_version"]) - len(rows)
        if len(rows) == 0:
            return None
        batch = to_device({name: a[name][rows] for name in TRAINED_ARRAYS}, self.device)
        c = self.config.impala
        lag = float(np.mean(version - a["weights_version"][rows]))
        loss = math.nan
        for _ in range(c.epochs):
            started = time.perf_counter()
            try:
                result = impala_update(
                    self.model, self.optimizer, batch, gamma=c.gamma, rho_bar=c.rho_bar,
                    c_bar=c.c_bar, entropy_coef=c.entropy_coef, value_coef=c.value_coef,
                    grad_clip=self.config.learner.grad_clip, lambda_=c.vtrace_lambda,
                )  # fmt: skip
            except NonFiniteLossError as exc:
                exc.source = f"a batch from {shard}"
                raise
            self.updates += 1
            loss = result.parts["loss"]
            self.mean_rho = result.mean_rho
            self.train_stats.add(
                **result.parts, grad_norm=result.grad_norm, mean_rho=result.mean_rho,
                policy_lag=lag, update_ms=(time.perf_counter() - started) * 1e3,
            )  # fmt: skip
        self.trained_unrolls += len(rows)
        return UpdateResult(updates=c.epochs, loss=loss)

    def state_dict(self) -> dict[str, Any]:
        return {"online": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state.get("updates", 0))

    def train_info(self) -> dict[str, float]:
        return {"lr": float(self.optimizer.param_groups[0]["lr"])}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "stale_unrolls": self.stale_unrolls,
            "trained_unrolls": self.trained_unrolls,
        }
        if math.isfinite(self.mean_rho):
            info["mean_rho"] = round(self.mean_rho, 3)
        return info

    def summary(self) -> str:
        return (
            f"{self.updates} updates on {self.trained_unrolls} unrolls, {self.stale_unrolls} "
            f"stale unrolls dropped (max_lag {self.config.impala.max_lag})"
        )
