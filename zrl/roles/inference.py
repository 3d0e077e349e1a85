"""``InferenceServer``: runs the policy for the actors of its host, batched, on its device.

On a GPU host the actors would otherwise spend their cores on the model (a Nature CNN forward
per step of each env group on every actor's CPU thread); an inference role takes that work off
them, as SEED RL's central inference and Sample Factory's inference workers do. Each actor
whose host has inference roles (``roles.inference``, placed with ``hosts[].roles.inference``
like any role) sends the observations it must act on and gets the model's outputs back
(``zrl.roles.inference_client``); the actors keep stepping one env group while another waits
(``actor.env_groups``). The server joins the requests waiting when it looks (up to
``inference.max_batch_rows`` rows; one request is never split) into one forward per method.

It is stateless: a recurrent policy's state travels with each ``step`` request and comes back
with the outputs, so the actor keeps it (and resets it at episode starts) exactly as when it
runs its own model, and a restarted server loses nothing.

Sockets:

- ROUTER ``rpc`` (found with LOOKUP "inference"): INFER from actors, answered with INFERRED on
  the same connection (``zrl.transport.messages``: ``infer``/``inferred``). At most
  ``REPLY_HWM`` replies are queued per actor and ``REPLY_TOTAL_BYTES`` per ``REPLY_DRAIN_S`` in
  all; a reply past them is dropped and counted (the actor asks again after
  ``inference.request_timeout_s``).
- SUB ``weights`` (topic bus) and GET_WEIGHTS to params at start (``zrl.roles.weights``): the
  policy's newest weights; one process per host takes them for all its actors. Each reply says
  which version computed it.
- a throwaway DEALER to the broker for STATUS (``zrl.roles.rpc_identity``): which planned actor
  holds a connection.

What a request may do is decided by the config, the env's spaces and the registry: the model
is built at setup from the config and a probe env; an INFER must come from a connection a live,
planned actor vouches for, name a method of :data:`zrl.transport.messages.INFER_METHODS` the
model has, and carry observations of the env's shape and dtype (and states of the model's
width), at most ``max_infer_rows`` rows. Anything else is dropped and counted
(``requests_refused``), never fatal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from zrl.algos.kernel.batches import resolve_device
from zrl.roles.base import Role, is_planned
from zrl.roles.params import REPLY_DRAIN_S, REPLY_HWM, REPLY_KERNEL_BUFFER_BYTES
from zrl.roles.rpc_identity import RegisteredPeers, status_rows
from zrl.roles.weights import WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate
from zrl.transport.senders import may_send
from zrl.transport.sockets import ReplyBudget
from zrl.utils.runtime import limit_torch_threads

REPLY_TOTAL_BYTES = 256 << 20
"""Bytes of replies counted as queued for all actors together (each for ``REPLY_DRAIN_S``)."""
MAX_WAITING = 1024
"""Requests taken off the socket and not yet answered (past it: the rest wait in the socket)."""
MAX_KNOWN_ACTORS = 4096
"""Actor connections remembered once the registry vouched for them."""


class JoinBuffers:
    """Reused host buffers the requests of one forward are joined into: pinned when the
    forward runs on a GPU (its copy then needs no staging of its own), grown as needed."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self.buffers: dict[int, torch.Tensor] = {}

    def join(self, slot: int, parts: list[np.ndarray]) -> torch.Tensor:
        """``parts`` joined along their first axis into buffer ``slot``: a tensor over its
        first rows."""
        rows = sum(len(p) for p in parts)
        shape = (rows, *parts[0].shape[1:])
        dtype = torch.from_numpy(np.empty(0, parts[0].dtype)).dtype
        buffer = self.buffers.get(slot)
        if buffer is None or buffer.shape[1:] != shape[1:] or buffer.dtype != dtype:
            buffer = None
        if buffer is None or len(buffer) < rows:
            capacity = max(rows, 2 * len(buffer) if buffer is not None else rows)
            buffer = torch.empty((capacity, *shape[1:]), dtype=dtype, pin_memory=self.pinned)
            self.buffers[slot] = buffer
        np.concatenate(parts, out=buffer.numpy()[:rows])
        return buffer[:rows]


@dataclass
class Request:
    """One checked INFER waiting for its forward."""

    ident: bytes
    seq: int
    method: str
    arrays: list[np.ndarray]
    """The method's arguments in order: observations, then the state for ``step``."""

    @property
    def rows(self) -> int:
        return len(self.arrays[0])


def batches(requests: list[Request], max_rows: int) -> list[list[Request]]:
    """The requests grouped by method, in arrival order, each group cut into runs of at most
    ``max_rows`` rows (a request bigger than that runs alone)."""
    out: list[list[Request]] = []
    for method in dict.fromkeys(r.method for r in requests):
        run: list[Request] = []
        rows = 0
        for r in (r for r in requests if r.method == method):
            if run and rows + r.rows > max_rows:
                out.append(run)
                run, rows = [], 0
            run.append(r)
            rows += r.rows
        out.append(run)
    return out


class InferenceServer(Role):
    role = "inference"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.device = torch.device("cpu")
        self.model: Any = None
        self.weights: WeightsFollower | None = None
        self.obs_shape: tuple[int, ...] = ()
        self.obs_dtype = np.dtype(np.float32)
        self.state_width: int | None = None
        self.methods: tuple[str, ...] = ()
        self.max_rows = 1
        self.waiting: list[Request] = []
        self.staging = JoinBuffers(pinned=False)
        self.requests = 0
        self.requests_refused = 0
        self.replies_dropped = 0
        self.rows = 0
        self.forwards = 0
        self.forward_s = 0.0
        self.reply_budget = ReplyBudget(
            per_peer_bytes=REPLY_TOTAL_BYTES, total_bytes=REPLY_TOTAL_BYTES, drain_s=REPLY_DRAIN_S
        )
        self.actors = RegisteredPeers(
            "inference",
            lambda: status_rows(self.ctx, self.broker, self.keys, ("actor",)),
            self.planned_actor,
            max_known=MAX_KNOWN_ACTORS,
        )

    def bind(self) -> None:
        self.rpc = self.bind_rpc(
            sndhwm=REPLY_HWM, kernel_buffer_bytes=REPLY_KERNEL_BUFFER_BYTES, mandatory=True
        )

    def setup(self) -> None:
        cfg = self.config
        limit_torch_threads(cfg.inference.torch_threads)
        self.device = resolve_device(cfg.inference.device, "inference.device")
        probe = self.make_envs(num_envs=1)  # only for the spaces
        spaces = (probe.single_observation_space, probe.single_action_space)
        probe.close()
        torch.manual_seed(cfg.seed)  # the learner's initial weights until the first version
        self.model = self.make_model(*spaces).to(self.device).eval()
        self.staging = JoinBuffers(pinned=self.device.type == "cuda")
        self.obs_shape = M.obs_shape(spaces[0])
        self.obs_dtype = M.obs_dtype(spaces[0])
        self.methods = tuple(m for m in M.INFER_METHODS if callable(getattr(self.model, m, None)))
        if callable(getattr(self.model, "initial_state", None)):
            self.state_width = int(self.model.initial_state(1).shape[1])
        else:
            self.methods = tuple(m for m in self.methods if m != "step")
        self.max_rows = M.max_infer_rows(cfg.env.num_envs, cfg.actor.trajectory_length)
        self.weights = WeightsFollower(self, self.model, M.DEFAULT_POLICY)
        self.weights.fetch_latest()
        self.log.info(
            "inference on %s for %s: methods %s, batches of at most %d rows",
            self.device,
            cfg.env.id,
            ", ".join(self.methods),
            cfg.inference.max_batch_rows,
        )

    def planned_actor(self, row: dict) -> bool:
        """Whether a STATUS row is an actor the config plans."""
        return is_planned(row, "actor", self.config.roles.count("actors"))

    # --- requests ---------------------------------------------------------------------

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        """Check one INFER and queue it for the next forward (ProtocolError: dropped)."""
        if msg.kind != P.INFER:
            raise P.ProtocolError(f"the inference role serves no {msg.kind!r} requests")
        self.requests += 1
        try:
            request = self.checked(ident, msg)
        except P.ProtocolError:
            self.requests_refused += 1
            raise
        if request is not None:
            self.waiting.append(request)

    def checked(self, ident: bytes, msg: P.Message) -> Request | None:
        """The request ``msg`` makes, checked against the config, the env's spaces and the
        registry; None while it is parked until the registry may be asked who sent it."""
        method, seq = M.infer_request(msg.meta)
        if method not in self.methods:
            raise P.ProtocolError(
                f"infer method {method!r}: this model has only {', '.join(self.methods)}"
            )
        schema = M.INFER_METHODS[method]
        sizes: dict[str, Any] = {"O": self.obs_shape}
        if "state" in schema.arrays:
            sizes["R"] = self.state_width
        dims = validate(msg, schema, **sizes)
        if msg.arrays["obs"].dtype != self.obs_dtype:
            raise P.ProtocolError(
                f"infer observations are {msg.arrays['obs'].dtype}, the env's are {self.obs_dtype}"
            )
        rows = int(dims["B"])
        if not 1 <= rows <= self.max_rows:
            raise P.ProtocolError(
                f"infer of {rows} rows; an actor asks 1 to {self.max_rows} (env.num_envs x "
                "(actor.trajectory_length + 1))"
            )
        peer = self.actors.identify(ident)
        if peer is None and self.actors.deferred:
            oldest = self.actors.park(ident, msg)
            if oldest is not None:
                self.requests_refused += 1
                self.rpc.drop(oldest.sender or "?", "infer refused: too many waiting")
            return None
        if peer is None or not may_send(msg.kind, peer.role, "rpc:inference"):
            raise P.ProtocolError("infer from a connection no planned actor vouches for")
        return Request(ident, seq, method, [msg.arrays[name] for name in schema.arrays])

    # --- forwards ---------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, run: list[Request]) -> list[list[np.ndarray]]:
        """One forward of the method of ``run`` over all its rows; each request's outputs."""
        method = getattr(self.model, run[0].method)
        args = [
            self.staging.join(i, [r.arrays[i] for r in run]).to(self.device, non_blocking=True)
            for i in range(len(run[0].arrays))
        ]
        out = method(*args)
        outputs = out if isinstance(out, tuple) else (out,)
        arrays = [o.detach().float().cpu().numpy() for o in outputs]
        cuts = np.cumsum([r.rows for r in run])[:-1]
        per_output = [np.split(a, cuts) for a in arrays]
        return [[parts[i] for parts in per_output] for i in range(len(run))]

    def answer(self, run: list[Request]) -> None:
        """Run ``run``'s forward and reply to each of its requests."""
        started = time.perf_counter()
        results = self.forward(run)
        self.forward_s += time.perf_counter() - started
        self.forwards += 1
        version = self.weights.version if self.weights is not None else 0
        for request, outputs in zip(run, results, strict=True):
            self.rows += request.rows
            meta = {"seq": request.seq, "weights_version": version}
            arrays = {f"out{i}": out for i, out in enumerate(outputs)}
            self.reply(request.ident, P.Message(P.INFERRED, meta=meta, arrays=arrays))
        self.train_stats.add(
            forward_ms=1000 * (time.perf_counter() - started),
            batch_rows=sum(r.rows for r in run),
            batch_requests=len(run),
        )

    def reply(self, ident: bytes, msg: P.Message) -> None:
        """Send ``msg`` to ``ident``; dropped and counted (``replies_dropped``) past the
        actor's queue or the total, or when it left."""
        if not self.rpc.reply(msg, ident, self.reply_budget):
            self.replies_dropped += 1

    # --- loop -------------------------------------------------------------------------

    def step(self) -> None:
        if self.weights is not None:
            self.weights.update()
        for ident, msg in self.actors.unpark():
            try:
                self.on_request(ident, msg)
            except P.ProtocolError as exc:
                self.rpc.drop(msg.sender or "?", str(exc))
        self.serve_requests(self.rpc, 0 if self.waiting else 50, limit=MAX_WAITING)
        if self.waiting:
            waiting, self.waiting = self.waiting, []
            for run in batches(waiting, self.config.inference.max_batch_rows):
                self.answer(run)

    # --- reports ----------------------------------------------------------------------

    def heartbeat_info(self) -> dict[str, Any]:
        return {
            "weights_version": self.weights.version if self.weights is not None else 0,
            "device": str(self.device),
            "requests": self.requests,
            "requests_refused": self.requests_refused,
            "replies_dropped": self.replies_dropped,
            "rows": self.rows,
            "forwards": self.forwards,
            "forward_s": round(self.forward_s, 3),
        }
