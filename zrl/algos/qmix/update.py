"""``QMIXUpdate``: the learner side of QMIX, one gradient step per replay batch of team
transitions.

- ``receive``: a BATCH of :data:`zrl.transport.messages.TRANSITION_BATCH` from a replay shard,
  validated with the team's observation width ``O = L * slot`` (from the env's spaces and the
  model's agents, never from the message), its joint actions in ``[0, A^L)``; a malformed one
  raises ProtocolError (dropped).
- ``train``: :func:`zrl.algos.qmix.losses.qmix_update` (the agent network and the mixer
  together), the hard copy to the target agent network and mixer every
  ``qmix.target_update_interval`` updates. A uniform table: no priorities go back.

With ``model.core`` the batches are :data:`zrl.transport.messages.SEQUENCE_BATCH`es of team
sequences (``T = qmix.sequence_length`` steps, ``O = L * slot``, the agents' states
``R = L * state_size``, all from the config, the spaces and the model) and ``train`` runs
:func:`zrl.algos.qmix.losses.qmix_sequence_update` (stored states, ``qmix.burn_in``,
``replay.n_step`` and ``replay.gamma`` over each sequence).

A NaN/inf loss raises :class:`NonFiniteLossError` before the optimizer step; the batch is
dropped, never retried.
"""

from __future__ import annotations

import copy

from torch import Tensor

from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep, QTargetUpdate
from zrl.algos.kernel.batches import PendingBatches
from zrl.algos.kernel.optim import make_adam
from zrl.algos.qmix.config import QMIXConfig
from zrl.algos.qmix.losses import qmix_sequence_update, qmix_update
from zrl.nets.recurrent import is_recurrent
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import Size, validate


class QMIXUpdate(QTargetUpdate):
    """The online model (agent network + mixer), its target copy and their Adam."""

    send_priorities = False

    def __init__(self, setup: LearnerSetup) -> None:
        self.config = setup.config
        self.qmix = setup.config.section(QMIXConfig)
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.target = copy.deepcopy(self.model)
        self.optimizer = make_adam(
            self.model.parameters(), self.config.learner.lr, self.config.learner.adam_eps
        )
        agents = int(self.model.agents)
        self.team_obs = (agents * M.obs_shape(setup.observation_space)[0],)
        self.joint_actions = int(setup.action_space.n) ** agents
        self.recurrent = is_recurrent(self.model)
        self.schema = M.SEQUENCE_BATCH if self.recurrent else M.TRANSITION_BATCH
        self.sizes: dict[str, Size] = {"O": self.team_obs}
        if self.recurrent:
            T = self.qmix.sequence_length
            self.sizes.update(T=T, P=T + 1, R=agents * int(self.model.state_size))
        self.updates = 0
        self.pending = PendingBatches(setup.device)
        self.join_learners(setup)

    def receive(self, msg: P.Message, version: int) -> None:
        dims = validate(msg, self.schema, **self.sizes)
        actions = msg.arrays["action"]
        if dims["B"] and (actions.min() < 0 or actions.max() >= self.joint_actions):
            raise P.ProtocolError(f"batch joint actions outside [0, {self.joint_actions})")
        self.pending.add(msg)

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        if self.recurrent:
            result = qmix_sequence_update(
                self.model,
                self.target,
                self.optimizer,
                batch,
                burn_in=self.qmix.burn_in,
                gamma=self.config.replay.gamma,
                n_step=self.config.replay.n_step,
                double=self.qmix.double,
                grad_clip=self.config.learner.grad_clip,
                step=self.optimizer_step,
            )
        else:
            result = qmix_update(
                self.model,
                self.target,
                self.optimizer,
                batch,
                double=self.qmix.double,
                grad_clip=self.config.learner.grad_clip,
                step=self.optimizer_step,
            )
        figures = {
            "loss": result.loss,
            "q_tot_mean": result.q_tot_mean,
            "grad_norm": result.grad_norm,
        }
        targets_due = (self.updates + 1) % self.qmix.target_update_interval == 0
        return BatchStep(result.loss, result.td, figures, targets_due)
