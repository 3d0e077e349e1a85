"""``DDPPOPeers``: the learners of a DD-PPO run (``roles.learners > 1``) to each other, on the
topic ``allreduce/`` of the topic bus.

- Start-up: every learner publishes READY (with the peers it has heard) at 20 Hz until it has
  heard every other learner and each of them has heard it (``handshake``); only then does
  learner 0 publish the first weights, which start the actors. Otherwise a learner still
  starting up misses the first rollouts and the others wait for it in every allreduce.
  Past ``HANDSHAKE_TIMEOUT_S`` it starts anyway, and the missing learners' allreduce steps
  time out.
- Every minibatch step: each learner publishes the gradient of its slice (GRADIENTS, meta
  round, step, learner) and averages it with the others' (``average``), summed in learner
  order so all learners apply bit-identical updates; a peer missing for
  ``ALLREDUCE_TIMEOUT_S`` is counted (``timeouts``) and the step goes on without it.

Sockets: a PUB and a SUB (``allreduce/``) opened through the learner's services. Malformed
messages (a learner index out of range, gradients that do not fit the model or are not
finite) are dropped and counted on the SUB.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from torch import nn

from zrl.algos.api.learner import LearnerServices
from zrl.algos.policy_gradient import reduce_gradients
from zrl.transport import protocol as P

ALLREDUCE_TIMEOUT_S = 10.0
READY_INTERVAL_S = 0.05  # READY repeated until every peer confirms
HANDSHAKE_TIMEOUT_S = 30.0  # then start anyway; allreduce timeouts count what is missing
HANDSHAKE_POLL_MS = 20  # one handshake step waits at most this long for a peer's message


class DDPPOPeers:
    """One learner's side of the DD-PPO handshake and gradient allreduce."""

    def __init__(
        self,
        services: LearnerServices,
        learners: int,
        index: int,
        model: nn.Module,
        log: logging.Logger,
    ) -> None:
        self.services = services
        self.learners = learners
        self.index = index
        self.model = model
        self.log = log
        self.pub = services.open_publisher("allreduce")
        self.sub = services.open_subscriber([P.ALLREDUCE_TOPIC], "allreduce")
        self.peer_grads: dict[tuple[int, int], dict[int, dict[str, np.ndarray]]] = {}
        self.timeouts = 0
        self.heard: set[int] = set()  # peers whose READY reached us
        self.confirmed: set[int] = set()  # ... and who said they heard ours
        self.ready = False
        self.handshake_started = time.monotonic()
        self.next_ready = 0.0

    # --- start-up handshake -----------------------------------------------------------

    def send_ready(self) -> None:
        self.pub.send(
            P.Message(P.READY, meta={"learner": self.index, "heard": sorted(self.heard)}),
            topic=P.ALLREDUCE_TOPIC,
            block=False,
        )

    def on_ready(self, msg: P.Message) -> None:
        who, heard = msg.meta.get("learner"), msg.meta.get("heard")
        if not isinstance(heard, list):
            self.sub.drop(msg.sender or "?", "READY without the peers it heard")
            return
        assert isinstance(who, int)  # checked by read
        newly_heard = who not in self.heard
        self.heard.add(who)
        if self.index in heard:
            self.confirmed.add(who)
        if newly_heard or self.index not in heard:
            # Tell it at once that we hear it (it may be new, or waiting only for that).
            self.send_ready()

    def handshake(self) -> None:
        """One step of: until every other learner is heard and has heard us, READY at 20 Hz;
        ``ready`` once they have (or past the timeout)."""
        now = time.monotonic()
        if now >= self.next_ready:
            self.next_ready = now + READY_INTERVAL_S
            self.send_ready()
        self.read()
        others = set(range(self.learners)) - {self.index}
        if self.heard >= others and self.confirmed >= others:
            self.ready = True
            self.log.info(
                "DD-PPO: all %d learners hear each other (%.2f s)",
                self.learners,
                now - self.handshake_started,
            )
        elif now - self.handshake_started > HANDSHAKE_TIMEOUT_S:
            self.ready = True
            self.log.warning(
                "DD-PPO: learners %s not heard within %.0f s; starting without them "
                "(their allreduce steps will time out)",
                sorted(others - (self.heard & self.confirmed)),
                HANDSHAKE_TIMEOUT_S,
            )
        else:
            self.sub.sock.poll(HANDSHAKE_POLL_MS)

    # --- allreduce --------------------------------------------------------------------

    def average(self, round_: int, step: int) -> None:
        """Replace the model's gradients by their mean over the learners for this step."""
        key = (round_, step)
        own = {
            name: p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32)
            for name, p in self.model.named_parameters()
        }
        self.pub.send(
            P.Message(
                P.GRADIENTS,
                meta={"round": key[0], "step": key[1], "learner": self.index},
                arrays=own,
            ),
            topic=P.ALLREDUCE_TOPIC,
            block=False,
        )
        deadline = time.monotonic() + ALLREDUCE_TIMEOUT_S
        while len(self.peer_grads.get(key, {})) < self.learners - 1:
            if self.services.stop_event.is_set():
                break  # stopping: the other learners may be gone already
            if time.monotonic() > deadline:
                self.timeouts += 1
                self.log.warning(
                    "allreduce of round %d step %d: peers missing; using own gradient", *key
                )
                break
            if self.sub.sock.poll(50):
                self.read()
            else:
                self.services.tick()
        grads = {**self.peer_grads.pop(key, {}), self.index: own}
        for old in [k for k in self.peer_grads if k <= key]:
            del self.peer_grads[old]
        # Summed in learner order on every learner, so all get bit-identical means.
        mean = reduce_gradients(
            [{k: torch.from_numpy(v) for k, v in grads[i].items()} for i in sorted(grads)], "mean"
        )
        for name, p in self.model.named_parameters():
            p.grad = mean[name].clone()

    def read(self) -> None:
        """Everything the SUB holds now: READYs to the handshake, gradients kept by step."""
        sub = self.sub
        names = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        while True:
            got = sub.recv(block=False)
            if got is None:
                return
            msg = got[1]
            r, s, who = msg.meta.get("round"), msg.meta.get("step"), msg.meta.get("learner")
            if who == self.index:
                continue  # our own publication comes back through the bus
            if not isinstance(who, int) or not 0 <= who < self.learners:
                sub.drop(msg.sender or "?", f"allreduce from learner {who!r}")
                continue
            if msg.kind == P.READY:
                self.on_ready(msg)
                continue
            if (
                msg.kind != P.GRADIENTS
                or not isinstance(r, int)
                or not isinstance(s, int)
                or set(msg.arrays) != set(names)
                or any(msg.arrays[k].shape != names[k] for k in names)
                or not all(np.all(np.isfinite(v)) for v in msg.arrays.values())
            ):
                sub.drop(msg.sender or "?", "malformed allreduce gradients")
                continue
            # Copies: the received frames are read-only, and torch wants writable arrays.
            self.peer_grads.setdefault((r, s), {})[who] = {
                k: np.array(v) for k, v in msg.arrays.items()
            }
