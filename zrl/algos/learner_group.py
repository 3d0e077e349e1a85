"""``LearnerGroup``: the learners that train one policy together (``roles.learners > 1``:
DD-PPO, IMPALA, APPO) as a ``torch.distributed`` process group, and the mean of their
gradients over it; ``PolicyLearners``: an update's place among them (its rank, the group, and
what every such update does with it), shared by ``zrl.algos.ppo.update`` and
``zrl.algos.unrolls``.

Rendezvous, through the broker: rank 0 opens a ``torch.distributed.TCPStore`` (the master) on
a free port of its host and shows ``host:port`` (``address``, its advertised host) in its
heartbeat; the other ranks find it by asking the broker for rank 0's heartbeat info (the
``find_leader`` callable) and connect to it as clients. Every rank writes ``rank/<r>`` into
the store; once all ``world_size`` keys are there, every rank makes its process group on that
store (``ProcessGroupGloo`` on the CPU, ``ProcessGroupNCCL`` on a GPU). The group is an object
of its own, not torch's default group (``init_process_group``): learners run as threads of one
process too (``zrl run --inproc``, the role tests), and each must hold its own rank.
:meth:`LearnerGroup.poll` takes one step of this without blocking past a store connection, so
the role keeps beating (rank 0's address reaches the broker only in a heartbeat). Past
``timeout_s`` the rendezvous fails with :class:`LearnerGroupError` naming the ranks that did
not come (or, on a rank other than 0, that rank 0's address was never found).

Then :meth:`LearnerGroup.average_gradients`: one ``all_reduce`` (sum) of the model's gradients
flattened into one buffer, divided by the world size (or, weighted, by the sum of the ranks'
weights, which rides in the same buffer), copied back; an all-reduce leaves the same bits on
every rank, so every rank applies the same update. :meth:`LearnerGroup.reduce_max` (a
maximum: IMPALA's and APPO's newest version and weight fingerprints) and
:meth:`LearnerGroup.broadcast` (rank 0's tensors to all) are the other collectives. A
collective that fails (a rank died or left) raises :class:`LearnerGroupError`, which stops
the learner: a group does not go on without a rank (rejoining is not built yet).

Sockets: the store's TCP listener (rank 0, every interface, a free port) and its clients, and
the backend's own connections between the ranks; none on the broker's buses.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from zrl.algos.optim import clipped_gradients

if TYPE_CHECKING:
    from zrl.algos.api.learner import LearnerSetup

STORE_CONNECT_S = 5.0  # one try to reach rank 0's store (a stale address: try again later)
FIND_INTERVAL_S = 0.5  # between two questions to the broker for rank 0's address
TICK_S = 0.1  # while a collective waits for the other ranks: the role's heartbeats
POLL_FIRST_S, POLL_MAX_S = 1e-4, 2e-3  # its completion polled at these intervals, doubling
STOP_GRACE_S = 5.0  # a group collective failed: the time to hear that the run is stopping


class LearnerGroupError(Exception):
    """The learner group could not form in time, or a collective over it failed. Not a
    ``RuntimeError``: the learner must stop on it, not drop the batch it was training."""


def backend_for(device: torch.device | str) -> str:
    """The ``torch.distributed`` backend of learners on ``device``: nccl on a GPU, gloo on
    the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_key(rank: int) -> str:
    """The store key a rank writes when it has joined."""
    return f"zrl/rank/{rank}"


class LearnerGroup:
    """One rank's side of the learner group: rendezvous, gradient mean, destruction."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        advertise: str,
        find_leader: Callable[[], str | None],
        timeout_s: float,
        device: torch.device | str = "cpu",
        log: logging.Logger | None = None,
    ) -> None:
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"learner group rank {rank} of {world_size}: needs 0 <= rank < n, n > 1"
            )
        self.rank = rank
        self.world_size = world_size
        self.find_leader = find_leader
        self.timeout_s = timeout_s
        self.backend = backend_for(device)
        self.device = torch.device(device)
        self.log = log or logging.getLogger("zrl.learner_group")
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.started = time.monotonic()
        self.next_find = 0.0
        self.leader_address: str | None = None  # the last address found (ranks > 0)
        self.ready = False
        self.closed = False
        self.store: dist.TCPStore | None = None
        self.pg: Any = None
        self.address: str | None = None
        """Rank 0's ``host:port`` of the store, shown in its heartbeat (None on other ranks)."""
        if rank == 0:
            self.store = dist.TCPStore(
                "0.0.0.0",
                0,
                world_size=world_size,
                is_master=True,
                wait_for_workers=False,
                timeout=self.timeout,
            )
            self.address = f"{advertise}:{self.store.port}"
            self.store.set(rank_key(0), advertise)

    # --- rendezvous -------------------------------------------------------------------

    def poll(self) -> bool:
        """One step of the rendezvous; True once the group is formed. Raises
        LearnerGroupError past ``timeout_s``."""
        if self.ready:
            return True
        if self.store is None:
            self.connect()
        if self.store is not None and self.store.check(
            [rank_key(r) for r in range(self.world_size)]
        ):
            try:
                self.pg = self.make_process_group(self.store)
            except RuntimeError as exc:
                raise LearnerGroupError(
                    f"learner group rank {self.rank}: the {self.backend} group of "
                    f"{self.world_size} did not connect within {self.timeout_s:g} s (can every "
                    f"learner's host reach the others'? GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME "
                    f"pick the interface): {exc}"
                ) from exc
            self.ready = True
            self.log.info(
                "learner group of %d formed (%s, rank %d) in %.2f s",
                self.world_size,
                self.backend,
                self.rank,
                time.monotonic() - self.started,
            )
            return True
        if time.monotonic() - self.started > self.timeout_s:
            raise LearnerGroupError(self.missing())
        return False

    def make_process_group(self, store: dist.Store) -> Any:
        """This rank's process group over ``store`` (blocks until every rank connects)."""
        prefixed = dist.PrefixStore("zrl/pg", store)
        if self.backend == "nccl":
            torch.cuda.set_device(self.device)
            nccl: Any = getattr(dist, "ProcessGroupNCCL")  # noqa: B009 - CUDA builds only
            options = nccl.Options()
            options._timeout = self.timeout
            return nccl(prefixed, self.rank, self.world_size, options)
        return dist.ProcessGroupGloo(prefixed, self.rank, self.world_size, self.timeout)

    def connect(self) -> None:
        """Ranks > 0: ask for rank 0's store address and join it (at most every
        ``FIND_INTERVAL_S``; a store that does not answer is tried again later)."""
        now = time.monotonic()
        if now < self.next_find:
            return
        self.next_find = now + FIND_INTERVAL_S
        address = self.find_leader()
        if not address:
            return
        self.leader_address = address
        host, _, port = address.rpartition(":")
        left = self.timeout_s - (now - self.started)
        try:
            store = dist.TCPStore(
                host.strip("[]"),
                int(port),
                is_master=False,
                timeout=datetime.timedelta(seconds=max(0.1, min(STORE_CONNECT_S, left))),
            )
        except (RuntimeError, ValueError) as exc:
            self.log.warning("learner group: rank 0's store at %s: %s", address, exc)
            return
        store.set_timeout(self.timeout)
        store.set(rank_key(self.rank), "joined")
        self.store = store

    def missing(self) -> str:
        """Why the rendezvous has not formed: the ranks not joined, or no rank 0 found."""
        waited = f"within learner.group_timeout_s={self.timeout_s:g} s"
        if self.store is None:
            where = (
                f"its store at {self.leader_address} did not answer"
                if self.leader_address
                else "the broker never showed its store address"
            )
            return (
                f"learner group rank {self.rank}: rank 0 (learner-0's store) not reached "
                f"{waited}: {where}"
            )
        absent = [r for r in range(self.world_size) if not self.store.check([rank_key(r)])]
        return (
            f"learner group of {self.world_size} not formed {waited}: rank(s) "
            f"{absent} never joined (the learners of those indices did not start, or cannot "
            f"reach {self.address or self.leader_address})"
        )

    # --- training ---------------------------------------------------------------------

    def average_gradients(
        self,
        model: nn.Module,
        tick: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        weight: torch.Tensor | None = None,
    ) -> float:
        """Replace ``model``'s gradients by their mean over the group (a missing gradient
        counts as zeros): one flattened all-reduce. With ``weight`` (a 0-d tensor: this rank's
        samples) the mean is weighted: ``sum_r w_r g_r / sum_r w_r`` (zeros where every
        weight is 0; a NaN weight poisons every rank's gradients, so all of them see it).
        Returns the divisor: the world size, or the sum of the weights. While it waits for
        the other ranks, ``tick`` runs every ``TICK_S`` (the role's heartbeats); ``stop`` set
        meanwhile ends the wait with LearnerGroupError (the learner is stopping)."""
        params = list(model.parameters())
        grads = [
            p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device)
            for p in params
        ]
        flat = torch.cat(grads)
        if weight is not None:
            w = weight.detach().to(flat.device, flat.dtype).reshape(1)
            flat = torch.cat([flat * w, w])
        self.collective("the gradient all-reduce", lambda: self.pg.allreduce([flat]), tick, stop)
        if weight is None:
            total = float(self.world_size)
        else:
            total = float(flat[-1])
            flat = flat[:-1] / total if total != 0 else flat[:-1]
        if weight is None:
            flat /= self.world_size
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return total

    def reduce_max(
        self,
        values: torch.Tensor,
        tick: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> torch.Tensor:
        """The element-wise maximum of ``values`` (1-D, the same length on every rank) over
        the group, in place and returned."""
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        start = lambda: self.pg.allreduce([values], options)  # noqa: E731
        self.collective("an all-reduce (max)", start, tick, stop)
        return values

    def broadcast(
        self,
        tensors: list[torch.Tensor],
        tick: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Copy rank 0's ``tensors`` into every rank's, in place (the same shapes on every
        rank): one broadcast of them flattened."""
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        start = lambda: self.pg.broadcast([flat], options)  # noqa: E731
        self.collective("a broadcast from rank 0", start, tick, stop)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    def collective(
        self,
        what: str,
        start: Callable[[], Any],
        tick: Callable[[], None] | None,
        stop: threading.Event | None,
    ) -> None:
        """Start a collective (``start()``: its work) and wait for it; its failure raises
        LearnerGroupError naming ``what``."""
        try:
            self.wait(start(), tick, stop)
        except RuntimeError as exc:
            raise LearnerGroupError(
                f"learner group rank {self.rank}: {what} failed (a learner stopped or cannot "
                f"be reached): {exc}"
            ) from exc

    @staticmethod
    def wait(work: Any, tick: Callable[[], None] | None, stop: threading.Event | None) -> None:
        """Wait for a collective ``work``, ticking; its error (a rank gone, the group's
        timeout) is raised here."""
        pause, next_tick = POLL_FIRST_S, time.monotonic() + TICK_S
        while not work.is_completed():
            if stop is not None and stop.is_set():
                raise RuntimeError("this learner is stopping")
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
            if tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = time.monotonic() + TICK_S
        work.wait()

    def close(self) -> None:
        """Shut the process group down (once); the store goes with this object."""
        if self.closed:
            return
        self.closed = True
        if self.pg is not None:
            try:
                self.pg.shutdown()
            except RuntimeError as exc:  # the others may be gone already
                self.log.debug("learner group shutdown: %s", exc)
        self.pg = None
        self.ready = False
        self.store = None


class PolicyLearners:
    """A learner update's place among its policy's learners (``roles.learners`` of one policy:
    DD-PPO, APPO, IMPALA): its rank, the group it forms with them (None for a lone learner)
    and what every such update does with it: find rank 0's store address through the broker,
    form the group before training, publish only from rank 0, step on the gradients averaged
    over the group, tell a learner that stops from a failed group, and show its rank in the
    heartbeat."""

    def __init__(self, setup: LearnerSetup) -> None:
        cfg = setup.config
        self.services = setup.services
        self.size = cfg.learners_per_policy()
        self.rank = cfg.learner_rank(setup.index)
        self.leader = self.rank == 0
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
        self.on_tick: Callable[[], None] | None = None
        """What :meth:`tick` runs in place of the role's heartbeats, where an update gives
        more (IMPALA's and APPO's also take in the batches that arrive)."""

    def tick(self) -> None:
        """What runs every ``TICK_S`` while a collective waits: ``on_tick``, else the role's
        heartbeats (``services.tick``)."""
        (self.on_tick or self.services.tick)()

    def find_leader(self) -> str | None:
        """Rank 0's group store ``host:port``, from its heartbeat (the broker)."""
        info = self.services.role_info(self.leader_id)
        address = info.get("group_store") if info else None
        return address if isinstance(address, str) else None

    @property
    def ready(self) -> bool:
        """Whether the group has formed (always, for a lone learner)."""
        return self.group is None or self.group.ready

    def poll(self) -> bool:
        """One step of the rendezvous; True once the group is formed (LearnerGroupError past
        ``learner.group_timeout_s``)."""
        return self.group is None or self.group.poll()

    def may_publish(self) -> bool:
        """Rank 0 speaks for all, once the group has formed (the first weights start the
        actors)."""
        return self.leader and self.ready

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
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
        w = torch.as_tensor(weight, dtype=torch.float32)
        if loss is not None:
            loss.backward()
            if not bool(torch.isfinite(loss.detach())):
                w = torch.tensor(float("nan"))
        else:
            loss, w = torch.zeros(()), torch.zeros(())
        params = list(model.parameters())
        total = self.group.average_gradients(model, self.tick, self.services.stop_event, weight=w)
        if total == 0:
            return None
        grad_norm = clipped_gradients(loss, params, grad_clip)
        optimizer.step()
        return float(grad_norm)

    def stopping(self) -> bool:
        """After a failed collective: whether this learner is asked to stop within
        ``STOP_GRACE_S`` (the run is ending and another learner stopped first)."""
        services = self.services
        deadline = time.monotonic() + STOP_GRACE_S
        while not services.stop_event.is_set() and time.monotonic() < deadline:
            services.tick()
            services.stop_event.wait(0.05)
        return services.stop_event.is_set()

    def heartbeat_info(self) -> dict[str, Any]:
        """``group_rank``, ``group_size``, ``group_formed`` and rank 0's ``group_store`` (the
        address the others find through the broker); nothing for a lone learner."""
        if self.group is None:
            return {}
        info: dict[str, Any] = {
            "group_rank": self.rank,
            "group_size": self.size,
            "group_formed": self.group.ready,
        }
        if self.group.address is not None:
            info["group_store"] = self.group.address
        return info

    def summary(self) -> str:
        """``, rank r of a group of n`` for the learner's last line (empty when alone)."""
        return f", rank {self.rank} of a group of {self.size}" if self.group is not None else ""

    def close(self) -> None:
        """Destroy the group."""
        if self.group is not None:
            self.group.close()
