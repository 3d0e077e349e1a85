"""``BatchUpdate``: the ``train`` of the learner updates that take one step per replay BATCH
(Ape-X DQN, R2D2, DDPG / TD3, SAC); each says only what one step does. ``QTargetUpdate``: the
state of the Q-learning ones (an online network, its target copy, one optimizer)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from zrl.algos.api.learner import BaseUpdate, NonFiniteLossError, Priorities, UpdateResult
from zrl.algos.batches import PendingBatches, policy_lags

if TYPE_CHECKING:
    from zrl.algos.api.train_stats import TrainStats


class BatchStep(NamedTuple):
    """What :meth:`BatchUpdate.step` did with one batch."""

    loss: float
    td: np.ndarray
    """``|TD error|`` per item: the figure ``td_error`` and the items' new priorities."""
    figures: dict[str, Any]
    """For ``train_stats`` (``update_ms`` is added)."""
    targets_due: bool
    """Update the target networks now (:meth:`BatchUpdate.update_targets`)."""


class BatchUpdate(BaseUpdate):
    """A learner update whose ``receive`` keeps batches in ``pending`` and whose ``train``
    takes one ``step`` on the oldest: it names the batch's shard in a NonFiniteLossError,
    counts the update, records the figures, the TD errors and the policy lag of the batch's
    items (``policy_lag``, ``policy_lag_max``: versions between the weights each item was
    collected with and the learner's, as the unroll learners report it), updates the
    targets when due and returns the new priorities for the shard."""

    pending: PendingBatches
    train_stats: TrainStats
    updates: int
    send_priorities: bool = True
    """Whether a result carries the new priorities (a uniform table has no use for them)."""

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        """One update on a batch's tensors; NonFiniteLossError before a non-finite step."""
        raise NotImplementedError

    def update_targets(self) -> None:
        raise NotImplementedError

    def train(self, version: int) -> UpdateResult | None:
        """One update on the oldest kept batch (the learner trains after every receive, so
        there is one; a result carries the priorities of one shard's batch)."""
        sampled = self.pending.pop()
        if sampled is None:
            return None
        started = time.perf_counter()
        try:
            result = self.step(sampled.tensors)
        except NonFiniteLossError as exc:
            exc.source = f"a batch from {sampled.shard}"
            raise
        self.updates += 1
        self.train_stats.add(**result.figures, update_ms=(time.perf_counter() - started) * 1e3)
        self.train_stats.add_array("td_error", result.td)
        self.train_stats.add_array("policy_lag", policy_lags(sampled.versions, version))
        if result.targets_due:
            self.update_targets()
        priorities = (
            Priorities(sampled.shard, sampled.keys, result.td.astype(np.float32))
            if self.send_priorities
            else None
        )
        return UpdateResult(
            updates=1, loss=result.loss, priorities=priorities, samples=len(sampled.keys)
        )


class QTargetUpdate(BatchUpdate):
    """A ``BatchUpdate`` of one online network (``model``), its ``target`` copy, updated by a
    hard copy when due, and one ``optimizer`` (Ape-X DQN, R2D2): their checkpoint state and
    the learning rate."""

    model: Any
    target: Any
    optimizer: torch.optim.Optimizer

    def update_targets(self) -> None:
        self.target.load_state_dict(self.model.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.model.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state.get("updates", 0))

    def train_info(self) -> dict[str, float]:
        return {"lr": float(self.optimizer.param_groups[0]["lr"])}
