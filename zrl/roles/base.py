"""``Role``: what every zrl process shares — registration, heartbeats, reconnects, sockets.

Sockets a role owns through this class:

- DEALER ``registry`` -> broker ROUTER: HELLO/WELCOME, HEARTBEAT/HEARTBEAT_ACK, BYE.
- whatever the subclass opens with :meth:`open_push`, :meth:`open_pull` (stream
  devices), :meth:`open_publisher`, :meth:`open_subscriber` (topic bus) and
  :meth:`bind_rpc` (its own ROUTER that peers find with LOOKUP).

Liveness: a role heartbeats every ``heartbeat_interval`` from its own loop, so a
role whose loop hangs is (correctly) declared dead. When the broker stops
acknowledging for ``heartbeat_timeout`` the role drops its registry socket and
re-registers with capped exponential back-off, keeping its id; stream sockets
reconnect by themselves (ZeroMQ), so a broker restart needs nothing from the user.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import psutil
import zmq

from zrl import __version__
from zrl.config import ExperimentConfig
from zrl.factories import Factories
from zrl.roles.train_stats import TrainStats
from zrl.transport import protocol as P
from zrl.transport.security import Keys
from zrl.transport.sockets import (
    Channel,
    TransportStats,
    connect_address,
    connect_topics,
    make_socket,
    split_tcp,
)

RECONNECT_BACKOFF_INITIAL_S = 0.1
RECONNECT_BACKOFF_MAX_S = 5.0
METRICS_INTERVAL_S = 1.0
DEFAULT_CONNECT_TIMEOUT_S = 60.0


class RoleError(RuntimeError):
    """A role cannot go on (refused by the broker, broker unreachable, ...); user-facing."""


def advertise_host_for(broker: str) -> str:
    """The local address peers can reach us at: the interface that routes to the broker.

    A UDP connect sends nothing; it only asks the kernel which source address it would use."""
    if not broker.startswith("tcp://"):
        return "127.0.0.1"
    host, port = split_tcp(broker)
    host = host.strip("[]")
    if host in ("localhost", "127.0.0.1", "0.0.0.0", "*"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class Role:
    """Base class of every role. Subclasses implement ``setup``, ``step`` and ``teardown``.

    ``step()`` must return within about 100 ms (it polls its sockets with finite
    timeouts), so heartbeats, metrics and stop requests are handled promptly."""

    role: ClassVar[str] = "role"

    def __init__(
        self,
        broker: str,
        *,
        index: int | None = None,
        ctx: zmq.Context | None = None,
        advertise: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        stop_event: threading.Event | None = None,
        keys: Keys | None = None,
        checkpoint_root: str | Path | None = None,
        local_factories: dict[str, str] | None = None,
    ) -> None:
        self.broker = broker
        self.keys = keys
        # What this process was told locally (its command line), not by the broker: the
        # directory the broker's checkpoint.dir must lie under, and the factory references
        # it may import over an unauthenticated channel. See _checked_checkpoint_dir and
        # _factories_from.
        self.checkpoint_root = Path(checkpoint_root).resolve() if checkpoint_root else None
        self.local_factories = dict(local_factories or {})
        self.index = index
        self.ctx = ctx or zmq.Context.instance()
        self.host = socket.gethostname()
        self.advertise = advertise or advertise_host_for(broker)
        self.connect_timeout = connect_timeout
        self.stop_event = stop_event or threading.Event()
        self.stats = TransportStats()
        self.log = logging.getLogger(f"zrl.{self.role}")
        self.id = f"{self.role}-{index}" if index is not None else ""
        self.config = ExperimentConfig()
        self.factories = Factories()
        self.endpoints: dict[str, str] = {}
        self.heartbeat_interval = 0.5
        self.heartbeat_timeout = 3.0
        self.max_message_bytes = 256 * 2**20
        self.max_topic_message_bytes = 32 * 2**20
        self.rpc_endpoint = ""
        self.state = "starting"
        self._channels: list[Channel] = []
        self._registry: Channel | None = None
        self._last_ack = time.monotonic()
        self._next_heartbeat = 0.0
        self._next_metrics = 0.0
        self._reconnect_at = 0.0
        self._backoff = RECONNECT_BACKOFF_INITIAL_S
        self._metrics_pub: Channel | None = None
        self.train_stats = TrainStats()  # running means of training figures, flushed per report
        self.registrations = 0
        self._process = psutil.Process()

    # --- registration -----------------------------------------------------------------

    def _open_registry(self) -> Channel:
        if self._registry is not None:
            self._registry.close()
        sock = make_socket(self.ctx, zmq.DEALER, rcvtimeo_ms=200, sndtimeo_ms=200, keys=self.keys)
        sock.connect(self.broker)
        self._registry = Channel(sock, "registry", self.id or self.role, self.stats)
        return self._registry

    def _hello(self) -> None:
        assert self._registry is not None
        self._registry.send(
            P.Message(
                P.HELLO,
                meta={
                    "role": self.role,
                    "id": self.id or None,
                    "index": self.index,
                    "host": self.host,
                    "pid": os.getpid(),
                    "address": self.advertise,
                    "rpc": self.rpc_endpoint,
                    "zrl_version": __version__,
                },
            ),
            block=False,
        )

    def _recv_registry(self) -> P.Message | None:
        assert self._registry is not None
        if not int(self._registry.sock.get(zmq.EVENTS)) & zmq.POLLIN:
            return None
        try:
            frames = self._registry.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        try:
            msg = P.decode(frames)
        except P.VersionMismatch as exc:
            raise RoleError(f"broker refused us: {exc}") from None
        except P.ProtocolError as exc:
            self._registry._drop("broker", str(exc))
            return None
        self._registry.stats.received += 1
        return msg

    def _on_welcome(self, msg: P.Message) -> None:
        m = msg.meta
        first = not self.endpoints
        self.id = str(m["id"])
        if self.index is None and self.id.rsplit("-", 1)[-1].isdigit():
            # Started without --index: the broker's numbering keeps seeds and exploration distinct.
            self.index = int(self.id.rsplit("-", 1)[-1])
        if self._registry is not None:
            self._registry.sender = self.id
        spec = m.get("spec")
        if spec is not None:
            config = ExperimentConfig.model_validate(spec)
            config.checkpoint.dir = self._checked_checkpoint_dir(config.checkpoint.dir)
            self.config = config
        self.factories = self._factories_from(msg)
        self.endpoints = {k: connect_address(v, self.broker) for k, v in m["endpoints"].items()}
        self.heartbeat_interval = float(m["heartbeat_interval"])
        self.heartbeat_timeout = float(m["heartbeat_timeout"])
        self.max_message_bytes = int(m["max_message_bytes"])
        self.max_topic_message_bytes = int(m.get("max_topic_message_bytes", self.max_message_bytes))
        self._last_ack = time.monotonic()
        self._backoff = RECONNECT_BACKOFF_INITIAL_S
        self.registrations += 1
        if first:
            self.log.info("registered as %s with broker %s", self.id, self.broker)
        else:
            self.log.info("re-registered as %s with broker %s", self.id, self.broker)
            self.on_reregistered()

    @property
    def broker_authenticated(self) -> bool:
        """Whether what the broker says comes from the user's own broker: CURVE proves its
        server key, and an inproc broker lives in this process."""
        return self.keys is not None or self.broker.startswith("inproc://")

    def _checked_checkpoint_dir(self, d: str | None) -> str | None:
        """The broker's ``checkpoint.dir``, resolved, if it lies under this role's checkpoint
        root; otherwise RoleError. Snapshots and checkpoints are read from and written there,
        so a forged WELCOME must not point them at any file of this host.

        The root is ``checkpoint_root`` (``zrl start --checkpoint-root``; ``zrl run`` passes
        its run's checkpoint directory), else the working directory. An inproc broker's
        config comes from this process and is taken as is."""
        if d is None:
            return None
        root = self.checkpoint_root
        if root is None:
            if self.broker.startswith("inproc://"):
                return d
            root = Path.cwd().resolve()
        resolved = Path(d).expanduser().resolve()
        if not resolved.is_relative_to(root):
            raise RoleError(
                f"the broker's checkpoint.dir {d!r} (resolved: {resolved}) is outside this "
                f"role's checkpoint root {root}: refusing to read or write checkpoints there. "
                "Start the role with --checkpoint-root DIR naming a directory that holds it."
            )
        return str(resolved)

    def _factories_from(self, msg: P.Message) -> Factories:
        refs = msg.meta.get("factories") or {}
        if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
            raise RoleError("the broker sent malformed factory references")
        # A reference imports a module and calls what it names ("os:abort" would do): without
        # an authenticated broker, only the references this role was given locally.
        if not self.broker_authenticated:
            for kind, ref in refs.items():
                if self.local_factories.get(kind) != ref:
                    raise RoleError(
                        f"the broker names the {kind} factory {ref!r} over an unauthenticated "
                        f"channel, and this role was not started with --{kind}-factory={ref}; "
                        "refusing to import it. Start every role with --keys DIR, or pass the "
                        f"same --{kind}-factory to `zrl start` (zrl run does so for its roles)."
                    )
        pickled = msg.arrays.get("factories")
        if pickled is None:
            return Factories.from_wire(refs, None)
        # Unpickling runs code: only from a broker we authenticated (CURVE), or from our own
        # process (inproc), never from whoever answers on an open port.
        if not self.broker_authenticated:
            raise RoleError(
                "the broker offers pickled env/model factories over an unauthenticated "
                "channel; refusing them. Start every role with --keys DIR, or give the "
                "factories as importable 'package.module:name' references."
            )
        return Factories.from_wire(refs, pickled.tobytes())

    def make_envs(self, num_envs: int | None = None) -> Any:
        """A vector env of the experiment's env (the user's factory if the broker sent one)."""
        from zrl.envs import make_vector_env

        return make_vector_env(self.config.env, num_envs, self.factories.env_fn())

    def make_model(self, observation_space: Any, action_space: Any) -> Any:
        from zrl.models import build_model

        return build_model(
            observation_space, action_space, self.config.model, self.config.algo,
            self.factories.model_fn(), twin=self.config.ddpg.twin,
        )  # fmt: skip

    def connect(self) -> None:
        """Register with the broker, retrying with capped back-off until ``connect_timeout``."""
        deadline = time.monotonic() + self.connect_timeout
        backoff = RECONNECT_BACKOFF_INITIAL_S
        while not self.stop_event.is_set():
            self._open_registry()
            self._hello()
            wait_until = time.monotonic() + max(backoff, 0.5)
            while time.monotonic() < wait_until and not self.stop_event.is_set():
                assert self._registry is not None
                if self._registry.sock.poll(50):
                    msg = self._recv_registry()
                    if msg is None:
                        continue
                    if msg.kind == P.WELCOME:
                        self._on_welcome(msg)
                        return
                    if msg.kind == P.REFUSED:
                        raise RoleError(f"broker refused us: {msg.meta.get('reason')}")
            if time.monotonic() > deadline:
                raise RoleError(
                    f"no answer from a broker at {self.broker} after {self.connect_timeout:g}s"
                )
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_S)
        raise RoleError("stopped before the broker answered")

    # --- sockets ----------------------------------------------------------------------

    def _channel(self, sock: zmq.Socket, name: str, **kw: Any) -> Channel:
        kw.setdefault("max_message_bytes", self.max_message_bytes)
        ch = Channel(sock, name, self.id, self.stats, **kw)
        self._channels.append(ch)
        return ch

    def _sock(self, kind: int, **kw: Any) -> zmq.Socket:
        kw.setdefault("max_message_bytes", self.max_message_bytes)
        return make_socket(self.ctx, kind, keys=self.keys, **kw)

    def open_push(self, stream: str, *, hwm: int = 4, sndtimeo_ms: int = 100) -> Channel:
        """PUSH into a stream device: blocks (up to the timeout) when every consumer is full."""
        sock = self._sock(zmq.PUSH, sndhwm=hwm, sndtimeo_ms=sndtimeo_ms,
                          kernel_buffer_bytes=self.config.broker.stream_buffer_bytes)  # fmt: skip
        sock.connect(self._endpoint(f"{stream}_in"))
        return self._channel(sock, stream)

    def open_pull(self, stream: str, *, hwm: int = 4) -> Channel:
        sock = self._sock(zmq.PULL, rcvhwm=hwm, rcvtimeo_ms=100,
                          kernel_buffer_bytes=self.config.broker.stream_buffer_bytes)  # fmt: skip
        sock.connect(self._endpoint(f"{stream}_out"))
        return self._channel(sock, stream)

    # The topic bus carries smaller messages than the streams (``broker.max_topic_message_bytes``)
    # and queues few of them: a queue of ``hwm`` messages of that size is what a role that
    # stops reading a topic can be made to hold.
    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Channel:
        size = self.max_topic_message_bytes
        sock = self._sock(zmq.PUB, sndhwm=hwm, max_message_bytes=size)
        sock.connect(self.endpoints["topics_in"])
        return self._channel(sock, name, topics=True, max_message_bytes=size)

    def open_subscriber(
        self, topics: list[str], name: str | None = None, *, hwm: int = 1000
    ) -> Channel:
        size = self.max_topic_message_bytes
        sock = self._sock(zmq.SUB, rcvhwm=hwm, rcvtimeo_ms=100, max_message_bytes=size)
        for t in topics:
            sock.setsockopt(zmq.SUBSCRIBE, t.encode())
        connect_topics(sock, self.endpoints)
        return self._channel(sock, name or ",".join(topics), topics=True, max_message_bytes=size)

    def bind_rpc(self) -> Channel:
        """A ROUTER peers reach directly after a LOOKUP (bound before HELLO announces it)."""
        sock = self._sock(zmq.ROUTER, rcvtimeo_ms=100, server=True)
        if self.broker.startswith("tcp://"):
            port = sock.bind_to_random_port(f"tcp://{self._bind_host()}")
            self.rpc_endpoint = f"tcp://{self.advertise}:{port}"
        else:
            self.rpc_endpoint = f"inproc://zrl-rpc-{self.role}-{id(self)}"
            sock.bind(self.rpc_endpoint)
        return self._channel(sock, "rpc", envelope=True)

    def _bind_host(self) -> str:
        return "127.0.0.1" if self.advertise.startswith("127.") else "*"

    def _endpoint(self, name: str) -> str:
        if name not in self.endpoints:
            raise RoleError(
                f"the broker runs no {name.rsplit('_', 1)[0]!r} stream "
                f"(it has: {', '.join(k[:-3] for k in self.endpoints if k.endswith('_in'))})"
            )
        return self.endpoints[name]

    def lookup(self, role: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Ask the registry for the rpc endpoints of live roles of a kind (own socket, blocking)."""
        return registry_request(
            self.ctx, self.broker, P.Message(P.LOOKUP, meta={"role": role}), timeout, self.keys
        ).meta.get("services", [])

    # --- liveness ---------------------------------------------------------------------

    def heartbeat_info(self) -> dict[str, Any]:
        """Role-specific figures shown in ``zrl status`` and published as metrics."""
        return {}

    def train_info(self) -> dict[str, float]:
        """Training figures that are read, not averaged (learning rate, epsilon, ...)."""
        return {}

    def train_metrics(self) -> dict[str, float]:
        """The training figures of the metrics report (``train`` in METRICS, once a second):
        the means of what ``train_stats`` gathered since the last report, plus ``train_info``.
        The head writes them as ``<role>/<name>`` (TensorBoard, CSV, W&B, MLflow)."""
        return {**self.train_stats.flush(), **self.train_info()}

    def tick(self) -> None:
        """Heartbeat, read registry replies, re-register if the broker went quiet."""
        now = time.monotonic()
        assert self._registry is not None
        while True:
            msg = self._recv_registry()
            if msg is None:
                break
            if msg.kind == P.HEARTBEAT_ACK:
                self._last_ack = now
            elif msg.kind == P.WELCOME:
                self._on_welcome(msg)
            elif msg.kind == P.UNKNOWN_ROLE:
                self.log.warning("broker does not know us (it restarted?): registering again")
                self._hello()
            elif msg.kind == P.REFUSED:
                raise RoleError(f"broker refused us: {msg.meta.get('reason')}")
        if now - self._last_ack > self.heartbeat_timeout and now >= self._reconnect_at:
            self.log.warning(
                "no heartbeat ack from broker for %.1fs: reconnecting (back-off %.1fs)",
                now - self._last_ack,
                self._backoff,
            )
            self._open_registry()
            self._hello()
            self._reconnect_at = now + self._backoff
            self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_MAX_S)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_interval
            info = self.heartbeat_info()
            info["rss_mb"] = self.check_memory()
            # plain_meta: whatever a counter came to hold, a role never dies on its own status.
            self._registry.send(
                P.Message(
                    P.HEARTBEAT,
                    meta=P.plain_meta(
                        {
                            "id": self.id,
                            "state": self.state,
                            "stats": self.stats.snapshot(),
                            "info": info,
                        }
                    ),
                ),
                block=False,
            )
            if now >= self._next_metrics:
                self._next_metrics = now + METRICS_INTERVAL_S
                train = self.train_metrics()
                self.publish_metrics({**info, "train": train} if train else info)

    def check_memory(self) -> float:
        """Resident memory in MB; past ``limits.memory_mb`` the role stops, saying why.

        Stopping ourselves with a clear message beats the kernel's OOM killer choosing a
        random process of the run."""
        rss_mb = self._process.memory_info().rss / 2**20
        limit = self.config.limits.memory_mb
        if limit is not None and rss_mb > limit:
            raise RoleError(
                f"{self.id} uses {rss_mb:.0f} MB of memory, above limits.memory_mb={limit:g}: stopping"
            )
        return round(rss_mb, 1)

    def publish_metrics(self, info: dict[str, Any]) -> None:
        if self._metrics_pub is None:
            self._metrics_pub = self.open_publisher(P.METRICS_TOPIC)
        self._metrics_pub.send(
            P.Message(
                P.METRICS,
                meta=P.plain_meta({"id": self.id, "role": self.role, "time": time.time(), **info}),
            ),
            topic=P.METRICS_TOPIC,
            block=False,
        )

    # --- lifecycle --------------------------------------------------------------------

    def on_reregistered(self) -> None:
        """Called when the role registered again (the broker restarted or lost us)."""

    def bind(self) -> None:
        """Bind the role's own sockets (its rpc ROUTER); called before HELLO announces them."""

    def setup(self) -> None:
        """Open sockets, build models; called once after registration."""

    def step(self) -> None:
        """One bounded iteration of the role's work."""
        self.stop_event.wait(0.1)

    def teardown(self) -> None:
        """Finish streams; called once on the way out (also after an error)."""

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        """Register, then loop ``step()`` + ``tick()`` until asked to stop."""
        self.bind()
        self.connect()
        try:
            self.setup()
            self.state = "running"
            self._last_ack = time.monotonic()  # a long setup is not a silent broker
            while not self.stop_event.is_set():
                self.step()
                self.tick()
        except BaseException:
            self.state = "stopping"
            try:
                self.teardown()
            except Exception:  # noqa: BLE001 - the first error is the one the log must end on
                self.log.debug("teardown after the error failed too", exc_info=True)
            finally:
                self.close()
            raise
        self.state = "stopping"
        try:
            self.teardown()
        finally:
            self.close()

    def close(self) -> None:
        if self._registry is not None and not self._registry.sock.closed:
            try:
                self._registry.send(
                    P.Message(
                        P.BYE, meta=P.plain_meta({"id": self.id, "stats": self.stats.snapshot()})
                    ),
                    block=False,
                )
                self._registry.close(linger_ms=500)
            except zmq.ZMQError:
                pass
        for ch in self._channels:
            if not ch.sock.closed:
                ch.close()
        self._channels.clear()


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a learner or params checkpoint: tensors, numbers,
    strings and containers only, never code (``checkpoint.dir`` comes from the broker).
    A file that is anything else stops the role naming it, and is left for the user."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RoleError(
            f"{path} is not a checkpoint zrl can load without running code ({first}); "
            "move it away to start afresh"
        ) from None
    if not isinstance(state, dict):
        raise RoleError(f"{path} is not a zrl checkpoint (it holds a {type(state).__name__})")
    return state


def registry_request(
    ctx: zmq.Context, broker: str, msg: P.Message, timeout: float = 5.0, keys: Keys | None = None
) -> P.Message:
    """One request to the broker registry on a throwaway DEALER (status, lookup)."""
    sock = make_socket(ctx, zmq.DEALER, rcvtimeo_ms=int(timeout * 1000), keys=keys)
    try:
        sock.connect(broker)
        ch = Channel(sock, "registry", f"client@{socket.gethostname()}", TransportStats())
        ch.send(msg)
        got = ch.recv()
        if got is None:
            raise RoleError(f"no answer from a broker at {broker} within {timeout:g}s")
        return got[1]
    finally:
        sock.close(linger=0)
