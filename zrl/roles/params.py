"""``ParameterServer``: the latest weights with a version number.

Sockets:

- ROUTER ``rpc`` (own endpoint, announced in HELLO, found with LOOKUP "params"):
  WEIGHTS from a learner -> stored as version v+1, answered with ACK {version};
  GET_WEIGHTS from anyone -> WEIGHTS {version} (or NO_WEIGHTS before the first).
- PUB ``weights`` -> topic bus, topic ``weights``: every new version, so actors and
  the evaluator pick it up without asking. A late joiner asks GET_WEIGHTS once,
  because PUB/SUB delivers nothing sent before the subscription.
- PULL ``gradients`` (only for an algorithm that names a ``gradient_server``, A3C) <- the
  workers: GRADIENTS computed on a weights version. This server reads them, counts the ones
  its gradient server rejects as dropped, and stores and publishes the model as the next
  version whenever the gradient server (``zrl.algos.a3c.server``: validation, lag counters,
  combining, the optimizer step) completes an update. It owns that model from then on: a
  learner's WEIGHTS are refused, and its checkpoint (``<checkpoint.dir>/<id>.pt``: the
  gradient server's state plus the weights version) lets a restart continue the numbering.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from zrl.algos import get_algorithm
from zrl.algos.api import GradientServer, GradientServerSetup
from zrl.durable import atomic_write
from zrl.roles.base import Role
from zrl.roles.trust import load_checkpoint_file
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

# Weights versions: a follower adopts from the bus a version at most MAX_VERSION_STEP past its
# own (further jumps are checked with the server first, see zrl.roles.weights), and this server
# takes a learner's min_version at most that far past its own once it holds weights. Versions
# travel as msgpack integers and land in JSON summaries: past 2**53 they are hostile.
MAX_VERSION_STEP = 10_000


def same_layout(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a
    )


class ParameterServer(Role):
    role = "params"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.version = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.weights_meta: dict[str, Any] = {}
        self.updated_at = 0.0
        self.served = 0
        # Only for an algorithm that names a gradient server (its actors send gradients).
        self.gradient_server: GradientServer | None = None
        self.gradients: Channel | None = None
        self.checkpoint: Path | None = None
        self.next_checkpoint = 0.0

    def setup(self) -> None:
        self.publisher = self.open_publisher(P.WEIGHTS_TOPIC, hwm=100)
        if get_algorithm(self.config.algo).gradient_server:
            self.setup_gradient_server()

    def setup_gradient_server(self) -> None:
        """Build the algorithm's gradient server on a fresh model, resume it from this
        server's checkpoint, and store its weights as the first (or next) version."""
        import torch

        from zrl.runtime import limit_torch_threads

        algorithm = get_algorithm(self.config.algo)
        limit_torch_threads(self.config.learner.torch_threads)
        torch.manual_seed(self.config.seed)  # the workers start from the same initialisation
        probe = self.make_envs(num_envs=1)
        spaces = (probe.single_observation_space, probe.single_action_space)
        model = self.make_model(*spaces)
        probe.close()
        self.gradient_server = algorithm.load(algorithm.gradient_server)(
            GradientServerSetup(
                config=self.config,
                model=model,
                observation_space=spaces[0],
                action_space=spaces[1],
                log=self.log,
                train_stats=self.train_stats,
            )
        )
        self.gradients = self.open_pull("gradients", hwm=4)
        d = self.config.checkpoint.dir
        # The server owns the model: a restart must continue it, or the workers (whose
        # weights version is ahead of a fresh server's) would never take its weights again.
        self.checkpoint = Path(d) / f"{self.id}.pt" if d else None
        self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
        self.load_checkpoint()
        self.store_model_weights()

    def load_checkpoint(self) -> None:
        if self.gradient_server is None or self.checkpoint is None:
            return
        if not self.checkpoint.is_file():
            return  # a first start: the fresh model becomes v1
        state = load_checkpoint_file(self.checkpoint)
        self.gradient_server.load_state_dict(state)
        self.version = int(state["version"]) - 1  # store_model_weights stores it again
        self.log.info("resumed from %s: update %d, weights v%d",
                      self.checkpoint, self.gradient_server.updates, self.version + 1)  # fmt: skip

    def save_checkpoint(self) -> None:
        import torch

        if self.gradient_server is None or self.checkpoint is None:
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        # A crash or a power cut mid-write leaves the old one (see zrl.durable).
        with atomic_write(self.checkpoint) as f:
            torch.save({**self.gradient_server.state_dict(), "version": self.version}, f)

    def store_model_weights(self) -> None:
        """Store and publish the gradient server's model as the next version."""
        from zrl.models import model_to_arrays

        assert self.gradient_server is not None
        self.arrays = model_to_arrays(self.gradient_server.model)
        self.version += 1
        self.updated_at = time.time()
        self.weights_meta = {"updates": self.gradient_server.updates}
        self.publish_weights()

    def on_gradients(self, msg: P.Message) -> None:
        """One message of the ``gradients`` stream (ProtocolError: dropped and counted)."""
        assert self.gradient_server is not None
        if self.gradient_server.receive(msg, self.version):
            self.store_model_weights()

    def bind(self) -> None:
        self.rpc = self.bind_rpc()

    def step(self) -> None:
        if self.gradient_server is not None:
            if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
                self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
                self.save_checkpoint()
            self.drain_gradients()
        self.serve_requests(self.rpc, 0 if self.gradient_server is not None else 100)

    def drain_gradients(self) -> None:
        if self.gradients is None or not self.gradients.sock.poll(20):
            return
        for _ in range(16):
            got = self.gradients.recv(block=False)
            if got is None:
                return
            try:
                self.on_gradients(got[1])
            except P.ProtocolError as exc:
                self.gradients._drop(got[1].sender or "?", str(exc))

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.WEIGHTS and self.gradient_server is not None:
            raise P.ProtocolError(
                f"{self.config.algo}: the parameter server owns the weights; send gradients"
            )
        if msg.kind == P.WEIGHTS:
            if not msg.arrays:
                raise P.ProtocolError("weights message without arrays")
            if not all(np.all(np.isfinite(a)) for a in msg.arrays.values()):
                raise P.ProtocolError("weights with NaN or inf values")
            if self.arrays and not same_layout(msg.arrays, self.arrays):
                raise P.ProtocolError(
                    "weights whose parameter names, shapes or dtypes differ from the current ones"
                )
            floor = msg.meta.get("min_version", 0)
            if not isinstance(floor, int) or isinstance(floor, bool) or floor > M.MAX_VERSION:
                raise P.ProtocolError(f"weights with min_version {floor!r}, not an int <= 2**53")
            if self.arrays and floor > self.version + MAX_VERSION_STEP:
                # A resumed learner's floor is a jump only into a fresh server (no arrays yet);
                # later, a far jump would only lock every follower onto a forged version.
                raise P.ProtocolError(
                    f"weights with min_version {floor}, more than {MAX_VERSION_STEP} past "
                    f"the current v{self.version}"
                )
            # The arrays are views on the received frames; holding them keeps the frames alive,
            # so storing a version costs no copy.
            self.arrays = msg.arrays
            # A resumed learner asks to continue its numbering; versions never go backwards.
            self.version = max(self.version + 1, floor)
            self.updated_at = time.time()
            self.weights_meta = {
                k: v for k, v in msg.meta.items() if isinstance(v, int | float | str)
            }
            self.publish_weights()
            self.rpc.send(P.Message(P.ACK, meta={"version": self.version}), to=ident, block=False)
        elif msg.kind == P.GET_WEIGHTS:
            self.served += 1
            if not self.arrays:
                self.rpc.send(P.Message(P.NO_WEIGHTS), to=ident, block=False)
            else:
                self.rpc.send(self.weights_message(), to=ident, block=False)
        else:
            raise P.ProtocolError(f"params does not serve {msg.kind!r}")

    def weights_message(self) -> P.Message:
        return P.Message(
            P.WEIGHTS, meta={**self.weights_meta, "version": self.version}, arrays=self.arrays
        )

    def publish_weights(self) -> None:
        self.publisher.send(self.weights_message(), topic=P.WEIGHTS_TOPIC, block=False)

    def teardown(self) -> None:
        if self.gradient_server is not None:
            self.save_checkpoint()
            summary = self.gradient_server.summary()
            if summary:
                self.log.info("%s: %s", self.id, summary)

    def train_info(self) -> dict[str, float]:
        return self.gradient_server.train_info() if self.gradient_server is not None else {}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"weights_version": self.version, "late_join_requests": self.served}
        if self.gradient_server is not None:
            info.update(self.gradient_server.heartbeat_info())
        return info
