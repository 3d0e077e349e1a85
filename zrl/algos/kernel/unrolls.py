"""``UnrollUpdate``: the learner side shared by the algorithms that train on whole unrolls from
the replay shards' FIFO queues (IMPALA, APPO), all but the training itself; and
:func:`unroll_outputs`, the model's outputs over a batch of unrolls that both train on.

- ``receive``: a BATCH of whole unrolls, each with the weights version it was collected with,
  in the unroll batch schema of the model (``zrl.transport.messages.experience_schema``:
  ``frame_`` on frame stacks ``[k, H, W]``, ``recurrent_`` for a recurrent model,
  ``continuous_`` for a Gaussian policy), checked against it (observation width, state width,
  actions in ``[0, num_actions)``, k frames per stack); a malformed one raises ProtocolError.
  Its fresh unrolls start for the device at once (``zrl.algos.kernel.batches.HostStaging``).
- ``train``: takes the oldest kept batch; its unrolls more than ``max_lag`` versions behind
  the learner are dropped and counted (``stale_unrolls``), never trained on (V-trace corrects
  a small lag, not an arbitrary one). The policy lag of the rest goes to the training metrics
  (``policy_lag`` and ``policy_lag_max``), and the subclass's :meth:`train_unrolls` trains on
  them (a frame batch's stacks rebuilt on the learner's device first,
  ``zrl.codecs.frames.stacks_from_frames``). A :class:`NonFiniteLossError` it raises names the
  shard of the batch, which is dropped, never retried. On a GPU (``defer_checks``) nothing is
  read back to the host per update: the loss, ``mean_rho`` and the figures stay tensors until
  the metrics report, a NaN/inf step is skipped on the device
  (``zrl.algos.kernel.optim.deferred_step``) and the result's ``finite`` flag tells the learner,
  which reads it one update later.
- the checkpoint state (the model and its Adam), the learning rate and the heartbeat counters.
- several learners of one policy (``roles.learners > 1``, data-parallel): a ``torch.distributed``
  group (``zrl.algos.kernel.policy_learners.PolicyLearners``); each learner trains the batches
  it receives, every step on the gradients averaged over the group (weighted by the learners'
  valid steps), and every batch takes :meth:`UnrollUpdate.steps_per_batch` steps on every
  learner. At each batch one all-reduce (max) agrees on the newest weights version and
  compares the weights (``weight_drift``). Learner 0 alone publishes. Idle learners, backlog
  and re-forming: docs/algorithms.md ("Several IMPALA or APPO learners"). Sockets: the group's
  (``zrl.distributed.learner_group``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor, nn

from zrl.algos.api.learner import BaseUpdate, LearnerSetup, NonFiniteLossError, UpdateResult
from zrl.algos.kernel.batches import HostStaging, InFlight, policy_lags
from zrl.algos.kernel.optim import checked_step, deferred_step, defers_checks, make_adam
from zrl.algos.kernel.policy_learners import PolicyLearners
from zrl.codecs.frames import is_frame_space, stacks_from_frames
from zrl.distributed.learner_group import CollectiveError
from zrl.nets.encoders import observe_inputs
from zrl.nets.gaussian import check_distribution, distribution_of
from zrl.nets.recurrent import RecurrentActorCritic, is_recurrent
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
RECURRENT_FRAME_TRAINED_ARRAYS = (*FRAME_TRAINED_ARRAYS, "state", "first")
"""A recurrent model's on frame stacks."""


def unroll_outputs(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """The model's ``(logits [B, T, A], values [B, T], bootstrap_values [B])`` (a Gaussian
    model's logits are its params ``[B, T, 2A]``, ``zrl.nets.gaussian``) over a batch of
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


class PendingUnrolls(NamedTuple):
    """A received batch: what the host keeps of it, and its fresh unrolls on their way to the
    device."""

    shard: str
    versions: np.ndarray
    """Each unroll's ``weights_version`` (all of them, stale ones too)."""
    valid: np.ndarray
    rows: np.ndarray
    """The unrolls fresh when it arrived, in ``moving``: those fresh at ``train`` are among
    them (versions only grow)."""
    moving: InFlight | None


class UnrollUpdate(BaseUpdate):
    """The actor-critic, its Adam and the queue of received unroll batches; subclasses give
    :meth:`train_unrolls`."""

    def __init__(self, setup: LearnerSetup, max_lag: int) -> None:
        self.config = setup.config
        self.log = setup.log
        self.train_stats = setup.train_stats
        self.model = setup.model
        self.optimizer = make_adam(
            self.model.parameters(), self.config.learner.lr, self.config.learner.adam_eps
        )
        self.num_actions = int(getattr(setup.action_space, "n", 0))
        self.continuous = distribution_of(self.model).continuous
        check_distribution(self.model, setup.action_space)
        """Box actions (the Gaussian policy): :data:`CONTINUOUS_UNROLL_BATCH`, float32 actions
        ``[B, T, A]``, any finite value (the samples before the actors clipped them)."""
        self.obs_shape = M.obs_shape(setup.observation_space)
        self.device = torch.device(setup.device)
        self.recurrent = is_recurrent(self.model)
        self.frames = is_frame_space(setup.observation_space)
        """Frame stacks ``[k, H, W]`` come as :data:`FRAME_UNROLL_BATCH`
        (:data:`RECURRENT_FRAME_UNROLL_BATCH` for a recurrent model), as the replay shard's
        layout, ``zrl.replay.layout``, takes them from the actors."""
        self.sizes: dict[str, Size] = {"O": self.obs_shape[1:] if self.frames else self.obs_shape}
        self.trained_arrays: tuple[str, ...]
        if self.continuous:
            if self.recurrent or self.frames:
                raise ValueError("a Gaussian policy is feed-forward over flat observations")
            self.sizes["A"] = math.prod(setup.action_space.shape)
        self.schema = M.experience_schema(
            "unroll",
            batch=True,
            frames=self.frames,
            recurrent=self.recurrent,
            continuous=self.continuous,
        )
        self.trained_arrays = {
            (False, False): TRAINED_ARRAYS,
            (False, True): RECURRENT_TRAINED_ARRAYS,
            (True, False): FRAME_TRAINED_ARRAYS,
            (True, True): RECURRENT_FRAME_TRAINED_ARRAYS,
        }[self.frames, self.recurrent]
        if self.recurrent:
            self.sizes["R"] = cast(RecurrentActorCritic, self.model).state_size
        self.max_lag = max_lag
        self.updates = 0
        """Updates this object made (for the summary); restored from the learner's
        ``updates`` when its checkpoint carries one."""
        self.stale_unrolls = 0
        self.trained_unrolls = 0
        self.mean_rho: float | Tensor = math.nan
        """The last update's mean importance ratio (a 0-d tensor where it was computed)."""
        self.pending: deque[PendingUnrolls] = deque()
        """Received batches not trained on yet, on their way to the device."""
        self.staging = HostStaging(self.device)
        """The fresh rows' way to the device (reused pinned buffers, a copy stream)."""
        self.members = PolicyLearners(setup)
        """Its place among the policy's learners (``roles.learners > 1``: data-parallel, the
        gradients of every step averaged over their group)."""
        self.group = self.members.group
        self.defer_checks = self.group is None and defers_checks(self.optimizer, self.device)
        """Finiteness checked on the device, read by the learner one update later
        (``UpdateResult.finite``): on a GPU, alone. Otherwise a NaN/inf raises at once."""
        self.members.waiting = self.pending.__len__
        self.members.optimizer = self.optimizer

    def receive(self, msg: P.Message, version: int) -> None:
        """Check a batch and start moving its fresh unrolls (at ``version``) to the device: on
        a GPU the copy runs on the staging's stream while the update before it trains."""
        dims = validate(msg, self.schema, **self.sizes)
        if self.frames and dims["S"] != dims["T"] + self.obs_shape[0]:
            raise P.ProtocolError(
                f"batch frames: {dims['S']} per unroll of {dims['T']} steps, not T + "
                f"{self.obs_shape[0]}"
            )
        a = msg.arrays
        actions = a["action"]
        if self.continuous:
            pass  # float32 samples, checked finite by the schema
        elif dims["B"] and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise P.ProtocolError(f"batch actions outside [0, {self.num_actions})")
        rows = self.fresh_rows(a["weights_version"], self.current_version(version))
        picked = rows if len(rows) < len(a["weights_version"]) else None  # None: all of them
        moving = None  # all stale: nothing to move
        if len(rows):
            moving = self.staging.move({name: a[name] for name in self.trained_arrays}, picked)
        shard = str(msg.meta.get("shard", "?"))
        self.pending.append(PendingUnrolls(shard, a["weights_version"], a["valid"], rows, moving))

    def fresh_rows(self, versions: np.ndarray, version: int) -> np.ndarray:
        """Indices of the unrolls at most ``max_lag`` versions behind ``version``."""
        lag = version - versions
        return np.flatnonzero(lag <= self.max_lag)

    def current_version(self, version: int) -> int:
        """The version staleness is measured against: the learner's own (acked by the
        parameter server), or in a group the newest its learners agreed on."""
        return version if self.group is None else max(version, self.members.version)

    def train(self, version: int) -> UpdateResult | None:
        """:meth:`train_unrolls` on the fresh unrolls of the oldest kept batch; None when there
        is none, or all of its unrolls are stale. In a group (``roles.learners > 1``) the
        learners first form it; then every batch, fresh or not, takes the same
        :meth:`steps_per_batch` on the group's averaged gradients, after a :meth:`sync_group`
        (each step is a collective: every learner must take as many)."""
        if self.group is not None:
            self.members.trim(len(self.pending), self.drop_oldest)
        if not self.members.ready:
            self.members.poll()  # LearnerGroupError past learner.group_timeout_s
            return None
        idle = self.members.idle_due()
        if not self.pending and not idle:
            return None
        try:
            if not self.pending:
                return self.idle_round(version)
            return self.train_batch(version)
        except CollectiveError as exc:  # a learner died or left: batch dropped, group re-formed
            self.members.rejoin(exc)
            return None

    def train_batch(self, version: int) -> UpdateResult | None:
        """Train on the oldest kept batch (see :meth:`train`)."""
        kept = self.pending.popleft()  # dropped, not retried, if it raises
        if self.group is not None:
            self.members.begin_round(idle=False)
            version = self.sync_group(version)
        rows = self.fresh_rows(kept.versions, version)
        rows = rows[np.isin(rows, kept.rows)]  # fresh then and now (versions only grow)
        self.stale_unrolls += len(kept.versions) - len(rows)
        if len(rows) == 0 or kept.moving is None:
            if self.group is None:
                return None
            return self.idle_batch(f"a batch from {kept.shard}")
        lags = policy_lags(kept.versions[rows], version)
        self.train_stats.add_array("policy_lag", lags)  # policy_lag and policy_lag_max
        batch = kept.moving.wait()
        if len(rows) < len(kept.rows):  # more went stale since it arrived
            at = torch.from_numpy(np.searchsorted(kept.rows, rows)).to(self.device)
            batch = {name: tensor[at] for name, tensor in batch.items()}
        if self.frames:  # zero padding, as zrl's Atari envs stack (zrl.envs.atari)
            batch["obs"], batch["bootstrap_obs"] = stacks_from_frames(
                batch.pop("frames"), batch["valid"]
            )
        observe_inputs(self.model, batch["obs"])  # once per batch, whatever the epochs
        try:
            result = self.train_unrolls(batch)
        except NonFiniteLossError as exc:
            exc.source = f"a batch from {kept.shard}"
            raise
        self.trained_unrolls += len(rows)
        result.samples = int(kept.valid[rows].sum())
        return result

    # --- several learners of one policy (a group) ----------------------------------------

    def idle_round(self, version: int) -> UpdateResult | None:
        """In a group, ``IDLE_ROUND_S`` without a batch: a batch's round of collectives with
        none (:meth:`sync_group`, then :meth:`idle_batch`), so that the others, which hold
        batches, do not wait for this learner's next one (a shard that stopped, batches dealt
        out unevenly); where every learner is idle, the round takes no step."""
        self.members.begin_round(idle=True)
        self.sync_group(version)
        return self.idle_batch("an idle round")

    def drop_oldest(self) -> None:
        """Drop the oldest kept batch unread, its unrolls counted stale (a group's backlog,
        ``PolicyLearners.trim``)."""
        old = self.pending.popleft()
        self.stale_unrolls += len(old.versions)

    def sync_group(self, version: int) -> int:
        """At the start of each batch: the group's newest version, and its weights checked
        to agree (``PolicyLearners.sync``)."""
        return self.members.sync(version, list(self.model.state_dict().values()))

    def steps_per_batch(self) -> int:
        """The optimizer steps :meth:`train_unrolls` takes on any batch (in a group, where
        every learner must take as many)."""
        raise NotImplementedError

    def step(self, loss: Tensor, valid: Tensor, finite: Tensor | None) -> tuple[Any, Any]:
        """One optimizer step on ``loss`` (a mean over the ``valid`` steps) and the
        ``(grad_norm, finite)`` of the subclass's loop: checked at once (``finite`` None), on
        the device (a GPU learner alone) or, in a group, on the gradients averaged over it,
        weighted by each learner's valid steps (``PolicyLearners.step``: a step no learner
        had a sample for is not taken, and its norm is None; the caller does not count it)."""
        params = list(self.model.parameters())
        grad_clip = self.config.learner.grad_clip
        if self.group is not None:
            norm = self.members.step(self.optimizer, self.model, loss, valid.sum(), grad_clip)
            return norm, finite
        if finite is None:
            return checked_step(self.optimizer, loss, params, grad_clip), None
        return deferred_step(self.optimizer, loss, params, grad_clip, finite)

    def idle_batch(self, source: str) -> UpdateResult | None:
        """In a group, a batch with no fresh unroll: its steps taken on the others'
        gradients (this learner adds none), so that every learner takes as many; None when
        no learner had a sample for any of them (no step taken, no new weights)."""
        try:
            steps = sum(self.idle_step() for _ in range(self.steps_per_batch()))
        except NonFiniteLossError as exc:
            exc.source = f"{source} (another learner's part)"
            raise
        return UpdateResult(updates=steps, loss=math.nan) if steps else None

    def idle_step(self) -> int:
        """In a group, a step without a sample of this learner's, on the others' mean: 1 if
        it was taken (counted), 0 where no learner had a sample."""
        grad_clip = self.config.learner.grad_clip
        if self.members.step(self.optimizer, self.model, None, 0.0, grad_clip) is None:
            return 0
        self.updates += 1
        return 1

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
        mean_rho = float(self.mean_rho)  # a tensor on the device: read here, once a beat
        if math.isfinite(mean_rho):
            info["mean_rho"] = round(mean_rho, 3)
        info.update(self.members.heartbeat_info())
        info.update(self.members.round_info())
        return info

    def may_publish(self) -> bool:
        return self.members.may_publish()

    def summary(self) -> str:
        return (
            f"{self.updates} updates on {self.trained_unrolls} unrolls, {self.stale_unrolls} "
            f"stale unrolls dropped (max_lag {self.max_lag}){self.members.summary()}"
        )

    def close(self) -> None:
        """Destroy the learner group (if any)."""
        self.members.close()
