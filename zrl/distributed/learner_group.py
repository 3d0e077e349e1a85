"""``LearnerGroup``: the learners that train one policy together (``roles.learners > 1``:
DD-PPO, IMPALA, APPO, the off-policy algorithms) as a ``torch.distributed`` process group,
and the collectives over it. It knows nothing of learning: a learner update's place among
them is ``zrl.algos.kernel.policy_learners.PolicyLearners``. How a run forms and re-forms the
group is in docs/algorithms.md ("Several PPO learners"), what guards it in docs/security.md
("The learner group").

Rendezvous, through the broker: rank 0 opens the group's store (``zrl.distributed.group_store``,
every request authenticated under a random key of that store) and shows its ticket
``host:port#key`` (``address``) in its heartbeat; the other ranks find it by asking the broker
(the ``find_leader`` callable). Every rank writes ``zrl/gen/<g>/rank/<r>`` for the store's
generation ``g`` (``zrl/generation``); once all ``world_size`` keys are there, each makes its
process group on the store under ``zrl/gen/<g>/pg`` (gloo on the CPU, nccl on a GPU): an
object of its own, not torch's default group, so learners may be threads of one process.
:meth:`LearnerGroup.poll` takes one step without blocking past a store connection, so the
role keeps beating; past ``timeout_s`` it raises :class:`LearnerGroupError` naming the ranks
that did not come. A generation read from the store that is not a decimal number is counted
(``bad_values``) and skipped, never a crash.

Re-forming: a collective that fails raises :class:`CollectiveError`, and the learner calls
:meth:`LearnerGroup.rejoin` (the process group destroyed, the generation moved on, the
rendezvous again). Generations only grow, across restarts of any rank (:meth:`rejoin`).
The collectives: :meth:`LearnerGroup.average_gradients` (one all-reduce of the flattened
gradients: the same bits on every rank), :meth:`LearnerGroup.reduce_max` and
:meth:`LearnerGroup.broadcast`.

Sockets: the store's ROUTER (rank 0, the advertised address, a free port) and a DEALER to it
per other rank (``zrl.distributed.group_store``), and the backend's own connections between the
ranks: gloo's bound to each rank's advertised address (``GLOO_SOCKET_IFNAME``, where set,
picks the interface instead), nccl's on the interface nccl picks (``NCCL_SOCKET_IFNAME``);
none on the broker's buses. Neither backend authenticates its connections (this torch build's
gloo has no ``TCP_TLS``): their traffic must stay on a network the run trusts
(docs/security.md).
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import zmq
from torch import nn

from zrl.distributed.group_store import (
    GENERATION_KEY,
    KEY_BYTES,
    LocalStore,
    RemoteStore,
    StoreServer,
    bind_address,
    endpoint_of,
    generation_value,
    parse_ticket,
)

STORE_CONNECT_S = 5.0  # one try to reach rank 0's store (a stale address: try again later)
FIND_INTERVAL_S = 0.5  # between two questions to the broker for rank 0's address
TICK_S = 0.1  # while a collective waits for the other ranks: the role's heartbeats
POLL_FIRST_S, POLL_MAX_S = 1e-4, 2e-3  # its completion polled at these intervals, doubling


class LearnerGroupError(Exception):
    """The learner group could not form in time, or a collective over it failed. Not a
    ``RuntimeError``: the learner must stop on it, not drop the batch it was training."""


class BadStoreValue(Exception):
    """A value read from the group's store is not what its key holds (a generation that is no
    number): counted, and the rendezvous goes on without it (never a crash)."""


class CollectiveError(LearnerGroupError):
    """A collective over the group failed (a rank died, left or cannot be reached): the
    learner drops what it was training and re-forms the group (:meth:`LearnerGroup.rejoin`)."""


def backend_for(device: torch.device | str) -> str:
    """The ``torch.distributed`` backend of learners on ``device``: nccl on a GPU, gloo on
    the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_key(rank: int, generation: int) -> str:
    """The store key a rank writes when it has joined ``generation`` of the rendezvous."""
    return f"zrl/gen/{generation}/rank/{rank}"


class LearnerGroup:
    """One rank's side of the learner group: rendezvous (and re-forming, on a new
    generation), gradient mean, destruction."""

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
        self.stale_address: str | None = None
        """Ranks > 0: a store address whose connection failed (rank 0 died): never taken again."""
        self.generation = 0
        """The rendezvous generation this rank has joined (0: none yet)."""
        self.floor = 1
        """The least generation this rank may join next (past the one it left)."""
        self.reforms = 0
        """Groups this rank formed on a generation past 1 (the group formed again)."""
        self.ready = False
        self.closed = False
        self.entered = False
        """Whether this rank has entered the store's rendezvous (:meth:`enter`) since it
        connected or left a group."""
        self.bad_values = 0
        """Values read from the store that were not what their key holds (BadStoreValue)."""
        self.last_bad: str | None = None
        self.store: LocalStore | RemoteStore | None = None
        self.server: StoreServer | None = None
        self.pg: Any = None
        self.address: str | None = None
        """Rank 0's ticket of the store, ``host:port#key``, shown in its heartbeat (None on
        other ranks)."""
        try:
            self.bind_host = bind_address(advertise)
        except OSError as exc:
            raise LearnerGroupError(
                f"learner group rank {rank}: the advertised address {advertise!r} is not one "
                f"to bind ({exc}): --advertise an address of this host"
            ) from exc
        if rank == 0:
            key = secrets.token_bytes(KEY_BYTES)
            try:
                self.server = StoreServer(self.bind_host, key, self.log)
            except zmq.ZMQError as exc:
                raise LearnerGroupError(
                    f"learner group: rank 0's store cannot listen on {self.bind_host} (the "
                    f"advertised {advertise!r}): {exc}; --advertise an address of this host"
                ) from exc
            self.store = LocalStore(self.server.table, timeout_s)
            self.address = f"{advertise}:{self.server.port}#{key.hex()}"
            self.store.set(GENERATION_KEY, "1")
            self.enter()

    # --- rendezvous -------------------------------------------------------------------

    def poll(self) -> bool:
        """One step of the rendezvous; True once the group is formed. Raises
        LearnerGroupError past ``timeout_s``."""
        if self.ready:
            return True
        if self.store is None:
            self.connect()
        if self.store is not None and self.joined_all():
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
            self.reforms += self.generation > 1
            self.log.info(
                "learner group of %d formed (%s, rank %d) on generation %d in %.2f s",
                self.world_size,
                self.backend,
                self.rank,
                self.generation,
                time.monotonic() - self.started,
            )
            return True
        if time.monotonic() - self.started > self.timeout_s:
            raise LearnerGroupError(self.missing())
        return False

    def joined_all(self) -> bool:
        """Whether every rank has joined this rank's generation, after following the store's
        generation where another rank moved it on. A store that fails (ranks > 0: rank 0
        died) is dropped, its address marked stale."""
        assert self.store is not None
        try:
            if not self.entered:
                self.enter()
            current = self.read_generation()
            if current > self.generation:
                self.join(current)
            return self.store.check([rank_key(r, self.generation) for r in range(self.world_size)])
        except BadStoreValue as exc:
            self.bad_value(exc)
            return False
        except RuntimeError as exc:
            self.lose_store(exc)
            return False

    def read_generation(self, raw: bytes | None = None) -> int:
        """The store's generation (``raw``: a value already read from it), checked:
        BadStoreValue where it is no generation."""
        assert self.store is not None
        if raw is None:
            raw = self.store.get(GENERATION_KEY)
        value = generation_value(raw)
        if value is None:
            raise BadStoreValue(
                f"learner group rank {self.rank}: the store's {GENERATION_KEY} holds "
                f"{bytes(raw)[:32]!r}, not a generation"
            )
        return value

    def bad_value(self, exc: BadStoreValue) -> None:
        """Count a value of the store that was not a generation; rank 0 (whose store it is)
        moves the generation on past the one this rank knows, the others ask again at the
        next poll (past ``timeout_s`` the rendezvous fails, naming it)."""
        self.bad_values += 1
        self.last_bad = str(exc)
        self.entered = False
        if self.rank == 0 and self.store is not None:
            moved = max(self.generation, self.floor) + 1
            self.store.set(GENERATION_KEY, str(moved))
            self.log.warning("%s; moved the generation on to %d", exc, moved)
        elif self.bad_values == 1 or self.bad_values % 100 == 0:
            self.log.warning("%s (%d times); asking again", exc, self.bad_values)

    def enter(self) -> None:
        """Join the store's current generation, first moving it on to ``floor`` (past the
        generation this rank left) or, where an earlier incarnation of this rank joined it,
        past it (that one is gone)."""
        store = self.store
        assert store is not None
        current = self.read_generation()
        floor = self.floor
        if current >= floor and store.check([rank_key(self.rank, current)]):
            floor = current + 1
        while current < floor:  # atomic: the first rank here moves it, the others read it
            current = self.read_generation(
                store.compare_set(GENERATION_KEY, str(current), str(floor))
            )
        self.join(current)
        self.entered = True

    def join(self, generation: int) -> None:
        """Write this rank's key into ``generation``."""
        assert self.store is not None
        self.generation = generation
        self.store.set(rank_key(self.rank, generation), "joined")

    def lose_store(self, exc: Exception) -> None:
        """Ranks > 0: rank 0's store failed; find its (new) address through the broker."""
        self.log.warning(
            "learner group rank %d: rank 0's store at %s failed (%s); finding it again",
            self.rank,
            endpoint_of(self.leader_address),
            exc,
        )
        self.stale_address = self.leader_address
        if isinstance(self.store, RemoteStore):
            self.store.close()
        self.store = None
        self.entered = False
        self.next_find = 0.0

    def rejoin(self) -> None:
        """After a collective failed (:class:`CollectiveError`): destroy the process group
        and start the rendezvous again on the next generation (``timeout_s`` from now).

        The generation moves on by an atomic ``compare_set``: the first rank to get there
        moves it, the others find it moved (and a rank that waits follows it where another
        moved it); the store then drops the keys of the generations before the previous one.
        A restarted rank reads the current generation and joins it, or moves it on where an
        earlier incarnation of itself is in it. A rank whose store connection fails (rank 0
        died, its store with it) forgets that address and finds the new one through the
        broker, never the stale one; joining a new store (generation 1) it moves the
        generation past the one it left, so generations only grow. Whenever a group forms,
        ``PolicyLearners`` copies rank 0's weights and optimizer state into every rank."""
        self.shutdown_group()
        self.floor = self.generation + 1
        self.started = time.monotonic()
        self.next_find = 0.0
        self.entered = False
        if self.store is None:
            return
        try:
            self.enter()
        except BadStoreValue as exc:
            self.bad_value(exc)  # poll enters again
        except RuntimeError as exc:
            if self.rank == 0:
                raise
            self.lose_store(exc)

    def make_process_group(self, store: dist.Store) -> Any:
        """This rank's process group over ``store`` (blocks until every rank connects)."""
        prefixed = dist.PrefixStore(f"zrl/gen/{self.generation}/pg", store)
        if self.backend == "gloo":
            gloo: Any = dist.ProcessGroupGloo  # _Options: not in torch's type stubs
            options = gloo._Options()
            options._timeout = self.timeout
            options._devices = [
                gloo.create_default_device()
                if os.environ.get("GLOO_SOCKET_IFNAME")
                else gloo.create_device(hostname=self.bind_host)
            ]
            return gloo(prefixed, self.rank, self.world_size, options)
        if self.backend == "nccl":
            torch.cuda.set_device(self.device)
            nccl: Any = getattr(dist, "ProcessGroupNCCL")  # noqa: B009 - CUDA builds only
            options = nccl.Options()
            options._timeout = self.timeout
            return nccl(prefixed, self.rank, self.world_size, options)
        raise LearnerGroupError(f"learner group: no backend {self.backend!r}")

    def connect(self) -> None:
        """Ranks > 0: ask for rank 0's store ticket and join it (at most every
        ``FIND_INTERVAL_S``; a store that does not answer is tried again later)."""
        now = time.monotonic()
        if now < self.next_find:
            return
        self.next_find = now + FIND_INTERVAL_S
        ticket = self.find_leader()
        if not ticket or ticket == self.stale_address:
            return
        self.leader_address = ticket
        left = self.timeout_s - (now - self.started)
        try:
            host, port, key = parse_ticket(ticket)
        except ValueError as exc:
            self.log.warning("learner group: rank 0's store: %s", exc)
            return
        store = RemoteStore(host, port, key, self.timeout_s)
        try:
            store.ping(max(0.1, min(STORE_CONNECT_S, left)))
        except RuntimeError as exc:
            store.close()
            self.log.warning("learner group: rank 0's store at %s: %s", endpoint_of(ticket), exc)
            return
        self.store = store
        self.entered = False  # joined_all enters

    def missing(self) -> str:
        """Why the rendezvous has not formed: the ranks not joined, or no rank 0 found."""
        waited = f"within learner.group_timeout_s={self.timeout_s:g} s"
        if self.store is None:
            if self.stale_address is not None and self.leader_address == self.stale_address:
                where = (
                    f"its store at {endpoint_of(self.stale_address)} failed, no new address shown"
                )
            elif self.leader_address:
                where = f"its store at {endpoint_of(self.leader_address)} did not answer"
            else:
                where = "the broker never showed its store address"
            return (
                f"learner group rank {self.rank}: rank 0 (learner-0's store) not reached "
                f"{waited}: {where}"
            )
        g = self.generation
        try:
            absent: Any = [
                r for r in range(self.world_size) if not self.store.check([rank_key(r, g)])
            ]
        except RuntimeError as exc:
            absent = f"unknown ({exc})"
        bad = f"; {self.bad_values} unreadable value(s): {self.last_bad}" if self.bad_values else ""
        return (
            f"learner group of {self.world_size} not formed on generation {g} {waited}: rank(s) "
            f"{absent} never joined (the learners of those indices did not start, or cannot "
            f"reach {endpoint_of(self.address or self.leader_address)}){bad}"
        )

    # --- training ---------------------------------------------------------------------

    def average_gradients(
        self,
        model: nn.Module | Sequence[torch.Tensor],
        tick: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        weight: torch.Tensor | None = None,
    ) -> float:
        """Replace the gradients of ``model``'s parameters (or of a list of parameters: those
        one optimizer steps) by their mean over the group (a missing gradient counts as
        zeros): one flattened all-reduce. With ``weight`` (a 0-d tensor: this rank's
        samples) the mean is weighted: ``sum_r w_r g_r / sum_r w_r`` (zeros where every
        weight is 0; a NaN weight poisons every rank's gradients, so all of them see it).
        Returns the divisor: the world size, or the sum of the weights. While it waits for
        the other ranks, ``tick`` runs every ``TICK_S`` (the role's heartbeats); ``stop`` set
        meanwhile ends the wait with LearnerGroupError (the learner is stopping)."""
        params = list(model.parameters()) if isinstance(model, nn.Module) else list(model)
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

    def broadcast_bytes(
        self,
        data: bytes | None,
        tick: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> bytes:
        """Rank 0's ``data`` on every rank (the others pass None): its length, then its bytes,
        two broadcasts."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        size = size.to(self.device)
        start = lambda: self.pg.broadcast([size], options)  # noqa: E731
        self.collective("a broadcast from rank 0", start, tick, stop)
        if data is not None:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(int(size), dtype=torch.uint8, device=self.device)
        start = lambda: self.pg.broadcast([buf], options)  # noqa: E731
        self.collective("a broadcast from rank 0", start, tick, stop)
        return buf.cpu().numpy().tobytes()

    def collective(
        self,
        what: str,
        start: Callable[[], Any],
        tick: Callable[[], None] | None,
        stop: threading.Event | None,
    ) -> None:
        """Start a collective (``start()``: its work) and wait for it; its failure raises
        CollectiveError naming ``what``."""
        if self.pg is None:
            raise CollectiveError(f"learner group rank {self.rank}: {what} without a group")
        try:
            self.wait(start(), tick, stop)
        except RuntimeError as exc:
            raise CollectiveError(
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
        self.shutdown_group()
        if isinstance(self.store, RemoteStore):
            self.store.close()
        self.store = None
        if self.server is not None:
            self.server.close()

    def shutdown_group(self) -> None:
        """Shut the process group down, if any (the others may be gone already)."""
        if self.pg is not None:
            try:
                self.pg.shutdown()
            except RuntimeError as exc:
                self.log.debug("learner group shutdown: %s", exc)
        self.pg = None
        self.ready = False
