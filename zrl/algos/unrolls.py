"""``UnrollUpdate``: the learner side shared by the algorithms that train on whole unrolls from
the replay shards' FIFO queues (IMPALA, APPO), all but the training itself; and
:func:`unroll_outputs`, the model's outputs over a batch of unrolls that both train on.

- ``receive``: a BATCH of :data:`zrl.transport.messages.UNROLL_BATCH` (whole unrolls, each
  with the weights version it was collected with; :data:`RECURRENT_UNROLL_BATCH`, with each
  unroll's recurrent state and episode starts, for a recurrent model;
  :data:`FRAME_UNROLL_BATCH` for a feed-forward model on frame stacks ``[k, H, W]``, each
  frame once), checked against the model (observation width, state width, actions in
  ``[0, num_actions)``, k frames per stack) and kept; a malformed one raises ProtocolError.
- ``train``: takes the oldest kept batch; its unrolls more than ``max_lag`` versions behind
  the learner are dropped and counted (``stale_unrolls``), never trained on (V-trace corrects
  a small lag, not an arbitrary one). The policy lag of the rest goes to the training metrics
  (``policy_lag`` and ``policy_lag_max``), and the subclass's :meth:`train_unrolls` trains on
  them (a frame batch's stacks rebuilt on the learner's device first,
  ``zrl.nets.frames.stacks_from_frames``). A :class:`NonFiniteLossError` it raises names the
  shard of the batch, which is dropped, never retried.
- the checkpoint state (the model and its Adam), the learning rate and the heartbeat counters.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from zrl.algos.api.learner import BaseUpdate, LearnerSetup, NonFiniteLossError, UpdateResult
from zrl.algos.batches import HostStaging, policy_lags
from zrl.algos.optim import make_adam
from zrl.nets.encoders import observe_inputs
from zrl.nets.frames import stacks_from_frames
from zrl.nets.recurrent import RecurrentActorCritic, is_recurrent
from zrl.replay.frames import is_frame_space
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import Size, validate

# The arrays of an unroll batch that the updates read (weights_version only picks the rows).
TRAINED_ARRAYS = ("obs", "action", "logp", "reward", "terminated", "valid", "bootstrap_obs")
RECURRENT_TRAINED_ARRAYS = (*TRAINED_ARRAYS, "state", "first")
"""A recurrent model's: also the state each unroll started from and its episode starts."""
FRAME_TRAINED_ARRAYS = ("frames", "action", "logp", "reward", "terminated", "valid")
"""A frame batch's: ``frames`` in place of ``obs`` and ``bootstrap_obs``, which the learner
rebuilds from them on its device."""


def unroll_outputs(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """The model's ``(logits [B, T, A], values [B, T], bootstrap_values [B])`` over a batch of
    env-major unrolls (``obs [B, T, *O]``, ``bootstrap_obs [B, *O]``, ``valid [B, T]``), with
    gradients (callers detach what they hold constant).

    Feed-forward (``model(obs) -> (logits, values)``): one forward pass over the ``B * T``
    observations and the ``B`` bootstrap observations together (only the batch and time axes
    are flattened: any observation shape and dtype reaches the model as it came).

    Recurrent (``zrl.nets.recurrent``; the batch also holds ``state [B, R]`` and ``first [B, T]``):
    ``model.unroll`` from each unroll's recorded state, zeroed before the steps ``first``
    marks, then one ``model.step`` on ``bootstrap_obs`` from the state after the last step,
    zeroed where that step only reset the env (``valid[:, -1]`` False: the actor starts an
    episode at that observation). The actor computed the same, step by step.
    """
    if is_recurrent(model):
        rnn = cast(RecurrentActorCritic, model)
        logits, values, final = rnn.unroll(batch["obs"], batch["state"], batch["first"])
        restart = ~batch["valid"][:, -1:].bool()
        _, bootstrap, _ = rnn.step(batch["bootstrap_obs"], final.masked_fill(restart, 0.0))
        return logits, values, bootstrap
    B, T = batch["valid"].shape
    obs = batch["obs"].flatten(0, 1)  # [B * T, *obs_shape]
    logits_all, values_all = model(torch.cat([obs, batch["bootstrap_obs"]]))
    logits = logits_all[: B * T].reshape(B, T, -1)
    return logits, values_all[: B * T].reshape(B, T), values_all[B * T :]


class UnrollUpdate(BaseUpdate):
    """The actor-critic, its Adam and the queue of received unroll batches; subclasses give
    :meth:`train_unrolls`."""

    def __init__(self, setup: LearnerSetup, max_lag: int) -> None:
        self.config = setup.config
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.optimizer = make_adam(
            self.model.parameters(), self.config.learner.lr, self.config.learner.adam_eps
        )
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        self.obs_shape = M.obs_shape(setup.observation_space)
        self.device = torch.device(setup.device)
        self.recurrent = is_recurrent(self.model)
        self.frames = not self.recurrent and is_frame_space(setup.observation_space)
        """Frame stacks ``[k, H, W]`` come as :data:`FRAME_UNROLL_BATCH` (as the replay
        shard's layout, ``zrl.replay.layout``, takes them from the actors)."""
        self.sizes: dict[str, Size] = {"O": self.obs_shape}
        self.trained_arrays: tuple[str, ...]
        if self.recurrent:
            self.schema, self.trained_arrays = M.RECURRENT_UNROLL_BATCH, RECURRENT_TRAINED_ARRAYS
            self.sizes["R"] = cast(RecurrentActorCritic, self.model).state_size
        elif self.frames:
            self.schema, self.trained_arrays = M.FRAME_UNROLL_BATCH, FRAME_TRAINED_ARRAYS
            self.sizes["O"] = self.obs_shape[1:]
        else:
            self.schema, self.trained_arrays = M.UNROLL_BATCH, TRAINED_ARRAYS
        self.max_lag = max_lag
        self.updates = 0
        """Updates this object made (for the summary); restored from the learner's
        ``updates`` when its checkpoint carries one."""
        self.stale_unrolls = 0
        self.trained_unrolls = 0
        self.mean_rho = math.nan
        self.pending: deque[tuple[str, dict[str, np.ndarray]]] = deque()
        """Received batches not trained on yet: (shard, arrays)."""
        self.staging = HostStaging(self.device)
        """The fresh rows' way to the device (reused pinned buffers, a copy stream)."""

    def receive(self, msg: P.Message, version: int) -> None:
        dims = validate(msg, self.schema, **self.sizes)
        if self.frames and dims["S"] != dims["T"] + self.obs_shape[0]:
            raise P.ProtocolError(
                f"batch frames: {dims['S']} per unroll of {dims['T']} steps, not T + "
                f"{self.obs_shape[0]}"
            )
        actions = msg.arrays["action"]
        if dims["B"] and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        self.pending.append((str(msg.meta.get("shard", "?")), msg.arrays))

    def fresh_rows(self, versions: np.ndarray, version: int) -> np.ndarray:
        """Indices of the unrolls at most ``max_lag`` versions behind ``version``."""
        lag = version - versions
        return np.flatnonzero(lag <= self.max_lag)

    def train(self, version: int) -> UpdateResult | None:
        """:meth:`train_unrolls` on the fresh unrolls of the oldest kept batch; None when there
        is none, or all of its unrolls are stale."""
        if not self.pending:
            return None
        shard, a = self.pending.popleft()  # dropped, not retried, if it raises
        rows = self.fresh_rows(a["weights_version"], version)
        self.stale_unrolls += len(a["weights_version"]) - len(rows)
        if len(rows) == 0:
            return None
        lags = policy_lags(a["weights_version"][rows], version)
        self.train_stats.add_array("policy_lag", lags)  # policy_lag and policy_lag_max
        picked = rows if len(rows) < len(a["weights_version"]) else None  # None: all of them
        batch = self.staging.move({name: a[name] for name in self.trained_arrays}, picked).wait()
        if self.frames:  # zero padding, as zrl's Atari envs stack (zrl.envs.atari)
            batch["obs"], batch["bootstrap_obs"] = stacks_from_frames(
                batch.pop("frames"), batch["valid"]
            )
        observe_inputs(self.model, batch["obs"])  # once per batch, whatever the epochs
        try:
            result = self.train_unrolls(batch)
        except NonFiniteLossError as exc:
            exc.source = f"a batch from {shard}"
            raise
        self.trained_unrolls += len(rows)
        result.samples = int(a["valid"][rows].sum())
        return result

    def train_unrolls(self, batch: dict[str, Tensor]) -> UpdateResult:
        """Train on fresh unrolls: ``batch`` holds the :data:`TRAINED_ARRAYS` (the
        :data:`RECURRENT_TRAINED_ARRAYS` for a recurrent model), env-major ``[B, T, ...]``
        (``bootstrap_obs [B, ...]``, ``state [B, R]``): what :func:`unroll_outputs` reads."""
        raise NotImplementedError

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
            f"stale unrolls dropped (max_lag {self.max_lag})"
        )
