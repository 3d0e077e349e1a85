"""``Broker``: binds the broker's sockets and wires its three jobs.

Sockets, all bound here (base address tcp://H:P; see ``broker_endpoints`` for the layout):

- ROUTER ``registry`` (P): the role registry (``registry.py``): HELLO/WELCOME/REFUSED,
  HEARTBEAT, BYE, LOOKUP, STATUS. Its loop runs in the thread that calls ``run()``.
- XSUB ``topics_in`` (P+1), XPUB ``topics_out`` (P+2) and XPUB ``topics_bulk_out`` (after
  the streams): the topic bus (``topic_bus.py``), forwarded in its own thread.
- per stream S, PULL ``S_in`` / PUSH ``S_out``: the stream devices (``devices.py``).

A tcp broker binds each of these sockets on ipc:// too (``broker.ipc``), in a private
directory ``<tmp>/zrl-ipc-<uid>-<port>`` that it locks while it runs and removes at stop; the
WELCOME carries both sets with the broker's hostname and boot id, and a role on the same
machine connects over ipc (``usable_ipc_endpoints``), skipping the loopback TCP stack. The
ipc endpoints are extra bindings of the same sockets, so CURVE applies to them unchanged.

The broker composes what every WELCOME tells a role (the experiment spec, the endpoints,
the limits, the factories) and the broker's part of a STATUS reply. ``stop_token``: the
secret a head's STOP_RUN must carry (see ``registry``); ``zrl start broker`` reads it from
``ZRL_STOP_TOKEN``. With Python-callable
factories it refuses to start without keys: it ships them as pickles, which a role takes
only from an authenticated broker.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import threading
import time
from typing import Any

import numpy as np
import zmq

from zrl.algos import registry as _registry  # noqa: F401 - the algorithms' config sections (light)
from zrl.broker.devices import Devices
from zrl.broker.limits import DropLog
from zrl.broker.registry import REGISTRY_MAX_MESSAGE_BYTES, Registry, registry_socket
from zrl.broker.role_table import RoleEntry
from zrl.broker.topic_bus import TopicBus, topic_sockets
from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.config.sections import DEFAULT_STREAMS
from zrl.transport import protocol as P
from zrl.transport.endpoints import (
    broker_endpoints,
    host_identity,
    ipc_broker_endpoints,
    is_private_dir,
)
from zrl.transport.security import Keys, stop_authenticator
from zrl.transport.senders import planned_ids
from zrl.transport.sockets import Channel, TransportStats
from zrl.utils.version import __version__

log = logging.getLogger("zrl.broker")


class Broker:
    """Registry plus routing devices. ``run()`` serves until ``stop()`` is called."""

    def __init__(
        self,
        bind: str,
        config: ExperimentConfig | None = None,
        *,
        ctx: zmq.Context | None = None,
        keys: Keys | None = None,
        factories: Factories | None = None,
        stop_token: str | None = None,
        run_secret: bytes | None = None,
    ) -> None:
        self.config = config
        self.keys = keys
        if run_secret is None and keys is not None:
            run_secret = keys.run_secret
            if run_secret is None:
                log.warning(
                    "%s has no run.secret: any holder of an authorized key can register as "
                    "any role (make a new key directory with `zrl keys init`)",
                    keys.directory,
                )
        self.factories = factories or Factories()
        if self.factories.needs_pickle() and keys is None and not bind.startswith("inproc://"):
            raise ValueError(
                "this experiment's env/model factories are Python callables, which the broker "
                "ships as pickles: that needs --keys (authenticated sockets), or factories given "
                "as 'package.module:name' references"
            )
        self._pickled = (
            np.frombuffer(self.factories.pickled(), dtype=np.uint8)
            if self.factories.needs_pickle()
            else None
        )
        bcfg = config.broker if config is not None else ExperimentConfig().broker
        self.streams = list(bcfg.streams) if config is not None else list(DEFAULT_STREAMS)
        self.heartbeat_interval = bcfg.heartbeat_interval
        self.heartbeat_timeout = bcfg.heartbeat_timeout
        self.max_message_bytes = bcfg.max_message_bytes
        self.stream_hwm = bcfg.stream_hwm
        self.stream_buffer_bytes = bcfg.stream_buffer_bytes
        self.max_topic_message_bytes = min(bcfg.max_topic_message_bytes, bcfg.max_message_bytes)
        self.topic_hwm = bcfg.topic_hwm
        self.bulk_topic_hwm = bcfg.bulk_topic_hwm
        self.small_topic_message_bytes = min(
            bcfg.small_topic_message_bytes, self.max_topic_message_bytes
        )
        self.topic_buffer_bytes = bcfg.topic_buffer_bytes
        self.max_roles = bcfg.max_roles
        self.max_info_bytes = bcfg.max_info_bytes
        self.forget_after = bcfg.forget_after
        self.bind_address = bind
        self.endpoints = broker_endpoints(bind, self.streams)
        # ipc:// twins of the tcp endpoints for roles on this machine (never for inproc).
        self.ipc_endpoints: dict[str, str] = {}
        self._ipc_dir: str | None = None
        self._ipc_lock: int | None = None
        if bcfg.ipc and bind.startswith("tcp://"):
            self._open_ipc_dir()
        # An own context lets close() end devices blocked on a full queue (ctx.term() wakes
        # them with ETERM); in-process mode shares the caller's context for inproc://.
        self._owns_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.stats = TransportStats()
        self._drops = DropLog()
        self._stop = threading.Event()
        self._devices = Devices(self.ctx, keys, self.max_message_bytes)
        self.started = time.time()
        self.id = f"broker@{socket.gethostname()}"
        self.host = host_identity()

        registry_max = min(self.max_message_bytes, REGISTRY_MAX_MESSAGE_BYTES)
        registry = registry_socket(self.ctx, registry_max, keys)
        self._bind(registry, "registry")
        self.registry = Channel(
            registry,
            "registry",
            self.id,
            self.stats,
            envelope=True,
            max_message_bytes=registry_max,
        )
        self._registry = Registry(
            self.registry,
            bcfg,
            drops=self._drops,
            welcome=self._welcome,
            broker_status=self._status,
            stop_token=stop_token,
            run_secret=run_secret,
            # roles.count: ValueError for an actors: auto the head has not resolved.
            planned=planned_ids(config.roles.counts()) if config is not None else frozenset(),
        )
        xsub, xpub, bulk = topic_sockets(
            self._devices,
            hwm=self.topic_hwm,
            bulk_hwm=self.bulk_topic_hwm,
            buffer_bytes=self.topic_buffer_bytes,
            max_message_bytes=self.max_topic_message_bytes,
        )
        self._bind(xsub, "topics_in")
        self._bind(xpub, "topics_out")
        self._bind(bulk, "topics_bulk_out")
        self._topic_bus = TopicBus(
            bulk,
            small_message_bytes=self.small_topic_message_bytes,
            max_message_bytes=self.max_topic_message_bytes,
            drops=self._drops,
        )
        self._devices.start("topics", xsub, xpub, loop=self._topic_bus.forward)
        for name in self.streams:
            pull = self._devices.socket(zmq.PULL, self.stream_hwm, self.stream_buffer_bytes)
            push = self._devices.socket(zmq.PUSH, self.stream_hwm, self.stream_buffer_bytes)
            self._bind(pull, f"{name}_in")
            self._bind(push, f"{name}_out")
            self._devices.start(name, pull, push)

    @property
    def roles(self) -> dict[str, RoleEntry]:
        """The registry's entries, by role id."""
        return self._registry.roles

    @property
    def rejected(self) -> dict[str, int]:
        """Registry and topic bus messages refused or dropped, by reason."""
        return self._drops.rejected

    @property
    def topic_dropped(self) -> int:
        """Topic bus messages over the frame or byte limit."""
        return self._topic_bus.dropped

    def _open_ipc_dir(self) -> None:
        """Create (or take over from a broker that died) the private ipc directory and lock
        it; on any doubt (not ours, locked by a live broker on another interface with this
        port, paths too long) the broker serves tcp only."""
        eps = ipc_broker_endpoints(self.bind_address, self.streams)
        if eps is None:
            log.warning("ipc paths would be too long for unix sockets: serving tcp only")
            return
        d = os.path.dirname(eps["registry"][len("ipc://") :])
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            log.warning("cannot create %s (%s): serving tcp only", d, exc)
            return
        if not is_private_dir(d):
            log.warning("%s is not a private directory of this user: serving tcp only", d)
            return
        try:
            fd = os.open(os.path.join(d, "lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("cannot open the lock in %s (%s): serving tcp only", d, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            log.warning("%s is in use by another broker: serving tcp only", d)
            return
        self._ipc_dir, self._ipc_lock, self.ipc_endpoints = d, fd, eps

    def _close_ipc_dir(self) -> None:
        if self._ipc_lock is None:
            return
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        os.close(self._ipc_lock)
        self._ipc_lock = self._ipc_dir = None

    def _bind(self, sock: zmq.Socket, name: str) -> None:
        addr = self.endpoints[name]
        try:
            sock.bind(addr)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._devices.close()
            self._close_ipc_dir()
            raise OSError(f"broker cannot bind {name} at {addr}: {exc}") from None
        if self.ipc_endpoints:
            try:
                sock.bind(self.ipc_endpoints[name])
            except zmq.ZMQError as exc:
                # Roles fall back to tcp: the WELCOME then offers no ipc endpoints.
                log.warning("cannot bind %s: %s; serving tcp only", self.ipc_endpoints[name], exc)
                self.ipc_endpoints = {}

    def _welcome(self, rid: str) -> P.Message:
        """What the registry tells a role it registered as ``rid``."""
        spec = self.config.model_dump(mode="json") if self.config is not None else None
        return P.Message(
            P.WELCOME,
            arrays={"factories": self._pickled} if self._pickled is not None else {},
            meta=dict(
                id=rid,
                spec=spec,
                endpoints=self.endpoints,
                ipc_endpoints=self.ipc_endpoints,
                host=self.host,
                streams=self.streams,
                heartbeat_interval=self.heartbeat_interval,
                heartbeat_timeout=self.heartbeat_timeout,
                max_message_bytes=self.max_message_bytes,
                max_topic_message_bytes=self.max_topic_message_bytes,
                zrl_version=__version__,
                broker_started=self.started,
                secure=self.keys is not None,
                factories=self.factories.references,
            ),
        )

    def _status(self) -> dict[str, Any]:
        """The broker's part of a STATUS reply (``broker``; the roles are ``roles``)."""
        return {
            "id": self.id,
            "bind": self.bind_address,
            "ipc": bool(self.ipc_endpoints),
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 1),
            "zrl_version": __version__,
            "registry": self.stats.snapshot(),
            "rejected": dict(self.rejected),
            "topic_dropped": self.topic_dropped,
            "status_replies": {
                "queued_bytes": self._registry.status_budget.queued,
                "dropped": self._registry.status_budget.dropped,
                "dropped_bytes": self._registry.status_budget.dropped_bytes,
            },
            "limits": {
                "max_roles": self.max_roles,
                "max_info_bytes": self.max_info_bytes,
                "forget_after": self.forget_after,
                "topic_hwm": self.topic_hwm,
                "small_topic_message_bytes": self.small_topic_message_bytes,
                "bulk_topic_hwm": self.bulk_topic_hwm,
                "max_topic_message_bytes": self.max_topic_message_bytes,
            },
            "experiment": self.config.name if self.config is not None else None,
        }

    def status_rows(self) -> list[dict[str, Any]]:
        return self._registry.status_rows()

    def run(self) -> None:
        log.info("broker listening on %s (streams: %s)", self.bind_address, ", ".join(self.streams))
        try:
            self._registry.serve(self._stop)
        except zmq.ContextTerminated:
            pass
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._devices.close()
        if not self.registry.sock.closed:
            self.registry.close()
        if self._owns_ctx:
            stop_authenticator(self.ctx)
            self.ctx.term()
        self._close_ipc_dir()
        log.info("broker stopped")
