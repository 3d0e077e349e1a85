"""``ApexDQNUpdate``: the learner side of Ape-X DQN, (double) n-step DQN on replay batches.

The generic learner role owns the sockets: it acks every BATCH, hands it to
:meth:`ApexDQNUpdate.receive`, then calls :meth:`ApexDQNUpdate.train`, publishes the
priorities of the result to the shard that sampled the batch, and publishes the weights of
``model`` every ``learner.publish_interval`` updates.

- ``receive``: a BATCH of :data:`zrl.transport.messages.TRANSITION_BATCH` from a replay shard
  (meta ``shard``), checked against the model (observation width, actions in
  ``[0, num_actions)``) and kept; a malformed one raises ProtocolError (dropped).
- ``train``: one gradient step per kept batch, the hard target update every
  ``learner.target_update_interval`` updates, and an :class:`UpdateResult` carrying the new
  priorities ``|td error|`` of the batch's keys for its shard.

A NaN/inf loss raises :class:`NonFiniteLossError` before the optimizer step (the weights are
intact); the batch is dropped, never retried. The math is ``zrl.algos.apex_dqn.losses``.
"""

from __future__ import annotations

import copy

from torch import Tensor

from zrl.algos.apex_dqn.losses import dqn_update
from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep, QTargetUpdate
from zrl.algos.kernel.batches import PendingBatches
from zrl.algos.kernel.optim import make_adam
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate


class ApexDQNUpdate(QTargetUpdate):
    """Online and target Q-networks and their Adam; one update per replay batch."""

    def __init__(self, setup: LearnerSetup) -> None:
        self.config = setup.config
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.target = copy.deepcopy(self.model)
        self.optimizer = make_adam(
            self.model.parameters(), self.config.learner.lr, self.config.learner.adam_eps
        )
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        self.obs_shape = M.obs_shape(setup.observation_space)
        self.updates = 0
        """Updates this object made (the phase of the target updates); restored from the
        learner's ``updates`` when its checkpoint carries one."""
        self.pending = PendingBatches(setup.device)
        """Received batches not trained on yet: (shard, keys, tensors)."""
        self.join_learners(setup)

    def receive(self, msg: P.Message, version: int) -> None:
        dims = validate(msg, M.TRANSITION_BATCH, O=self.obs_shape)
        actions = msg.arrays["action"]
        if dims["B"] and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        self.pending.add(msg)

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        lc = self.config.learner
        result = dqn_update(
            self.model,
            self.target,
            self.optimizer,
            batch,
            double=lc.double,
            huber_delta=lc.huber_delta,
            grad_clip=lc.grad_clip,
            step=self.optimizer_step,
        )
        figures = {"loss": result.loss, "q_mean": result.q_mean, "grad_norm": result.grad_norm}
        targets_due = (self.updates + 1) % lc.target_update_interval == 0
        return BatchStep(result.loss, result.td, figures, targets_due)
