"""``R2D2Update``: the learner side of R2D2, stored-state sequence Q-learning on replay batches.

The generic learner role acks every BATCH, hands it to :meth:`R2D2Update.receive` and calls
``train`` (``BatchUpdate``): one gradient step per batch of sequences, the hard target update
every ``learner.target_update_interval`` updates, and the batch's new sequence priorities
``eta * max|td| + (1 - eta) * mean|td|`` for the shard that sampled it.

One step, for a batch of ``B`` sequences of ``L`` steps (``L + 1`` observations):

1. The online network unrolls from each sequence's stored state (zeros with
   ``r2d2.zero_state``), resetting where ``first`` says an episode starts: the ``burn_in``
   leading steps without gradient, the rest with it
   (``zrl.algos.kernel.q_learning.burn_in_unroll``).
2. The target network unrolls the whole sequence from the same state, without gradient.
3. Double-Q bootstrap values ``h^-1(Q_target(s, argmax_a Q_online(s, a)))`` at every position,
   n-step targets over the real steps (``mask``), rescaled by ``h``.
4. The loss over the trained steps (after the burn-in), weighted by the importance weights.

On uint8 frame stacks ``[k, H, W]`` (Atari) the batches are ``frame_sequence_batch``es (each
sequence's frames once): each step first rebuilds ``obs`` from them on the learner's device
(``zrl.codecs.frames.sequence_stacks_from_frames``, zero padding as zrl's Atari envs stack).

A NaN/inf loss raises :class:`NonFiniteLossError` before the optimizer step.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from zrl.algos.api.learner import LearnerSetup
from zrl.algos.kernel.batch_update import BatchStep, QTargetUpdate
from zrl.algos.kernel.batches import PendingBatches
from zrl.algos.kernel.optim import make_adam
from zrl.algos.kernel.q_learning import burn_in_unroll, nstep_double_q_targets
from zrl.algos.r2d2.config import R2D2Config
from zrl.algos.r2d2.losses import inverse_value_rescale, r2d2_loss, sequence_priority, value_rescale
from zrl.codecs.frames import is_frame_space, sequence_stacks_from_frames
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import Size, validate


class R2D2Update(QTargetUpdate):
    """Online and target recurrent Q-networks and their Adam; one update per batch."""

    def __init__(self, setup: LearnerSetup) -> None:
        self.config = setup.config
        self.train_stats = setup.train_stats
        self.model: Any = setup.model
        self.target: Any = copy.deepcopy(self.model)
        self.optimizer = make_adam(
            self.model.parameters(), self.config.learner.lr, self.config.learner.adam_eps
        )
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        self.obs_shape = M.obs_shape(setup.observation_space)
        self.state_size: int = setup.model.state_size  # type: ignore[assignment]
        self.frames = is_frame_space(setup.observation_space)
        """Frame stacks come as :data:`~zrl.transport.messages.FRAME_SEQUENCE_BATCH` (as the
        replay shard's layout, ``zrl.replay.layout``, takes them from the actors)."""
        L = self.config.section(R2D2Config).sequence_length
        self.schema = M.experience_schema("sequences", batch=True, frames=self.frames)
        self.sizes: dict[str, Size] = {
            "O": self.obs_shape,
            "R": self.state_size,
            "T": L,
            "P": L + 1,
        }
        if self.frames:
            self.sizes.update(O=self.obs_shape[1:], S=L + self.obs_shape[0])
        self.updates = 0
        self.pending = PendingBatches(setup.device)
        self.send_priorities = self.config.replay.table == "prioritized"
        self.join_learners(setup)

    def receive(self, msg: P.Message, version: int) -> None:
        dims = validate(msg, self.schema, **self.sizes)
        actions = msg.arrays["action"]
        if dims["B"] and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        self.pending.add(msg)

    def step(self, batch: dict[str, Tensor]) -> BatchStep:
        c, rc, lc = self.config.section(R2D2Config), self.config.replay, self.config.learner
        first, state = batch["first"], batch["state"]
        if self.frames:  # zero padding, as zrl's Atari envs stack (zrl.envs.atari)
            obs = sequence_stacks_from_frames(batch["frames"], first, batch["mask"])
        else:
            obs = batch["obs"]
        if c.zero_state:
            state = torch.zeros_like(state)
        L, burn = c.sequence_length, c.burn_in
        q_burn, q_train = burn_in_unroll(self.model.unroll, obs, state, first, burn)
        with torch.no_grad():
            q_target, _ = self.target.unroll(obs, state, first)
            q_online = torch.cat((q_burn, q_train.detach()), dim=1)
            best = q_online.argmax(dim=-1, keepdim=True)
            boot = inverse_value_rescale(q_target.gather(-1, best)[..., 0], c.rescale_epsilon)
            raw = nstep_double_q_targets(
                batch["reward"], batch["terminated"], batch["mask"], boot, rc.gamma, rc.n_step
            )
            targets = value_rescale(raw, c.rescale_epsilon)[:, burn:]
        action = batch["action"][:, burn:]
        q_taken = q_train[:, : L - burn].gather(-1, action[..., None])[..., 0]
        train_mask = batch["mask"][:, burn:]
        loss, td = r2d2_loss(q_taken, targets, train_mask, batch["weight"])
        params = list(self.model.parameters())
        grad_norm = self.optimizer_step(self.optimizer, loss, params, lc.grad_clip)
        priorities = sequence_priority(td, train_mask, c.priority_eta)
        masked = q_taken.detach()[train_mask]
        figures = {
            "loss": float(loss.item()),
            "q_mean": float(masked.mean().item()) if masked.numel() else 0.0,
            "grad_norm": grad_norm,
        }
        targets_due = (self.updates + 1) % lc.target_update_interval == 0
        return BatchStep(float(loss.item()), priorities.cpu().numpy(), figures, targets_due)
