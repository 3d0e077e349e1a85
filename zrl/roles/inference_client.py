"""An actor's side of the inference role: its model's forwards, run by the inference role of
its host (``zrl.roles.inference``).

:class:`RemoteModel` stands where the actor's model stands for the algorithm's policy: the
forward methods of :data:`zrl.transport.messages.INFER_METHODS` (``model(obs)``,
``policy_logits``, ``step``) go to the server, everything else (``initial_state``, ``core``,
...) is the actor's own model, which never changes (it follows no weights). The policy needs no
change: what it computed with its own model it now gets from the server, under the server's
weights version, which :class:`InferenceClient` keeps the oldest of for each trajectory (the
version the trajectory reports: lag limits stay conservative).

Which server: the actor's host's inference roles as the config places them
(``ExperimentConfig.beside``), actor ``i`` of that host to inference role ``i mod n`` of it;
an actor whose host has none runs its own model (``connect_inference`` returns None).

Sockets: one DEALER to the chosen server's rpc ROUTER (found with LOOKUP "inference"),
connected under a random routing id whose digest the actor shows in its heartbeats
(``zrl.roles.rpc_identity``: the server serves planned actors only). A request unanswered
within ``inference.request_timeout_s`` is sent again on a fresh connection, to the server
LOOKUP then names, until one answers or the run stops; the actor keeps heartbeating meanwhile.
A reply that does not fit the request is dropped and counted (``inference_replies_refused``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from zrl.roles.errors import RoleError
from zrl.roles.rpc_identity import ClientKeys
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

if TYPE_CHECKING:
    from torch import nn

    from zrl.roles.base import Role

POLL_MS = 100
LOOKUP_INTERVAL_S = 0.5
WAIT_WARNING_S = 10.0


class InferenceStopped(Exception):
    """The run stopped while the actor waited for an inference reply."""


class InferenceClient:
    """Requests to one inference role, answered in order; the weights versions that answered."""

    def __init__(self, role: Role, server_id: str) -> None:
        self.role = role
        self.server_id = server_id
        self.timeout_s = role.config.inference.request_timeout_s
        self.rpc_keys = ClientKeys()
        self.channel: Channel | None = None
        self.seq = 0
        self.version = 0
        """The weights version of the last reply."""
        self.oldest: int | None = None
        """The oldest version that answered since :meth:`take_oldest_version`."""
        self.requests = 0
        self.resent = 0
        self.replies_refused = 0
        self.wait_s = 0.0

    def connect(self) -> None:
        """A fresh connection to the server LOOKUP names (waiting until it registered)."""
        self.close()
        endpoint, waited_since = "", time.monotonic()
        warned_at = waited_since
        while not endpoint:
            if self.role.stop_event.is_set():
                raise InferenceStopped
            try:
                services = self.role.lookup("inference", timeout=1.0)
            except RoleError:
                services = []
            endpoint = next(
                (
                    s["rpc"]
                    for s in services
                    if isinstance(s, dict)
                    and s.get("id") == self.server_id
                    and isinstance(s.get("rpc"), str)
                ),
                "",
            )
            if not endpoint:
                now = time.monotonic()
                if now - warned_at >= WAIT_WARNING_S:
                    warned_at = now
                    self.role.log.warning(
                        "waiting %.0f s for %s to register", now - waited_since, self.server_id
                    )
                self.role.tick()
                self.role.stop_event.wait(LOOKUP_INTERVAL_S)
        key = self.rpc_keys.renew("inference")
        self.channel = self.role.connect_rpc(endpoint, key, "inference", rcvtimeo_ms=POLL_MS)
        # The server serves connections a heartbeat of ours vouches for: show the key first.
        self.role.heartbeat_now()

    def call(self, method: str, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs of the server's ``model.<method>`` over ``arrays`` (``obs``, and
        ``state`` for ``step``), asking again on a fresh connection when no answer comes
        within the timeout. InferenceStopped when the run stops meanwhile."""
        if self.channel is None:
            self.connect()
        rows = len(arrays["obs"])
        started = time.monotonic()
        self.requests += 1
        while True:
            assert self.channel is not None
            self.seq += 1
            request = P.Message(P.INFER, meta={"method": method, "seq": self.seq}, arrays=arrays)
            sent_at = time.monotonic()
            if self.channel.send(request):
                reply = self.wait_reply(self.seq, rows, sent_at + self.timeout_s)
                if reply is not None:
                    self.wait_s += time.monotonic() - started
                    return reply
            self.resent += 1
            self.role.log.warning(
                "%s did not answer within %.1f s (inference.request_timeout_s): asking again",
                self.server_id,
                self.timeout_s,
            )
            self.connect()

    def wait_reply(self, seq: int, rows: int, deadline: float) -> list[np.ndarray] | None:
        """The outputs of the reply to request ``seq``, or None at the deadline; the role
        keeps heartbeating while it waits."""
        assert self.channel is not None
        waited = 0
        while time.monotonic() < deadline:
            if self.role.stop_event.is_set():
                raise InferenceStopped
            if not self.channel.sock.poll(POLL_MS):
                waited += 1
                self.role.tick()
                continue
            got = self.channel.recv(block=False)
            if got is None:
                continue
            _, msg = got
            try:
                if msg.kind != P.INFERRED:
                    raise P.ProtocolError(f"{msg.kind!r} on the inference connection")
                if msg.meta.get("seq") != seq:
                    continue  # the late answer to a request sent again since
                version, outputs = M.inferred_outputs(msg, rows)
            except P.ProtocolError as exc:
                self.replies_refused += 1
                self.channel.drop(msg.sender or "?", str(exc))
                continue
            self.version = version
            self.oldest = version if self.oldest is None else min(self.oldest, version)
            return outputs
        return None

    def take_oldest_version(self) -> int:
        """The oldest weights version that answered since the last call (the last reply's
        when none did), and start counting again."""
        oldest = self.version if self.oldest is None else self.oldest
        self.oldest = None
        return oldest

    def heartbeat_info(self) -> dict[str, Any]:
        return {
            **self.rpc_keys.info(),
            "inference": self.server_id,
            "inference_requests": self.requests,
            "inference_resent": self.resent,
            "inference_replies_refused": self.replies_refused,
            "inference_wait_s": round(self.wait_s, 3),
        }

    def close(self) -> None:
        if self.channel is not None:
            self.role.close_channel(self.channel)
            self.channel = None


class RemoteModel:
    """The actor's model as its policy sees it when an inference role runs the forwards."""

    def __init__(self, local: nn.Module, client: InferenceClient) -> None:
        self.local = local
        self.client = client

    def __call__(self, obs: torch.Tensor) -> Any:
        return self.remote("forward", obs)

    def __getattr__(self, name: str) -> Any:
        if name in M.INFER_METHODS and name != "forward":
            if not callable(getattr(self.local, name, None)):
                raise AttributeError(name)
            return lambda *args: self.remote(name, *args)
        return getattr(self.local, name)

    def remote(self, method: str, *args: torch.Tensor) -> Any:
        """``method`` run by the server on ``args`` (observations, then the state)."""
        names = list(M.INFER_METHODS[method].arrays)
        if len(args) != len(names):
            raise TypeError(f"{method} takes {', '.join(names)}, got {len(args)} arguments")
        arrays = {
            name: np.ascontiguousarray(a.numpy()) for name, a in zip(names, args, strict=True)
        }
        # Copies: the policy may write into them (a recurrent state zeroed at episode starts),
        # and a received frame is read-only.
        outputs = [torch.from_numpy(o.copy()) for o in self.client.call(method, arrays)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def connect_inference(role: Role, actor_index: int) -> InferenceClient | None:
    """The client of the inference role that serves actor ``actor_index``: the config places
    inference roles beside it (``ExperimentConfig.beside``), actor ``i`` of its host to the
    ``i mod n``-th of them. None when its host has none (the actor runs its own model)."""
    cfg = role.config
    servers = cfg.beside("actors", actor_index, "inference")
    if not servers:
        return None
    peers = cfg.beside("actors", actor_index, "actors")
    server = servers[peers.index(actor_index) % len(servers)]
    return InferenceClient(role, f"inference-{server}")
