"""``ParameterServer``: the latest weights with a version number.

Sockets:

- ROUTER ``rpc`` (own endpoint, announced in HELLO, found with LOOKUP "params"):
  WEIGHTS from a learner -> stored as version v+1, answered with ACK {version};
  GET_WEIGHTS from anyone -> WEIGHTS {version} (or NO_WEIGHTS before the first).
- PUB ``weights`` -> topic bus, topic ``weights``: every new version, so actors and
  the evaluator pick it up without asking. A late joiner asks GET_WEIGHTS once,
  because PUB/SUB delivers nothing sent before the subscription.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from zrl.roles.base import Role
from zrl.transport import protocol as P


def same_layout(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a
    )


class ParameterServer(Role):
    role = "params"

    def setup(self) -> None:
        self.publisher = self.open_publisher(P.WEIGHTS_TOPIC, hwm=100)
        self.version = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.weights_meta: dict[str, Any] = {}
        self.updated_at = 0.0
        self.served = 0

    def bind(self) -> None:
        self.rpc = self.bind_rpc()

    def step(self) -> None:
        if not self.rpc.sock.poll(100):
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

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.WEIGHTS:
            if not msg.arrays:
                raise P.ProtocolError("weights message without arrays")
            if not all(np.all(np.isfinite(a)) for a in msg.arrays.values()):
                raise P.ProtocolError("weights with NaN or inf values")
            if self.arrays and not same_layout(msg.arrays, self.arrays):
                raise P.ProtocolError(
                    "weights whose parameter names, shapes or dtypes differ from the current ones"
                )
            # The arrays are views on the received frames; holding them keeps the frames alive,
            # so storing a version costs no copy.
            self.arrays = msg.arrays
            floor = msg.meta.get("min_version", 0)
            # A resumed learner asks to continue its numbering; versions never go backwards.
            self.version = max(self.version + 1, floor if isinstance(floor, int) else 0)
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

    def heartbeat_info(self) -> dict[str, Any]:
        return {"weights_version": self.version, "late_join_requests": self.served}
