"""``ParameterServer``: the latest weights with a version number.

Sockets:

- ROUTER ``rpc`` (own endpoint, announced in HELLO, found with LOOKUP "params"):
  WEIGHTS from a learner -> stored as version v+1, answered with ACK {version};
  GET_WEIGHTS from anyone -> WEIGHTS {version} (or NO_WEIGHTS before the first).
- PUB ``weights`` -> topic bus, topic ``weights``: every new version, so actors and
  the evaluator pick it up without asking. A late joiner asks GET_WEIGHTS once,
  because PUB/SUB delivers nothing sent before the subscription.
- PULL ``gradients`` (``algo: a3c`` only) <- A3C workers: GRADIENTS computed on a weights
  version. The server owns the model and an optimizer, combines ``a3c.gradients_per_update``
  of them (sum or mean), steps, and publishes the result as the next version. Gradients more
  than ``a3c.max_lag`` versions old are dropped and counted (``stale_gradients``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from zrl.algos import get_algorithm
from zrl.roles.base import Role, load_checkpoint_file
from zrl.transport import messages as M
from zrl.transport import protocol as P

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

    @property
    def applies_gradients(self) -> bool:
        """Whether the algorithm's actors send gradients here to apply (A3C)."""
        return get_algorithm(self.config.algo).wiring.experience == "gradients"

    def setup(self) -> None:
        self.publisher = self.open_publisher(P.WEIGHTS_TOPIC, hwm=100)
        self.version = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.weights_meta: dict[str, Any] = {}
        self.updated_at = 0.0
        self.served = 0
        if self.applies_gradients:
            self.setup_gradient_server()

    def setup_gradient_server(self) -> None:
        import torch

        from zrl.algos.optim import make_adam
        from zrl.runtime import limit_torch_threads

        limit_torch_threads(self.config.learner.torch_threads)
        torch.manual_seed(self.config.seed)  # the workers start from the same initialisation
        probe = self.make_envs(num_envs=1)
        self.model = self.make_model(probe.single_observation_space, probe.single_action_space)
        probe.close()
        self.optimizer = make_adam(self.model.parameters(), self.config.a3c.lr)
        self.gradients = self.open_pull("gradients", hwm=4)
        self.grad_shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        self.accumulated: list[dict[str, np.ndarray]] = []
        self.applied_gradients = 0
        self.stale_gradients = 0
        self.future_gradients = 0
        self.updates = 0
        d = self.config.checkpoint.dir
        # The server owns the A3C model: a restart must continue it, or the workers (whose
        # weights version is ahead of a fresh server's) would never take its weights again.
        self.checkpoint = Path(d) / f"{self.id}.pt" if d else None
        self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
        if self.checkpoint is not None and self.checkpoint.is_file():
            state = load_checkpoint_file(self.checkpoint)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.updates, self.version = int(state["updates"]), int(state["version"]) - 1
            self.applied_gradients = int(state["applied_gradients"])
            self.log.info("resumed from %s: update %d, weights v%d",
                          self.checkpoint, self.updates, self.version + 1)  # fmt: skip
        self.store_model_weights()

    def save_checkpoint(self) -> None:
        import torch

        if self.checkpoint is None:
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint.with_suffix(".tmp")
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "updates": self.updates,
                "version": self.version,
                "applied_gradients": self.applied_gradients,
            },
            tmp,
        )
        os.replace(tmp, self.checkpoint)  # atomic: a crash mid-write leaves the old one

    def store_model_weights(self) -> None:
        from zrl.models import model_to_arrays

        self.arrays = model_to_arrays(self.model)
        self.version += 1
        self.updated_at = time.time()
        self.weights_meta = {"updates": self.updates}
        self.publish_weights()

    def on_gradients(self, msg: P.Message) -> None:
        if msg.kind != P.GRADIENTS:
            raise P.ProtocolError(f"gradients stream carries {msg.kind!r}")
        version = msg.meta.get("weights_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise P.ProtocolError("gradients without an integer weights_version")
        if set(msg.arrays) != set(self.grad_shapes) or any(
            msg.arrays[k].shape != self.grad_shapes[k] or msg.arrays[k].dtype != np.float32
            for k in self.grad_shapes
        ):
            raise P.ProtocolError("gradients whose names, shapes or dtypes do not fit the model")
        if not all(np.all(np.isfinite(g)) for g in msg.arrays.values()):
            raise P.ProtocolError("gradients with NaN or inf values")
        if self.version - version > self.config.a3c.max_lag:
            self.stale_gradients += 1
            return
        if version > self.version:
            # Computed on weights this server never published (it restarted without a
            # checkpoint): applying it to other weights would be silently wrong.
            self.future_gradients += 1
            if self.future_gradients == 1 or self.future_gradients % 100 == 0:
                self.log.warning(
                    "gradient on weights v%d, but this server is at v%d (restarted without a "
                    "checkpoint?): dropped (%d so far)", version, self.version, self.future_gradients,
                )  # fmt: skip
            return
        self.accumulated.append(msg.arrays)
        self.train_stats.add_with_max(policy_lag=self.version - version)
        if len(self.accumulated) >= self.config.a3c.gradients_per_update:
            self.apply_gradients()

    def apply_gradients(self) -> None:
        import torch

        from zrl.algos.policy_gradient import reduce_gradients

        started = time.perf_counter()
        combined = reduce_gradients(
            [{k: torch.from_numpy(np.array(v)) for k, v in g.items()} for g in self.accumulated],
            self.config.a3c.reduce,
        )
        self.applied_gradients += len(self.accumulated)
        self.accumulated = []
        for name, p in self.model.named_parameters():
            p.grad = combined[name]
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.config.a3c.grad_clip
        )
        self.optimizer.step()
        self.updates += 1
        self.train_stats.add(grad_norm=grad_norm, update_ms=(time.perf_counter() - started) * 1e3)
        self.store_model_weights()

    def bind(self) -> None:
        self.rpc = self.bind_rpc()

    def step(self) -> None:
        if self.applies_gradients:
            if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
                self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
                self.save_checkpoint()
            self.drain_gradients()
        if not self.rpc.sock.poll(0 if self.applies_gradients else 100):
            return
        for _ in range(100):
            got = self.rpc.recv(block=False)
            if got is None:
                return
            ident, msg = got
            assert ident is not None
            try:
                self.on_request(ident, msg)
            except P.ProtocolError as exc:
                self.rpc._drop(msg.sender or "?", str(exc))

    def drain_gradients(self) -> None:
        if not self.gradients.sock.poll(20):
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
        if msg.kind == P.WEIGHTS and self.applies_gradients:
            raise P.ProtocolError("a3c: the parameter server owns the weights; send gradients")
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
        if self.applies_gradients and hasattr(self, "updates"):
            self.save_checkpoint()
            self.log.info(
                "%s: %d updates from %d gradients, %d stale gradients dropped (max_lag %d)",
                self.id, self.updates, self.applied_gradients, self.stale_gradients,
                self.config.a3c.max_lag,
            )  # fmt: skip

    def train_info(self) -> dict[str, float]:
        if not self.applies_gradients or not hasattr(self, "optimizer"):
            return {}
        return {"lr": float(self.optimizer.param_groups[0]["lr"])}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"weights_version": self.version, "late_join_requests": self.served}
        if self.applies_gradients:
            info.update(
                updates=self.updates,
                applied_gradients=self.applied_gradients,
                stale_gradients=self.stale_gradients,
                future_gradients=self.future_gradients,
            )
        return info
