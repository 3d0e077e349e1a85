"""``PolicyLearners``: a learner update's place among its policy's learners
(``roles.learners > 1``: DD-PPO, IMPALA, APPO and the off-policy algorithms): its rank, the
group it forms with them (:class:`zrl.distributed.learner_group.LearnerGroup`) and what every
such update does with it; shared by ``zrl.algos.ppo.update``, ``zrl.algos.kernel.unrolls``
and ``zrl.algos.kernel.batch_update``.

The group itself (the rendezvous through the broker, its generations, re-forming, the
collectives) is ``zrl.distributed``'s and knows nothing of learning; this side finds rank 0's
store through the broker, copies rank 0's weights and optimizer state into every rank
whenever the group forms, steps on the averaged gradients (a NaN/inf one raises
``NonFiniteLossError`` on every rank) and keeps the rounds of the learners of replay's
batches.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zrl.algos.kernel.optim import clipped_gradients
from zrl.distributed.learner_group import CollectiveError, LearnerGroup

if TYPE_CHECKING:
    from zrl.algos.api.learner import LearnerSetup

IDLE_ROUND_S = 1.0
"""Learners that train the batches replay deals them (every algorithm but PPO): seconds
without a batch after which a learner joins the group's next round without one
(:meth:`PolicyLearners.idle_due`)."""
WAITING_BATCHES = 1
"""Batches taken in while a collective waits, at most (then the input waits in the socket,
and the shards' credit with it): one, which the learner's next step trains instead of
receiving one (a backlog would only age the batches)."""


class PolicyLearners:
    """A learner update's place among its policy's learners (``roles.learners`` of one policy,
    every algorithm with ``data_parallel``): its rank, the group it forms with them (None for
    a lone learner) and what every such update does with it: find rank 0's store address
    through the broker, form the group before training, publish only from rank 0, step on the
    gradients averaged over the group, re-form it after a failed collective (rank 0's state
    copied into every rank once it has), and show its rank and generation in the heartbeat.

    For the learners of replay's batches (IMPALA, APPO and the off-policy algorithms: every
    learner trains the batches dealt to it, one round of collectives per batch) also the
    rounds' bookkeeping: :meth:`sync` at the start of each (the newest version and the
    weights' fingerprint), :meth:`idle_due`, :meth:`trim` of a backlog, and a batch taken in
    while a collective waits (``waiting``)."""

    def __init__(self, setup: LearnerSetup) -> None:
        cfg = setup.config
        self.services = setup.services
        self.size = cfg.learners_per_policy()
        self.rank = cfg.learner_rank(setup.index)
        self.leader = self.rank == 0
        self.model = setup.model
        self.log = setup.log
        # One group per policy (a league's players each train alone: they never average).
        self.leader_id = f"learner-{setup.index - self.rank}"
        self.group = (
            LearnerGroup(
                self.rank,
                self.size,
                advertise=self.services.advertise,
                find_leader=self.find_leader,
                timeout_s=cfg.learner.group_timeout_s,
                device=setup.device,
                log=setup.log,
            )
            if self.size > 1
            else None
        )
        self.optimizer: torch.optim.Optimizer | None = None
        """The update's optimizer: rank 0's state of it goes to every rank of a group formed
        again, with the weights (:meth:`take_leaders_state`)."""
        self.generator: torch.Generator | None = None
        """A random generator every rank must hold in the same state (DD-PPO's minibatch
        order): rank 0's goes along too."""
        self.shared_state: Callable[[], dict[str, Any]] | None = None
        self.load_shared_state: Callable[[dict[str, Any]], None] | None = None
        """Where an update holds more than one optimizer (target networks, several
        optimizers, a temperature, an update count that phases its steps): all of its state,
        rank 0's copied into every rank with the weights whenever the group forms."""
        self.waiting: Callable[[], int] | None = None
        """The batches the update holds untrained, for the updates that train replay's
        batches: while fewer than ``WAITING_BATCHES`` wait, :meth:`tick` takes in one that
        arrives (``services.take_input``: acked, then received)."""
        self.version = 0
        """The newest weights version any learner of the group knows (rank 0's, which
        publishes), agreed on at each :meth:`sync`: a follower's staleness is measured
        against it."""
        self.weight_drift = 0.0
        """The spread of the learners' weights at the last :meth:`sync` (0 by construction;
        anything else is corrected from rank 0 and counted)."""
        self.drift_corrections = 0
        self.backlog_batches = 0
        """Batches dropped unread from a backlog (:meth:`trim`)."""
        self.idle_rounds = 0
        """Rounds this learner joined without a batch (:meth:`begin_round`)."""
        self.last_round = time.monotonic()
        """When this learner last began a round (with a batch or none)."""

    def tick(self) -> None:
        """What runs every ``TICK_S`` while a collective waits: the role's heartbeats
        (``services.tick``) and, for an update with ``waiting``, a batch that arrived
        meanwhile taken in while fewer than ``WAITING_BATCHES`` wait. A learner that waits
        for another which has no batch yet must not hold the shards' credit
        (``replay.prefetch``) unacked in its socket: the batch the other waits for would not
        be sampled."""
        self.services.tick()
        if self.waiting is not None and self.waiting() < WAITING_BATCHES:
            self.services.take_input()

    def find_leader(self) -> str | None:
        """Rank 0's group store ticket ``host:port#key``, from its heartbeat (the broker)."""
        info = self.services.role_info(self.leader_id)
        address = info.get("group_store") if info else None
        return address if isinstance(address, str) else None

    @property
    def ready(self) -> bool:
        """Whether the group has formed (always, for a lone learner)."""
        return self.group is None or self.group.ready

    @property
    def reformed(self) -> bool:
        """Whether the group is on a generation past 1 (formed again after a learner left)."""
        return self.group is not None and self.group.generation > 1

    def poll(self) -> bool:
        """One step of the rendezvous; True once the group is formed (LearnerGroupError past
        ``learner.group_timeout_s``). A group that has formed (the first time, or again after
        a learner left) first takes rank 0's weights and optimizer state
        (:meth:`take_leaders_state`): learners resumed from checkpoints of different times,
        or a restarted one, start from rank 0's."""
        group = self.group
        if group is None or group.ready:
            return True
        if not group.poll():
            return False
        try:
            self.take_leaders_state()
        except CollectiveError as exc:
            self.rejoin(exc)
            return False
        return True

    def take_leaders_state(self) -> None:
        """Copy rank 0's model state (parameters and buffers) into every rank's (one
        broadcast), then its ``optimizer``'s state and ``generator``'s (serialized, one
        broadcast of bytes), whenever the group forms: a restarted or resumed rank starts from
        its own checkpoint or none, and with other Adam moments the same mean gradient would
        move its weights apart again at every step."""
        group = self.group
        assert group is not None
        stop = self.services.stop_event
        group.broadcast(list(self.model.state_dict().values()), self.tick, stop)
        data = None
        if self.leader:
            state = {
                "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                "generator": self.generator.get_state() if self.generator else None,
                "update": self.shared_state() if self.shared_state else None,
            }
            out = io.BytesIO()
            torch.save(state, out)
            data = out.getvalue()
        data = group.broadcast_bytes(data, self.tick, stop)
        if not self.leader:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            if self.optimizer is not None and state["optimizer"] is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            if self.generator is not None and state["generator"] is not None:
                self.generator.set_state(state["generator"])
            if self.load_shared_state is not None and state["update"] is not None:
                self.load_shared_state(state["update"])
        self.log.info(
            "learner group: formed on generation %d; rank 0's weights and optimizer taken",
            group.generation,
        )

    def rejoin(self, exc: CollectiveError) -> None:
        """After a failed collective (what was being trained is dropped): re-form the group
        on the next generation (:meth:`LearnerGroup.rejoin`), logged as a warning (quietly
        where this learner is stopping: the others are stopping too)."""
        assert self.group is not None
        if self.services.stop_event.is_set():
            self.log.info("learner group: %s (the learner stops)", exc)
        else:
            self.log.warning("learner group: %s; re-forming the group", exc)
        self.group.rejoin()

    def may_publish(self) -> bool:
        """Rank 0 speaks for all, once the group has formed (the first weights start the
        actors)."""
        return self.leader and self.ready

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module | Sequence[torch.Tensor],
        loss: torch.Tensor | None,
        weight: torch.Tensor | float,
        grad_clip: float,
    ) -> float | None:
        """One optimizer step on the group's weighted mean gradient: ``zero_grad``, backward
        of ``loss`` (None: this rank has no sample for this step and adds zeros), the
        all-reduce (:meth:`LearnerGroup.average_gradients`, ``weight`` this rank's samples),
        clipping to ``grad_clip``, the step. Every rank computes the same mean, so every rank
        takes the same step, or none: the pre-clip norm, or None where no rank had a sample.
        A NaN/inf loss on any rank poisons the mean, so every rank raises
        NonFiniteLossError before its step."""
        assert self.group is not None
        optimizer.zero_grad(set_to_none=True)
        params = list(model.parameters()) if isinstance(model, nn.Module) else list(model)
        w = torch.as_tensor(weight, dtype=torch.float32)
        if loss is not None:
            loss.backward()
            if not bool(torch.isfinite(loss.detach())):
                w = torch.tensor(float("nan"))
        else:
            loss, w = torch.zeros(()), torch.zeros(())
        total = self.group.average_gradients(params, self.tick, self.services.stop_event, weight=w)
        if total == 0:
            return None
        grad_norm = clipped_gradients(loss, params, grad_clip)
        optimizer.step()
        return float(grad_norm)

    # --- the rounds of the learners of replay's batches -------------------------------

    def sync(self, version: int, tensors: list[torch.Tensor]) -> int:
        """At the start of each batch's round, one small all-reduce (max) over the group of
        every learner's weights ``version`` and of a fingerprint of ``tensors`` (the update's
        weights and whatever else must agree: the sum of each tensor, and its negation:
        their maxima give the spread). Returns the newest version; a spread other than 0 (the
        group formed from rank 0's state, so only a fault makes one) is measured
        (``weight_drift``), counted and corrected: every learner takes rank 0's ``tensors``
        (its optimizer moments stay its own)."""
        assert self.group is not None
        sums = torch.stack([t.detach().double().sum() for t in tensors]).cpu()
        values = torch.cat([sums, -sums, torch.tensor([float(version)], dtype=torch.float64)])
        values = values.to(self.group.device)
        self.group.reduce_max(values, self.tick, self.services.stop_event)
        n = len(tensors)
        spread = values[:n] + values[n : 2 * n]  # max - min of each tensor's sum
        self.weight_drift = float(spread.abs().max())
        if self.weight_drift != 0:
            self.drift_corrections += 1
            self.log.warning(
                "learner group: weights %g apart at a batch; taking rank 0's", self.weight_drift
            )
            self.group.broadcast(tensors, self.tick, self.services.stop_event)
        self.version = max(self.version, int(values[-1]))
        return max(version, self.version)

    def idle_due(self) -> bool:
        """In a group: ``IDLE_ROUND_S`` passed without a round, so this learner joins the next
        one without a batch (the others, which hold batches, do not wait for its next one: a
        shard that stopped, batches dealt out unevenly)."""
        return self.group is not None and time.monotonic() - self.last_round > IDLE_ROUND_S

    def begin_round(self, idle: bool) -> None:
        """A round starts now, with a batch of this learner's or (``idle``) without one."""
        self.last_round = time.monotonic()
        self.idle_rounds += idle

    def trim(self, pending: int, drop: Callable[[], None]) -> None:
        """In a group, where every learner trains one batch per round: ``drop`` (and count)
        the ``pending`` batches that came while the group formed, and later the oldest
        beyond ``WAITING_BATCHES + 1``. A backlog would never drain, and every batch would
        wait behind it, growing stale."""
        keep = WAITING_BATCHES + 1 if self.ready else 0
        for _ in range(pending - keep):
            drop()
            self.backlog_batches += 1

    def round_info(self) -> dict[str, Any]:
        """The rounds' figures for the heartbeat (``group_version``, ``weight_drift``,
        ``drift_corrections``, ``backlog_batches``, ``idle_rounds``); none for a lone
        learner."""
        if self.group is None:
            return {}
        return {
            "group_version": self.version,
            "weight_drift": self.weight_drift,
            "drift_corrections": self.drift_corrections,
            "backlog_batches": self.backlog_batches,
            "idle_rounds": self.idle_rounds,
        }

    def heartbeat_info(self) -> dict[str, Any]:
        """``group_rank``, ``group_size``, ``group_formed``, ``group_generation`` (the
        rendezvous generation joined), ``group_reforms`` (groups formed on a generation past
        1), ``group_bad_values`` (where any: values of the store that were no generation),
        and rank 0's ``group_store`` (the ticket the others find through the broker) with its
        store's ``group_store_rejected`` (requests dropped: no valid key, replayed,
        malformed) and ``group_store_refused`` (authenticated ones refused: an invalid value,
        past its bound); nothing for a lone learner."""
        if self.group is None:
            return {}
        info: dict[str, Any] = {
            "group_rank": self.rank,
            "group_size": self.size,
            "group_formed": self.group.ready,
            "group_generation": self.group.generation,
            "group_reforms": self.group.reforms,
        }
        if self.group.bad_values:
            info["group_bad_values"] = self.group.bad_values
        server = self.group.server
        if self.group.address is not None and server is not None:
            info["group_store"] = self.group.address
            info["group_store_rejected"] = server.rejected
            info["group_store_refused"] = server.table.refused
        return info

    def summary(self) -> str:
        """``, rank r of a group of n`` for the learner's last line (empty when alone)."""
        return f", rank {self.rank} of a group of {self.size}" if self.group is not None else ""

    def close(self) -> None:
        """Destroy the group."""
        if self.group is not None:
            self.group.close()
