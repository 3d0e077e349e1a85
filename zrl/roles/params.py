"""``ParameterServer``: the latest weights of each learning policy, with a version number.

A run has one weights stream (the default policy, ``main``) unless a league with exploiters
trains several players: then each policy (named by ``policy`` in the meta, absent for the
default) is a stream of its own, with its own versions and topic (``M.policy_topic``).

Sockets:

- ROUTER ``rpc`` (own endpoint, announced in HELLO, found with LOOKUP "params"):
  WEIGHTS {policy} from a learner -> stored as that policy's version v+1, answered with ACK
  {version}; GET_WEIGHTS {policy} from anyone -> WEIGHTS {policy, version} (or NO_WEIGHTS
  before the first); RESET {policy, resets} from the league and EXPLOIT {policy, source, seq,
  hyperparameters} from the pbt role (neither answered; EXPLOIT checked against the config's
  ``pbt``: ``zrl.roles.pbt.exploit_instruction``) are kept per policy, and GET_CONTROL
  {policy} from that policy's learner is answered with CONTROL {policy, resets, exploit}:
  more resets than it applied restart it from its initial weights (an exploiter after a
  snapshot), a newer exploit makes it copy the source member's checkpoint and set the
  hyperparameters once. Replies are bounded per peer
  (``REPLY_HWM`` queued messages, ``REPLY_KERNEL_BUFFER_BYTES`` of kernel buffer) and in
  total (``reply_budget``: ``REPLY_TOTAL_BYTES`` per ``REPLY_DRAIN_S``); a reply past either
  is dropped and counted in ``replies_dropped``. A queued WEIGHTS reply holds the stored
  arrays themselves, not a copy.

What a WEIGHTS may be is fixed at setup, not by the first one that arrives: the names, shapes
and dtypes of the model the config builds for the env's spaces (every policy has that
layout). Anything else is dropped and counted (``weights_refused``). WEIGHTS, GET_CONTROL and
RESET are taken only from a connection a live registry entry vouches for
(``zrl.roles.rpc_identity``): WEIGHTS and GET_CONTROL of a policy from a planned learner of
that policy, RESET from the planned league (``zrl.transport.senders``); others are dropped
and counted (``weights_refused``).
- PUB ``weights`` -> topic bus, topic ``weights`` (``policy/<name>/weights`` for a named
  policy): every new version, so actors and the evaluator pick it up without asking. A late
  joiner asks GET_WEIGHTS once, because PUB/SUB delivers nothing sent before the
  subscription.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zrl.algos.api.learner import GradientServer, GradientServerSetup
from zrl.algos.registry import get_algorithm
from zrl.nets.wire import non_finite_array
from zrl.roles.base import Role, index_of_id, is_planned
from zrl.roles.errors import RoleError
from zrl.roles.pbt import exploit_instruction
from zrl.roles.rpc_identity import Parked, Peer, RegisteredPeers, status_rows
from zrl.roles.trust import load_checkpoint_file
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.senders import may_send
from zrl.transport.sockets import Channel, ReplyBudget
from zrl.utils.durable import atomic_write

# Weights versions: a follower adopts from the bus a version at most MAX_VERSION_STEP past its
# own (further jumps are checked with the server first, see zrl.roles.weights), and this server
# takes a learner's min_version at most that far past its own once it holds weights. Versions
# travel as msgpack integers and land in JSON summaries: past 2**53 they are hostile.
MAX_VERSION_STEP = 10_000
# Per peer on the rpc ROUTER: replies queued for a peer that does not read (then dropped and
# counted), and the kernel's send buffer of its connection.
REPLY_HWM = 2
REPLY_KERNEL_BUFFER_BYTES = 1 << 20
# Bytes of replies counted as queued (each for REPLY_DRAIN_S, zrl.transport.sockets.ReplyBudget):
# per peer, REPLY_HWM weights messages (at least 1 MiB); for all peers, REPLY_TOTAL_BYTES.
REPLY_TOTAL_BYTES = 256 << 20
REPLY_DRAIN_S = 2.0

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Parameter name -> (shape, dtype): what every WEIGHTS of the run carries."""


@dataclass
class Stream:
    """One policy's weights: the newest arrays, their version and the learner's meta, and
    how many resets the league asked for."""

    version: int = 0
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    updated_at: float = 0.0
    resets: int = 0
    exploit: dict[str, Any] | None = None
    """The pbt role's newest EXPLOIT of this policy (``zrl.roles.pbt``), or None."""


def layout_of(arrays: dict[str, np.ndarray]) -> Layout:
    return {name: (tuple(a.shape), a.dtype) for name, a in arrays.items()}


def layout_problem(arrays: dict[str, np.ndarray], layout: Layout) -> str | None:
    """Why ``arrays`` do not have ``layout`` (names, shapes, dtypes), or None."""
    missing = sorted(set(layout) - set(arrays))
    unexpected = sorted(set(arrays) - set(layout))
    if missing or unexpected:
        return f"missing parameters {missing[:5]}, unexpected {[n[:80] for n in unexpected[:5]]}"
    for name, (shape, dtype) in layout.items():
        a = arrays[name]
        if tuple(a.shape) != shape or a.dtype != dtype:
            return f"{name!r} is {a.dtype}{list(a.shape)}, the model's is {dtype}{list(shape)}"
    return None


class ParameterServer(Role):
    role = "params"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.streams: dict[str, Stream] = {M.DEFAULT_POLICY: Stream()}
        self.served = 0
        # Only for an algorithm that names a gradient server (its actors send gradients).
        self.gradient_server: GradientServer | None = None
        self.gradients: Channel | None = None
        self.checkpoint: Path | None = None
        self.next_checkpoint = 0.0
        self.layout: Layout = {}  # of the model the config builds (setup)
        self.weights_refused = 0  # WEIGHTS/RESET of another layout, or from an unvouched peer
        self.replies_dropped = 0  # to peers whose reply queue was full, or gone
        self.reply_budget = ReplyBudget(
            per_peer_bytes=REPLY_TOTAL_BYTES, total_bytes=REPLY_TOTAL_BYTES, drain_s=REPLY_DRAIN_S
        )  # per peer: set from the model's size at setup
        self.peers = RegisteredPeers(
            "params",
            lambda: status_rows(self.ctx, self.broker, self.keys, self.client_roles()),
            self.planned_client,
        )

    @property
    def version(self) -> int:
        """The default policy's newest version."""
        return self.streams[M.DEFAULT_POLICY].version

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The default policy's newest weights."""
        return self.streams[M.DEFAULT_POLICY].arrays

    @property
    def weights_meta(self) -> dict[str, Any]:
        """The meta of the default policy's newest weights (the learner's integers)."""
        return self.streams[M.DEFAULT_POLICY].meta

    def setup(self) -> None:
        self.publisher = self.open_publisher(P.WEIGHTS_TOPIC, hwm=100)
        if get_algorithm(self.config.algo).wiring.experience == "gradients":
            self.setup_gradient_server()
        else:
            self.layout = self.model_layout()
        model_bytes = sum(
            int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.layout.values()
        )
        self.reply_budget = ReplyBudget(
            per_peer_bytes=min(REPLY_TOTAL_BYTES, max(1 << 20, REPLY_HWM * model_bytes)),
            total_bytes=REPLY_TOTAL_BYTES,
            drain_s=REPLY_DRAIN_S,
        )

    def model_layout(self) -> Layout:
        """The names, shapes and dtypes of the model the config builds for the env's spaces
        (as the learner builds it): every policy's WEIGHTS must have them."""
        from zrl.nets.wire import model_to_arrays
        from zrl.utils.runtime import limit_torch_threads

        limit_torch_threads(self.config.learner.torch_threads)
        probe = self.make_envs(num_envs=1)  # only for the spaces
        spaces = (probe.single_observation_space, probe.single_action_space)
        probe.close()
        return layout_of(model_to_arrays(self.make_model(*spaces)))

    def client_roles(self) -> tuple[str, ...]:
        """The roles that may send guarded requests here: learners, the league, the pbt role
        when the config plans one."""
        return ("learner", "league", "pbt") if self.config.roles.pbt else ("learner", "league")

    def planned_client(self, row: dict) -> bool:
        """Whether a STATUS row is a planned role that may send guarded requests here: a
        learner, the league or the pbt role whose index the config plans."""
        roles, role = self.config.roles, str(row.get("role"))
        planned = {"learner": roles.learners, "league": roles.league, "pbt": roles.pbt}.get(role, 0)
        return is_planned(row, role, planned)

    def setup_gradient_server(self) -> None:
        """Build the algorithm's gradient server on a fresh model, resume it from this
        server's checkpoint, and store its weights as the first (or next) version."""
        import torch

        from zrl.utils.runtime import limit_torch_threads

        algorithm = get_algorithm(self.config.algo)
        limit_torch_threads(self.config.learner.torch_threads)
        torch.manual_seed(self.config.seed)  # the workers start from the same initialisation
        probe = self.make_envs(num_envs=1)
        spaces = (probe.single_observation_space, probe.single_action_space)
        model = self.make_model(*spaces)
        probe.close()
        from zrl.nets.wire import model_to_arrays

        self.layout = layout_of(model_to_arrays(model))
        make_server = algorithm.gradient_server
        assert make_server is not None  # its wiring sends gradients (setup)
        self.gradient_server = make_server(
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
        # The server owns the model: a restart must continue it, or the workers (whose
        # weights version is ahead of a fresh server's) would never take its weights again.
        self.checkpoint = self.checkpoint_file(".pt")
        self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
        self.load_checkpoint()
        self.store_model_weights()

    def load_checkpoint(self) -> None:
        if self.gradient_server is None or self.checkpoint is None:
            return
        if not self.checkpoint.is_file():
            return  # a first start: the fresh model becomes v1
        path, self.checkpoint = self.checkpoint, None  # not saved over until it is loaded
        state = load_checkpoint_file(path)
        try:
            self.gradient_server.load_state_dict(state)
            # store_model_weights stores it again
            self.streams[M.DEFAULT_POLICY].version = int(state["version"]) - 1
        except Exception as exc:  # noqa: BLE001 - whatever does not fit, the file is not ours
            raise RoleError(
                f"{path} is not a checkpoint of this server ({type(exc).__name__}: "
                f"{str(exc)[:200]}); move it away to start afresh"
            ) from None
        self.checkpoint = path
        self.log.info(
            "resumed from %s: update %d, weights v%d",
            self.checkpoint,
            self.gradient_server.updates,
            self.version + 1,
        )

    def save_checkpoint(self) -> None:
        import torch

        if self.gradient_server is None or self.checkpoint is None:
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        # A crash or a power cut mid-write leaves the old one (see zrl.utils.durable).
        with atomic_write(self.checkpoint) as f:
            torch.save({**self.gradient_server.state_dict(), "version": self.version}, f)

    def store_model_weights(self) -> None:
        """Store and publish the gradient server's model as the next version."""
        from zrl.nets.wire import model_to_arrays

        assert self.gradient_server is not None
        stream = self.streams[M.DEFAULT_POLICY]
        stream.arrays = model_to_arrays(self.gradient_server.model)
        stream.version += 1
        stream.updated_at = time.time()
        stream.meta = {"updates": self.gradient_server.updates}
        self.publish_weights(M.DEFAULT_POLICY)

    def on_gradients(self, msg: P.Message) -> None:
        """One message of the ``gradients`` stream (ProtocolError: dropped and counted)."""
        assert self.gradient_server is not None
        if self.gradient_server.receive(msg, self.version):
            self.store_model_weights()

    def bind(self) -> None:
        self.rpc = self.bind_rpc(
            sndhwm=REPLY_HWM, kernel_buffer_bytes=REPLY_KERNEL_BUFFER_BYTES, mandatory=True
        )

    def reply(self, ident: bytes, msg: P.Message, budget: bool = True) -> None:
        """Send ``msg`` to the peer ``ident``; dropped and counted when its queue is full
        (``REPLY_HWM``), past the ``reply_budget`` (unless ``budget`` is False: a vouched
        learner's ACK, which no flood of other peers may crowd out) or it left."""
        if not self.rpc.reply(msg, ident, self.reply_budget if budget else None):
            self.replies_dropped += 1

    def step(self) -> None:
        if self.gradient_server is not None:
            if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
                self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
                self.save_checkpoint()
            self.drain_gradients()
        self.serve_requests(self.rpc, 0 if self.gradient_server is not None else 100)
        for ident, msg in self.peers.unpark():  # WEIGHTS of a model's size at most
            try:
                self.on_request(ident, msg)
            except P.ProtocolError as exc:
                self.rpc.drop(msg.sender or "?", str(exc))

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
                self.gradients.drop(got[1].sender or "?", str(exc))

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        """One rpc request (ProtocolError: dropped and counted); a guarded one from a
        connection the registry was not asked about yet waits (``RegisteredPeers.park``)."""
        try:
            self.handle_request(ident, msg)
        except Parked:
            pass

    def handle_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.WEIGHTS and self.gradient_server is not None:
            raise P.ProtocolError(
                f"{self.config.algo}: the parameter server owns the weights; send gradients"
            )
        if msg.kind == P.WEIGHTS:
            self.on_weights(ident, msg)
        elif msg.kind == P.GET_WEIGHTS:
            self.served += 1
            policy = self.known_policy(msg.meta)
            if not self.streams[policy].arrays:
                self.reply(ident, P.Message(P.NO_WEIGHTS, meta=M.policy_meta(policy)))
            else:
                self.reply(ident, self.weights_message(policy))
        elif msg.kind == P.RESET:
            policy = self.known_policy(msg.meta)
            self.vouched_sender(ident, msg)
            stream = self.streams[policy]
            stream.resets = max(stream.resets, M.reset_count(msg.meta))
        elif msg.kind == P.EXPLOIT:
            policy = self.known_policy(msg.meta)
            instruction = exploit_instruction(msg.meta, self.config)
            self.vouched_sender(ident, msg)
            stream = self.streams[policy]
            if stream.exploit is None or instruction["seq"] > stream.exploit["seq"]:
                stream.exploit = instruction
        elif msg.kind == P.GET_CONTROL:
            policy = self.known_policy(msg.meta)
            self.vouched_sender(ident, msg, policy)
            self.reply(ident, P.Message(P.CONTROL, meta=self.control(policy)), budget=False)
        else:
            raise P.ProtocolError(f"params does not serve {msg.kind!r}")

    def known_policy(self, meta: dict[str, Any]) -> str:
        """The message's policy, one of the run's (``ExperimentConfig.policies``): a stream
        is only made for those, so no peer can grow this server's memory with names."""
        policy = M.policy_name(meta)
        if policy not in self.config.policies:
            raise P.ProtocolError(f"policy {policy!r} is not one of {self.config.policies}")
        self.streams.setdefault(policy, Stream())
        return policy

    def vouched_sender(self, ident: bytes, msg: P.Message, policy: str | None = None) -> Peer:
        """The registered role sending ``msg`` on connection ``ident``, if the sender table
        lets its role send this kind here (and, for WEIGHTS, it is a learner of ``policy``);
        ProtocolError (counted in ``weights_refused``) otherwise."""
        peer = self.peers.identify(ident)
        problem = None
        if peer is None and self.peers.deferred:
            oldest = self.peers.park(ident, msg)
            if oldest is not None:
                self.weights_refused += 1
                self.rpc.drop(oldest.sender or "?", f"{oldest.kind} refused: too many waiting")
            raise Parked
        if peer is None:
            problem = "no live registry entry vouches for its connection"
        elif not may_send(msg.kind, peer.role, "rpc:params"):
            problem = f"{peer.id} is a {peer.role}, which may not send it"
        elif policy is not None:
            index = index_of_id(peer.id, peer.role)
            if index is None or self.config.learner_policy(index) != policy:
                problem = f"{peer.id} does not train {policy!r}"
        if problem is not None:
            self.weights_refused += 1
            raise P.ProtocolError(f"{msg.kind} refused: {problem}")
        assert peer is not None
        return peer

    def on_weights(self, ident: bytes, msg: P.Message) -> None:
        """A learner's new weights for its policy: stored as the next version, published and
        acked with the version."""
        policy = self.known_policy(msg.meta)
        stream = self.streams[policy]
        problem = layout_problem(msg.arrays, self.layout)
        if problem is not None:
            self.weights_refused += 1
            raise P.ProtocolError(f"weights of another layout than the model's: {problem}")
        self.vouched_sender(ident, msg, policy)
        bad = non_finite_array(msg.arrays)  # once per version, each array reduced in C
        if bad is not None:
            raise P.ProtocolError(f"weights with NaN or inf values in {bad!r}")
        floor = msg.meta.get("min_version", 0)
        if not isinstance(floor, int) or isinstance(floor, bool) or floor > M.MAX_VERSION:
            raise P.ProtocolError(f"weights with min_version {floor!r}, not an int <= 2**53")
        if stream.arrays and floor > stream.version + MAX_VERSION_STEP:
            # A resumed learner's floor is a jump only into a fresh server (no arrays yet);
            # later, a far jump would only lock every follower onto a forged version.
            raise P.ProtocolError(
                f"weights with min_version {floor}, more than {MAX_VERSION_STEP} past "
                f"the current v{stream.version}"
            )
        # The arrays are views on the received frames; holding them keeps the frames alive,
        # so storing a version costs no copy.
        stream.arrays = msg.arrays
        # A resumed learner asks to continue its numbering; versions never go backwards.
        stream.version = max(stream.version + 1, floor)
        stream.updated_at = time.time()
        stream.meta = {
            k: v for k, v in msg.meta.items() if isinstance(v, int | float | str) and k != "policy"
        }
        self.publish_weights(policy)
        ack = {"version": stream.version, **M.policy_meta(policy)}
        self.reply(ident, P.Message(P.ACK, meta=ack), budget=False)

    def control(self, policy: str) -> dict[str, Any]:
        """A CONTROL's meta: the league's resets and the pbt role's newest exploit of
        ``policy`` (each absent while there is none)."""
        stream = self.streams[policy]
        meta: dict[str, Any] = dict(M.policy_meta(policy))
        if stream.resets:
            meta["resets"] = stream.resets
        if stream.exploit is not None:
            meta["exploit"] = stream.exploit
        return meta

    def weights_message(self, policy: str = M.DEFAULT_POLICY) -> P.Message:
        stream = self.streams[policy]
        meta = {**stream.meta, "version": stream.version, **M.policy_meta(policy)}
        return P.Message(P.WEIGHTS, meta=meta, arrays=stream.arrays)

    def publish_weights(self, policy: str = M.DEFAULT_POLICY) -> None:
        topic = M.policy_topic(P.WEIGHTS_TOPIC, policy)
        self.publisher.send(self.weights_message(policy), topic=topic, block=False)

    def teardown(self) -> None:
        if self.gradient_server is not None:
            self.save_checkpoint()
            summary = self.gradient_server.summary()
            if summary:
                self.log.info("%s: %s", self.id, summary)

    def train_info(self) -> dict[str, float]:
        return self.gradient_server.train_info() if self.gradient_server is not None else {}

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "weights_version": self.version,
            "late_join_requests": self.served,
            "weights_refused": self.weights_refused,
            "replies_dropped": self.replies_dropped,
        }
        for policy, stream in self.streams.items():
            if policy != M.DEFAULT_POLICY:
                info[f"weights_version_{policy}"] = stream.version
        if self.gradient_server is not None:
            info.update(self.gradient_server.heartbeat_info())
        return info
