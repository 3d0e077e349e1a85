"""``BatchUpdate``: the ``train`` of the learner updates that take one step per replay BATCH
(Ape-X DQN, R2D2, DDPG / TD3, SAC, QMIX); each says only what one step does. ``QTargetUpdate``:
the state of the Q-learning ones (an online network, its target copy, one optimizer).

Several learners of one policy (``roles.learners > 1``, data-parallel): a ``torch.distributed``
group (``zrl.algos.kernel.policy_learners.PolicyLearners``, formed through the broker before the
first batch). Replay deals its batches to the learners in turn; each learner trains the batches it
receives, one round of collectives per batch: :meth:`PolicyLearners.sync` (the newest weights
version, and the fingerprint of the weights and the targets: any drift is corrected from rank 0),
then every optimizer step of the algorithm's step (the critic's, the actor's, the temperature's) on
the gradients averaged over the group, weighted by the learners' batch sizes
(:meth:`BatchUpdate.optimizer_step`). The steps an algorithm takes per batch depend only on the
config and the update count (TD3's delayed actor, the target updates), which every learner holds
alike, so every learner takes the same steps in the same order. A learner without a batch for
``IDLE_ROUND_S`` joins the next round without one: it runs its step on its last batch, adding
nothing to the means (weight 0), so that it takes the same steps; where no learner has a batch, no
step is taken. Learner 0 alone publishes; a learner that dies fails the others' collective, the
batch is dropped and the group re-formed with its restarted learner, rank 0's whole update state
(weights, targets, every optimizer, the update count) copied into every learner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from zrl.algos.api.learner import (
    BaseUpdate,
    LearnerSetup,
    NonFiniteLossError,
    Priorities,
    UpdateResult,
)
from zrl.algos.kernel.batches import DeviceBatch, PendingBatches, policy_lags
from zrl.algos.kernel.optim import checked_step
from zrl.algos.kernel.policy_learners import PolicyLearners
from zrl.distributed.learner_group import CollectiveError

if TYPE_CHECKING:
    from zrl.algos.api.train_stats import TrainStats


class NoStepTaken(Exception):
    """In a learner group: no learner had a batch for this round's steps (every learner is
    idle): no step is taken, on any learner."""


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
    model: Any
    target: Any
    send_priorities: bool = True
    """Whether a result carries the new priorities (a uniform table has no use for them)."""
    members: PolicyLearners
    """Its place among the policy's learners (a group where ``roles.learners > 1``)."""
    group: Any = None
    round_weight = 0.0
    """In a group: this learner's part of the round's mean gradients (its batch's items; 0
    in an idle round)."""
    last_batch: dict[str, Tensor] | None = None
    """In a group: the last batch trained, which an idle round runs the step on."""

    def join_learners(self, setup: LearnerSetup) -> None:
        """Take its place among the policy's learners (the subclass's ``__init__`` calls it
        last, once the model, targets, optimizers and ``pending`` exist)."""
        self.members = PolicyLearners(setup)
        self.group = self.members.group
        self.members.waiting = self.pending.__len__
        self.members.shared_state = lambda: {**self.state_dict(), "updates": self.updates}
        self.members.load_shared_state = self.load_state_dict

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        """One update on a batch's tensors; NonFiniteLossError before a non-finite step."""
        raise NotImplementedError

    def update_targets(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint state: weights, targets, optimizers."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (and ``updates``, where ``state`` carries it)."""
        raise NotImplementedError

    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        loss: Tensor,
        parameters: Sequence[Tensor],
        grad_clip: float,
    ) -> float:
        """The step every optimizer of the update takes (``zrl.algos.kernel.optim.StepFn``,
        handed to the algorithm's math): :func:`checked_step` alone; in a group, the step on the
        group's weighted mean gradient (``PolicyLearners.step``), this learner's ``loss``
        left out in an idle round, NoStepTaken where no learner had a batch."""
        if self.group is None:
            return checked_step(optimizer, loss, parameters, grad_clip)
        mine = loss if self.round_weight > 0 else None
        norm = self.members.step(optimizer, parameters, mine, self.round_weight, grad_clip)
        if norm is None:
            raise NoStepTaken
        return norm

    def group_tensors(self) -> list[Tensor]:
        """What every learner of a group must hold alike, fingerprinted at each round: the
        weights and the targets."""
        return [*self.model.state_dict().values(), *self.target.state_dict().values()]

    def train(self, version: int) -> UpdateResult | None:
        """One update on the oldest kept batch (the learner trains after every receive, so
        there is one; a result carries the priorities of one shard's batch). In a group, a
        round over it (see the module docstring)."""
        if self.group is not None:
            return self.train_in_group(version)
        sampled = self.pending.pop()
        if sampled is None:
            return None
        return self.train_batch(sampled, version)

    def train_in_group(self, version: int) -> UpdateResult | None:
        """A round of the group: form it first; then the oldest kept batch, or none where
        ``IDLE_ROUND_S`` passed without one (and this learner has trained one before)."""
        members = self.members
        members.trim(len(self.pending), self.drop_oldest)
        if not members.ready:
            members.poll()  # LearnerGroupError past learner.group_timeout_s
            return None
        sampled = self.pending.pop()
        if sampled is None and (self.last_batch is None or not members.idle_due()):
            return None
        members.begin_round(idle=sampled is None)
        try:
            version = members.sync(version, self.group_tensors())
            if sampled is None:
                return self.idle_batch()
            self.round_weight = float(len(sampled.keys))
            result = self.train_batch(sampled, version)
            self.last_batch = sampled.tensors
            return result
        except NoStepTaken:
            return None
        except CollectiveError as exc:  # a learner died or left: batch dropped, group re-formed
            members.rejoin(exc)
            return None

    def drop_oldest(self) -> None:
        """Drop the oldest kept batch unread (a group's backlog, ``PolicyLearners.trim``)."""
        self.pending.pop()

    def idle_batch(self) -> UpdateResult:
        """In a group, a round without a batch of this learner's: the step on its last batch
        with weight 0 (the same optimizer steps as the others', adding nothing to their
        means), the target update when due; no priorities, no samples."""
        assert self.last_batch is not None
        self.round_weight = 0.0
        try:
            result = self.step(self.last_batch)
        except NonFiniteLossError as exc:
            exc.source = "an idle round (another learner's part)"
            raise
        self.updates += 1
        if result.targets_due:
            self.update_targets()
        return UpdateResult(updates=1, loss=math.nan)

    def train_batch(self, sampled: DeviceBatch, version: int) -> UpdateResult:
        """One update on ``sampled``."""
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

    def may_publish(self) -> bool:
        return self.members.may_publish()

    def heartbeat_info(self) -> dict[str, Any]:
        return {**self.members.heartbeat_info(), **self.members.round_info()}

    def summary(self) -> str:
        return self.members.summary().removeprefix(", ")

    def close(self) -> None:
        """Destroy the learner group (if any)."""
        self.members.close()


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
