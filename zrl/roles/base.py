"""``Role``: what every zrl process shares — registration, heartbeats, reconnects, sockets.

Sockets a role owns through this class:

- DEALER ``registry`` -> broker ROUTER: HELLO/WELCOME, HEARTBEAT/HEARTBEAT_ACK, BYE.
- whatever the subclass opens with :meth:`open_push`, :meth:`open_pull` (stream
  devices), :meth:`open_publisher`, :meth:`open_subscriber` (topic bus) and
  :meth:`bind_rpc` (its own ROUTER that peers find with LOOKUP): ``zrl.roles.role_sockets``.
- a throwaway DEALER -> broker ROUTER per :meth:`lookup` (``zrl.roles.registry_client``).

What a WELCOME may tell a role (its checkpoint directory, its factories, a module env id)
is checked by ``zrl.roles.trust``; its id only ever has the form ``<role>-<n>``
(``index_of_id``), and every file a role names after it lies in ``checkpoint.dir`` under the
checkpoint root (``checkpoint_file``). A role started by a host agent tells it its id and
state in a file of the agent's (``PARENT_REPORT_ENV``).

Liveness: a role's heartbeats come from two places. Its loop sends one every
``heartbeat_interval`` (``tick``, and ``heartbeat_if_due`` inside a long step: an actor between
env steps) with its figures (stream counters, ``heartbeat_info``) and ``loop``, the turns of its
loop so far. A thread of its own (``pulse``, from registration to ``close``) sends one with
``id``, ``seq``, ``state`` and ``loop`` alone whenever the loop has sent none for an interval:
a long update, a slow setup or a starved core never silences a role whose process lives. The
broker then tells *dead* (no heartbeat) from *stalled* (heartbeats, but ``loop`` unchanged for
``broker.stall_after``). zmq sockets are not thread-safe: every use of the registry and agent
channels holds ``_wire``, and what the thread reads while the loop is held (acks, WELCOME,
REFUSED) waits in an inbox for the loop's next ``tick``, except UNKNOWN_ROLE, which it answers
with HELLO at once. A role started by a host agent
(``AGENT_ID_ENV``, ``AGENT_ENDPOINT_ENV``) that the registry registered under it (its WELCOME's
``agent``) heartbeats the agent instead, over a DEALER ``agent`` -> the agent's ipc ROUTER; the
agent reports it to the broker in its own heartbeat and relays the acks. When the broker stops
acknowledging for ``heartbeat_timeout`` the role drops its registry socket and
re-registers with capped exponential back-off, keeping its id; stream sockets
reconnect by themselves (ZeroMQ), so a broker restart needs nothing from the user. A broker
gone for ``broker.orphan_timeout`` (a plain ``zrl start broker`` that was stopped) stops the
role, which says so in its log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

import psutil
import zmq

from zrl.algos.api.train_stats import TrainStats
from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.roles.errors import ExperimentStopped, RoleError
from zrl.roles.registry_client import advertise_host_for, refuses_handshake, registry_request
from zrl.roles.role_sockets import RoleSockets
from zrl.roles.rpc_identity import ClientKeys
from zrl.roles.trust import (
    broker_authenticated,
    checked_checkpoint_dir,
    checked_env_id,
    factories_from,
)
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.endpoints import connect_address, usable_ipc_endpoints
from zrl.transport.security import Keys, hello_credential
from zrl.transport.sockets import Channel, TransportStats, make_socket
from zrl.utils.durable import atomic_write_text
from zrl.utils.runtime import keep_freed_memory
from zrl.utils.version import __version__

RECONNECT_BACKOFF_INITIAL_S = 0.1
RECONNECT_BACKOFF_MAX_S = 5.0
KEYS_CHECK_AFTER_S = 3.0
"""How long a role waits for its first answer before it asks whether the broker refuses its
keys (``_check_handshake``): a wrong key is named within seconds, not at connect_timeout."""
KEYS_CHECK_TIMEOUT_S = 3.0
METRICS_INTERVAL_S = 1.0
DEFAULT_CONNECT_TIMEOUT_S = 60.0
PULSE_MIN_WAIT_S = 0.05
"""The heartbeat thread looks again at most this often (it sleeps until a beat is due)."""
PULSE_JOIN_S = 2.0
INBOX_LIMIT = 64
"""Registry replies the heartbeat thread keeps for the loop (acks coalesced to the newest)."""
MAX_ROLE_INDEX = 999_999_999
"""The largest role index: ids (``<role>-<n>``) name files and travel in every HELLO."""
_ROLE_ID = re.compile(r"(?P<role>[a-z]+)-(?P<index>0|[1-9][0-9]{0,8})")


def valid_index(value: Any) -> bool:
    """Whether ``value`` is a role index: an int from 0 to ``MAX_ROLE_INDEX``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ROLE_INDEX


def index_of_id(rid: Any, role: str) -> int | None:
    """n when ``rid`` is ``<role>-<n>`` with n a role index (no sign, no leading zero, at most
    ``MAX_ROLE_INDEX``), else None. Only such ids become file names (``checked_file``)."""
    m = _ROLE_ID.fullmatch(rid) if isinstance(rid, str) else None
    if m is None or m["role"] != role:
        return None
    return int(m["index"])


def is_planned(row: dict, role: str, planned: int) -> bool:
    """Whether a STATUS ``row`` is of ``role`` with an index the config plans (below
    ``planned``): its ``role`` field and its id say so."""
    index = index_of_id(row.get("id"), role)
    return row.get("role") == role and index is not None and index < planned


PARENT_REPORT_ENV = "ZRL_ROLE_REPORT"
"""The file, in a directory of the host agent that started this role, that the role writes
its id and state to (``write_parent_report``): the agent learns them from its own child,
never from the registry's rows, which anyone registered can forge."""
MAX_PARENT_REPORT_BYTES = 4096
AGENT_ID_ENV = "ZRL_HOST_AGENT"
"""The id of the host agent that started this role: its HELLO names it (``agent``), and when
the registry registers the role under it the role heartbeats the agent, not the broker."""
AGENT_ENDPOINT_ENV = "ZRL_HOST_AGENT_ENDPOINT"
"""Where that agent takes its roles' heartbeats: an ipc:// socket in a private directory."""
AGENT_ACK_BYTES = 2**16  # what a role takes from its agent: acks


def keep(inbox: deque[Any], msg: Any) -> None:
    """Put ``msg`` in ``inbox``; a HEARTBEAT_ACK after an ack replaces it (only the newest
    ack's ``stop`` and figures matter, and a loop held for minutes must not pile them up)."""
    ack = isinstance(msg, P.Message) and msg.kind == P.HEARTBEAT_ACK
    last = inbox[-1] if inbox else None
    if ack and isinstance(last, P.Message) and last.kind == P.HEARTBEAT_ACK:
        inbox[-1] = msg
    else:
        inbox.append(msg)


def write_parent_report(path: str | Path, rid: str, pid: int, state: str) -> None:
    """What a role tells the agent that started it: its id (``<role>-<n>``), pid and state."""
    atomic_write_text(path, json.dumps({"id": rid, "pid": pid, "state": state}))


def read_parent_report(path: Path, role: str, pid: int) -> tuple[int, str] | None:
    """(index, state) from the report of the child ``pid`` of role ``role``, or None while
    there is none (or it is not that child's, or malformed)."""
    try:
        with open(path, "rb") as f:
            got = json.loads(f.read(MAX_PARENT_REPORT_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(got, dict) or got.get("pid") != pid:
        return None
    index, state = index_of_id(got.get("id"), role), got.get("state")
    return (index, state) if index is not None and isinstance(state, str) else None


def checked_file(directory: str | Path, name: str, root: Path | None = None) -> Path:
    """``directory/name``, resolved (symlinks followed), if it lies directly in ``directory``
    and under ``root``; otherwise RoleError naming it. Every file a role reads or writes under
    ``checkpoint.dir`` is named so: the name comes from its id, which came from the broker."""
    base = Path(directory).expanduser().resolve()
    path = (base / name).resolve()
    if Path(name).name != name or name in ("", ".", "..") or path.parent != base:
        raise RoleError(f"refusing the checkpoint file name {name!r}: it would leave {base}")
    if root is not None and not path.is_relative_to(root):
        raise RoleError(
            f"refusing the checkpoint file {path}: it is outside the checkpoint root {root}"
        )
    return path


class Role(RoleSockets):
    """Base class of every role. Subclasses implement ``setup``, ``step`` and ``teardown``.

    ``step()`` should return within about 100 ms (it polls its sockets with finite
    timeouts), so registry replies, metrics and stop requests are handled promptly. A longer
    one does not make the role look dead (its heartbeat thread goes on), only stalled past
    ``broker.stall_after`` (its loop does not turn)."""

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
        local_env_id: str | None = None,
    ) -> None:
        self.broker = broker
        self.keys = keys
        # What this process was told locally (its command line), not by the broker: the
        # directory the broker's checkpoint.dir must lie under, and the factory references
        # and module env id it may import over an unauthenticated channel. See zrl.roles.trust.
        self.checkpoint_root = Path(checkpoint_root).resolve() if checkpoint_root else None
        self.files_dir: str | None = None
        """Where this role keeps its files, once it keeps any (``keeps_files_in``)."""
        self.local_factories = dict(local_factories or {})
        self.local_env_id = local_env_id
        if index is not None and not valid_index(index):
            raise RoleError(
                f"bad role index {index!r}: an index is a whole number from 0 to {MAX_ROLE_INDEX}"
            )
        self.index = index
        self.ctx = ctx or zmq.Context.instance()
        self.host = socket.gethostname()
        # Tells the broker that HELLOs sent on several sockets come from this one object.
        self.instance = secrets.token_hex(8)
        self.advertise = advertise or advertise_host_for(broker)
        self.connect_timeout = connect_timeout
        self.stop_event = stop_event or threading.Event()
        self.stats = TransportStats()
        self.log = logging.getLogger(f"zrl.{self.role}")
        self.id = f"{self.role}-{index}" if index is not None else ""
        self.config = ExperimentConfig()
        self.factories = Factories()
        self.endpoints: dict[str, str] = {}
        self.transport = ""  # how the streams and topics are reached: "tcp", "ipc", "inproc"
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
        self.orphaned = False  # stopped because the broker was gone past broker.orphan_timeout
        self._process = psutil.Process()
        self._rss_mb = 0.0  # the last check_memory
        self._parent_report = os.environ.get(PARENT_REPORT_ENV) or None
        self._agent_id = os.environ.get(AGENT_ID_ENV) or None
        self._agent_endpoint = os.environ.get(AGENT_ENDPOINT_ENV) or None
        self._agent: Channel | None = None
        """A DEALER to the host agent that heartbeats for us, while the registry says so."""
        self._beat_seq = 0
        """The ``seq`` of our last HEARTBEAT (counts up from 1)."""
        self._acked_seq = 0
        """The highest ``seq`` the broker acknowledged to us directly (not through an agent)."""
        self._direct_seq = 0
        """The ``seq`` of the loop's last heartbeat sent to the broker directly."""
        self._wire = threading.RLock()
        """Held for every use of the registry and agent channels: the loop and the heartbeat
        thread share them, and zmq sockets are not thread-safe."""
        self._registry_inbox: deque[P.Message | RoleError] = deque(maxlen=INBOX_LIMIT)
        self._agent_inbox: deque[P.Message] = deque(maxlen=INBOX_LIMIT)
        """What the heartbeat thread read on the registry and agent channels, for ``tick``."""
        self.loop_turns = 0
        """Turns of the role's loop (``tick``, ``heartbeat_if_due``): every heartbeat's
        ``loop``, unchanged while a step holds the loop (the broker shows it stalled)."""
        self._last_beat = 0.0
        """When the last heartbeat went out (the loop's or the thread's), monotonic."""
        self.pulses = 0
        """Heartbeats the heartbeat thread sent (the loop had sent none for an interval)."""
        self._pulse: threading.Thread | None = None
        self._pulse_stop = threading.Event()

    # --- registration -----------------------------------------------------------------

    def _open_registry(self) -> Channel:
        with self._wire:
            if self._registry is not None:
                self._registry.close()
            self._registry_inbox.clear()  # the old connection's replies
            sock = make_socket(
                self.ctx, zmq.DEALER, rcvtimeo_ms=200, sndtimeo_ms=200, keys=self.keys
            )
            sock.connect(self.broker)
            self._registry = Channel(sock, "registry", self.id or self.role, self.stats)
            return self._registry

    def _hello(self) -> None:
        assert self._registry is not None
        # plain_meta, and an index checked when the role was made: a role never dies
        # encoding its own HELLO.
        self._registry.send(
            P.Message(
                P.HELLO,
                meta=P.plain_meta(
                    {
                        "role": self.role,
                        "id": self.id or None,
                        "index": self.index,
                        "host": self.host,
                        "pid": os.getpid(),
                        "address": self.advertise,
                        "rpc": self.rpc_endpoint,
                        "instance": self.instance,
                        "agent": self._agent_id if self._agent_endpoint else None,
                        "zrl_version": __version__,
                        # Proves the id (or, without one, the role) to a broker that holds
                        # the run secret; see zrl.transport.security.
                        "credential": hello_credential(self.keys, self.id or f"{self.role}-*"),
                    }
                ),
            ),
            block=False,
        )

    def _recv_registry(self) -> P.Message | None:
        """The next registry reply: one the heartbeat thread kept, else one off the socket
        (hold ``_wire`` once the thread runs)."""
        got = self._registry_inbox.popleft() if self._registry_inbox else self._read_registry()
        if isinstance(got, RoleError):
            raise got
        return got

    def _read_registry(self) -> P.Message | RoleError | None:
        """One reply off the registry socket, or the RoleError it means (a broker of another
        protocol refused us): raised by whoever handles it, never in the heartbeat thread."""
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
            return RoleError(f"broker refused us: {exc}")
        except P.ProtocolError as exc:
            self._registry.drop("broker", str(exc))
            return None
        self._registry.stats.received += 1
        return msg

    def _on_welcome(self, msg: P.Message) -> None:
        m = msg.meta
        first = not self.endpoints
        # The id names this role's checkpoint files: only ``<role>-<n>`` (a forged WELCOME
        # could say "/abs/x" or "learner-0/../../x").
        number = index_of_id(m.get("id"), self.role)
        if number is None:
            raise RoleError(
                f"the broker gave this {self.role} the id {ascii(m.get('id'))[:100]}: refusing "
                f"it (a {self.role}'s id is {self.role}-<n>, n from 0 to {MAX_ROLE_INDEX})"
            )
        self.id = f"{self.role}-{number}"
        if self.index is None:
            # Started without --index: the broker's numbering keeps seeds and exploration distinct.
            self.index = number
        if self._registry is not None:
            self._registry.sender = self.id
        spec = m.get("spec")
        if spec is not None:
            config = ExperimentConfig.model_validate(spec)
            if config.roles.actors == "auto":  # the head resolves it before any role starts
                raise RoleError("the broker's spec says roles.actors: auto, not a number")
            # Where this role keeps its files: the head's checkpoint.dir only if it lies under
            # our checkpoint root, else <root>/<run> (zrl.roles.trust).
            config.checkpoint.dir = checked_checkpoint_dir(
                config.checkpoint.dir, self.checkpoint_root, self.broker, config.name
            )
            checked_env_id(
                config.env.id,
                authenticated=self.broker_authenticated,
                local_env_id=self.local_env_id,
            )
            self.config = config
        self.factories = factories_from(
            msg, authenticated=self.broker_authenticated, local_factories=self.local_factories
        )
        tcp = {k: connect_address(v, self.broker) for k, v in m["endpoints"].items()}
        # On the broker's machine, its ipc:// twins skip the loopback TCP stack.
        ipc = usable_ipc_endpoints(m.get("ipc_endpoints"), m.get("host"), self.broker, tcp)
        self.endpoints = ipc or tcp
        self.transport = "ipc" if ipc else self.broker.split("://", 1)[0]
        self.heartbeat_interval = float(m["heartbeat_interval"])
        self.heartbeat_timeout = float(m["heartbeat_timeout"])
        self.max_message_bytes = int(m["max_message_bytes"])
        self.max_topic_message_bytes = int(m.get("max_topic_message_bytes", self.max_message_bytes))
        self._last_ack = time.monotonic()
        self._backoff = RECONNECT_BACKOFF_INITIAL_S
        self.registrations += 1
        self._use_agent(m.get("agent"))
        self.report_to_parent()
        if first:
            self.log.info(
                "registered as %s with broker %s (streams over %s)",
                self.id,
                self.broker,
                self.transport,
            )
        else:
            self.log.info("re-registered as %s with broker %s", self.id, self.broker)
            self.on_reregistered()

    def _use_agent(self, agent: Any) -> None:
        """Heartbeat the host agent that started us when the WELCOME says the registry takes
        its reports for us (``agent``: its id, which must be the one we were started by);
        else the broker."""
        with self._wire:
            if agent is not None and agent == self._agent_id and self._agent_endpoint:
                if self._agent is None:
                    sock = make_socket(
                        self.ctx, zmq.DEALER, sndtimeo_ms=0, max_message_bytes=AGENT_ACK_BYTES
                    )
                    sock.connect(self._agent_endpoint)
                    self._agent = Channel(
                        sock, "agent", self.id, self.stats, max_message_bytes=AGENT_ACK_BYTES
                    )
                self._agent.sender = self.id
            elif self._agent is not None:
                self._agent.close()
                self._agent = None
                self._agent_inbox.clear()

    @property
    def files_root(self) -> Path | None:
        """The directory every file of this role lies under: ``--checkpoint-root``, else the
        working directory (None for a role of an inproc broker given none: its config is
        this process's own)."""
        if self.checkpoint_root is not None:
            return self.checkpoint_root
        return None if self.broker.startswith("inproc://") else Path.cwd().resolve()

    def checkpoint_file(self, suffix: str) -> Path | None:
        """``<checkpoint.dir>/<id><suffix>`` (see ``checked_file``), or None without a
        ``checkpoint.dir``: the learner's and params' ``.pt``, a replay shard's ``.snapshot``.
        A role that asks keeps files: its heartbeat names the directory (``files_dir``)."""
        d = self.config.checkpoint.dir
        if not d:
            return None
        if index_of_id(self.id, self.role) is None:
            raise RoleError(f"no checkpoint file for the id {ascii(self.id)[:100]}")
        path = checked_file(d, f"{self.id}{suffix}", self.files_root)
        self.keeps_files_in(path.parent)
        return path

    def keeps_files_in(self, directory: Path) -> None:
        """Note (and say once) where this role keeps its files: every heartbeat's info then
        carries it (``checkpoint_dir``), and the head's summary.json lists it per role."""
        if self.files_dir != str(directory):
            self.files_dir = str(directory)
            self.log.info("%s keeps its files in %s on %s", self.id, directory, self.host)

    def report_to_parent(self) -> None:
        """Tell the host agent that started this role (``PARENT_REPORT_ENV``) our id and
        state; nothing when no agent asked. A report that cannot be written is logged."""
        if self._parent_report is None:
            return
        try:
            write_parent_report(self._parent_report, self.id, os.getpid(), self.state)
        except OSError as exc:
            self.log.warning("cannot tell the host agent our id (%s): %s", self._parent_report, exc)

    @property
    def broker_authenticated(self) -> bool:
        """Whether what the broker says comes from the user's own broker: CURVE proves its
        server key, and an inproc broker lives in this process."""
        return broker_authenticated(self.broker, self.keys)

    def make_envs(self, num_envs: int | None = None, evaluation: bool = False) -> Any:
        """A vector env of the experiment's env (the user's factory if the broker sent one);
        ``evaluation``: Atari without its training-only episodic life and reward clipping."""
        from zrl.envs.vector import make_vector_env

        return make_vector_env(self.config.env, num_envs, self.factories.env_fn(), evaluation)

    def make_model(self, observation_space: Any, action_space: Any) -> Any:
        from zrl.algos.models import experiment_model

        return experiment_model(
            self.config, observation_space, action_space, self.factories.model_fn()
        )

    def connect(self) -> None:
        """Register with the broker, retrying with capped back-off until ``connect_timeout``."""
        deadline = time.monotonic() + self.connect_timeout
        keys_check_at = time.monotonic() + KEYS_CHECK_AFTER_S
        checked_keys = False
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
                        self._refused(msg)
            if not checked_keys and time.monotonic() > keys_check_at:
                checked_keys = True
                self._check_handshake()
            if time.monotonic() > deadline:
                raise RoleError(
                    f"no answer from a broker at {self.broker} after {self.connect_timeout:g}s"
                )
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_S)
        raise RoleError("stopped before the broker answered")

    def _check_handshake(self) -> None:
        """A broker that stays silent may be refusing our CURVE handshake (keys missing or
        not its own): libzmq's monitor events say so, and then waiting cannot help."""
        if not self.broker.startswith("tcp://") or not refuses_handshake(
            self.ctx, self.broker, KEYS_CHECK_TIMEOUT_S, self.keys
        ):
            return
        if self.keys is None:
            raise RoleError(
                f"the broker at {self.broker} refuses clients without keys (it was started "
                "with --keys): start this role with --keys DIR, the broker's key directory "
                "copied to this host"
            )
        raise RoleError(
            f"the broker at {self.broker} refused the keys in {self.keys.directory} (CURVE "
            "handshake failed): they are not the ones it allows; copy the broker's key "
            "directory (from `zrl keys init`) to this host and pass it with --keys"
        )

    @staticmethod
    def _refused(msg: P.Message) -> None:
        reason = msg.meta.get("reason")
        if msg.meta.get("stopped") is True:
            raise ExperimentStopped(f"not joining: {reason}")
        raise RoleError(f"broker refused us: {reason}")

    # --- registry requests ------------------------------------------------------------

    def connect_identified(
        self, role: str, keys: ClientKeys, sndhwm: int
    ) -> tuple[Channel, str] | None:
        """A DEALER (``<role>-rpc``) to the rpc of the first live ``role`` the registry
        names, and its endpoint; None while none is registered. It connects under a fresh
        routing id of ``keys``, heartbeated at once: the server asks the registry who holds
        the connection (``zrl.roles.rpc_identity``) before it takes what only a planned
        peer may send."""
        services = self.lookup(role, timeout=1.0)
        if not services:
            return None
        endpoint = services[0]["rpc"]
        channel = self.connect_rpc(
            endpoint, keys.renew(role), f"{role}-rpc", sndhwm=sndhwm, sndtimeo_ms=0
        )
        self.heartbeat_now()
        return channel, endpoint

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

    def _count_ack(self, msg: P.Message, now: float, direct: bool) -> None:
        """The broker (``direct``) or our host agent answered a heartbeat: it hears us."""
        self._last_ack = max(self._last_ack, now)
        if direct and (seq := M.heartbeat_seq(msg.meta)) is not None:
            self._acked_seq = max(self._acked_seq, seq)

    def _on_ack(self, msg: P.Message, now: float) -> None:
        """A HEARTBEAT_ACK, from the broker or from our host agent."""
        self._last_ack = max(self._last_ack, now)
        self.on_heartbeat_ack(msg.meta)
        stop = msg.meta.get("stop")
        if stop is not None and not self.stop_event.is_set():
            self.log.info("the experiment stopped (%s): stopping", ascii(str(stop)[:200]))
            self.request_stop()

    def _read_agent(self, now: float) -> None:
        """Our host agent's answers to the heartbeats we sent it: HEARTBEAT_ACK (the broker
        has them), or UNKNOWN_ROLE (the broker does not know us under the agent: HELLO)."""
        while True:
            with self._wire:
                if self._agent_inbox:
                    msg = self._agent_inbox.popleft()
                elif self._agent is not None and (got := self._agent.recv(block=False)):
                    msg = got[1]
                else:
                    return
            if msg.kind == P.HEARTBEAT_ACK:
                self._on_ack(msg, now)
            elif msg.kind == P.UNKNOWN_ROLE:
                self.log.warning("the broker does not know us under our host agent: registering")
                with self._wire:
                    self._hello()

    def heartbeat_extra(self) -> dict[str, Any]:
        """More fields of this role's HEARTBEAT (a host agent's reports for its roles)."""
        return {}

    def on_heartbeat_ack(self, meta: dict[str, Any]) -> None:
        """A HEARTBEAT_ACK's meta, as it came (a host agent reads ``unknown`` from it)."""

    def tick(self, direct: bool = False) -> None:
        """Heartbeat (the broker, or the host agent that heartbeats for us; ``direct``: the
        broker), read registry replies, re-register if the broker went quiet."""
        now = time.monotonic()
        self.loop_turns += 1
        assert self._registry is not None
        while True:
            with self._wire:
                msg = self._recv_registry()
            if msg is None:
                break
            if msg.kind == P.HEARTBEAT_ACK:
                self._count_ack(msg, now, direct=True)
                self._on_ack(msg, now)
            elif msg.kind == P.WELCOME:
                self._on_welcome(msg)
            elif msg.kind == P.UNKNOWN_ROLE:
                self.log.warning("broker does not know us (it restarted?): registering again")
                with self._wire:
                    self._hello()
            elif msg.kind == P.REFUSED:
                self._refused(msg)
        self._read_agent(now)
        orphan = self.orphan_limit()
        if (
            orphan is not None
            and self.registrations
            and now - self._last_ack > orphan
            and not self.stop_event.is_set()
        ):
            self.log.error(
                "no answer from the broker at %s for %.0fs (broker.orphan_timeout=%gs): stopping",
                self.broker,
                now - self._last_ack,
                orphan,
            )
            self.orphaned = True
            self.request_stop()
            return
        if now - self._last_ack > self.heartbeat_timeout and now >= self._reconnect_at:
            self.log.warning(
                "no heartbeat ack from broker for %.1fs: reconnecting (back-off %.1fs)",
                now - self._last_ack,
                self._backoff,
            )
            with self._wire:
                self._open_registry()
                self._hello()
            self._reconnect_at = now + self._backoff
            self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_MAX_S)
        if now >= self._next_heartbeat:
            self._beat(now, self.check_memory(), direct)

    def heartbeat_if_due(self) -> None:
        """A turn of the loop inside a long step, and the heartbeat with its figures if one is
        due: a PPO actor's trajectory of 2,048 steps of one env (2-4 s on a loaded machine)
        shows its env steps as they go and is not stalled. (Its liveness is the heartbeat
        thread's.) It reads no registry reply (the next ``tick`` does) and reports the last
        memory figure unchecked, so it raises none of the role's own errors inside the
        caller's error handling."""
        now = time.monotonic()
        self.loop_turns += 1  # the step goes on: the loop is not stalled
        if self._registry is not None and now >= self._next_heartbeat:
            self._beat(now, self._rss_mb)

    def _beat(self, now: float, rss_mb: float, direct: bool = False) -> None:
        self._next_heartbeat = now + self.heartbeat_interval
        info = self.heartbeat_info()
        info["rss_mb"] = rss_mb
        if self.files_dir is not None:
            info["checkpoint_dir"] = self.files_dir
        beat = {
            "id": self.id,
            "state": self.state,
            "loop": self.loop_turns,
            "stats": self.stats.snapshot(),
            "info": info,
        }
        beat.update(self.heartbeat_extra())
        with self._wire:  # the figures above are made outside it: the thread never waits on them
            assert self._registry is not None
            self._beat_seq += 1
            beat["seq"] = self._beat_seq
            via = self._agent if self._agent is not None and not direct else self._registry
            # plain_meta: whatever a counter came to hold, a role never dies on its own status.
            via.send(P.Message(P.HEARTBEAT, meta=P.plain_meta(beat)), block=False)
            self._last_beat = time.monotonic()
            if via is self._registry:
                self._direct_seq = self._beat_seq
        if now >= self._next_metrics:
            self._next_metrics = now + METRICS_INTERVAL_S
            train = self.train_metrics()
            self.publish_metrics({**info, "train": train} if train else info)

    def orphan_limit(self) -> float | None:
        """Seconds without an answer from the broker after which this role stops (None:
        never): ``broker.orphan_timeout``."""
        return self.config.broker.orphan_timeout

    def heartbeat_now(self, timeout: float = 1.0) -> bool:
        """Heartbeat now (showing the role's current info, its rpc keys among it) and wait, at
        most ``timeout``, until the broker acknowledged it: a server asking STATUS after that
        sees the keys (``zrl.roles.rpc_identity``). The ack must carry this heartbeat's
        ``seq``: an ack of an earlier heartbeat (one sent inside a long step, its ack unread)
        says nothing of the info sent now."""
        sent_at = time.monotonic()
        self._next_heartbeat = 0.0
        self.tick(direct=True)  # not through a host agent: the broker has it when it acks
        mine = self._direct_seq  # not a later one of the heartbeat thread's
        while self._acked_seq < mine:
            if time.monotonic() >= sent_at + timeout:
                return False
            with self._wire:
                if self._registry is None:
                    return False
                self._registry.sock.poll(20)
            self.tick()
        return True

    # --- the heartbeat thread -----------------------------------------------------------

    def start_pulse(self) -> None:
        """Start the heartbeat thread (``pulse``), once registered; ``close`` stops it."""
        if self._pulse is not None:
            return
        self._pulse_stop.clear()
        self._pulse = threading.Thread(
            target=self._pulse_loop, name=f"zrl-heartbeat-{self.id or self.role}", daemon=True
        )
        self._pulse.start()

    def stop_pulse(self) -> None:
        thread, self._pulse = self._pulse, None
        if thread is None:
            return
        self._pulse_stop.set()
        if thread is not threading.current_thread():
            thread.join(PULSE_JOIN_S)

    def _pulse_loop(self) -> None:
        while True:
            due = self._last_beat + self.heartbeat_interval - time.monotonic()
            if self._pulse_stop.wait(max(PULSE_MIN_WAIT_S, due)):
                return
            try:
                self.pulse(time.monotonic())
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM:
                    return  # the context is going: so is the role
                self.log.debug("heartbeat thread: %s", exc)
            except Exception:  # noqa: BLE001 - a heartbeat must never end the thread
                self.log.exception("the heartbeat thread failed to heartbeat; it goes on")

    def pulse(self, now: float) -> bool:
        """The heartbeat thread's heartbeat, when the loop sent none for an interval: ``id``,
        ``seq``, ``state`` and ``loop`` alone (the figures are the loop's to make; the
        broker keeps the last ones). It first reads the replies waiting (for ``tick``; an
        UNKNOWN_ROLE it answers with HELLO itself), so acks count while the loop is held.
        True when it sent one."""
        with self._wire:
            reg = self._registry
            if reg is None or reg.sock.closed or not self.id:
                return False
            if now - self._last_beat < self.heartbeat_interval:
                return False
            self._take_replies(now)
            self._beat_seq += 1
            beat = {"id": self.id, "seq": self._beat_seq, "state": self.state}
            beat["loop"] = self.loop_turns
            via = self._agent if self._agent is not None else reg
            sent = via.send(P.Message(P.HEARTBEAT, meta=P.plain_meta(beat)), block=False)
            self._last_beat = now
            self.pulses += sent
            return sent

    def _take_replies(self, now: float) -> None:
        """(Holding ``_wire``.) The registry's and the agent's replies, kept for ``tick``;
        acks counted now, the newest kept; UNKNOWN_ROLE answered with HELLO now."""
        while (got := self._read_registry()) is not None:
            if isinstance(got, P.Message):
                if got.kind == P.UNKNOWN_ROLE:
                    self.log.warning("broker does not know us (it restarted?): registering again")
                    self._hello()
                    continue
                if got.kind == P.HEARTBEAT_ACK:
                    self._count_ack(got, now, direct=True)
                elif got.kind not in (P.WELCOME, P.REFUSED):
                    continue  # nothing tick would act on
            keep(self._registry_inbox, got)
        while self._agent is not None and (taken := self._agent.recv(block=False)) is not None:
            msg = taken[1]
            if msg.kind == P.UNKNOWN_ROLE:
                self.log.warning("the broker does not know us under our host agent: registering")
                self._hello()
            elif msg.kind == P.HEARTBEAT_ACK:
                self._count_ack(msg, now, direct=False)
                keep(self._agent_inbox, msg)

    def check_memory(self) -> float:
        """Resident memory in MB; past ``limits.memory_mb`` the role stops, saying why.

        Stopping ourselves with a clear message beats the kernel's OOM killer choosing a
        random process of the run."""
        rss_mb = self._process.memory_info().rss / 2**20
        self._rss_mb = round(rss_mb, 1)
        limit = self.config.limits.memory_mb
        if limit is not None and rss_mb > limit:
            raise RoleError(
                f"{self.id} uses {rss_mb:.0f} MB of memory, "
                f"above limits.memory_mb={limit:g}: stopping"
            )
        return round(rss_mb, 1)

    def _metrics_channel(self) -> Channel:
        if self._metrics_pub is None:
            self._metrics_pub = self.open_publisher(P.METRICS_TOPIC)
        return self._metrics_pub

    def publish_metrics(self, info: dict[str, Any]) -> None:
        self._metrics_channel().send(
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

    def serve_requests(self, rpc: Channel, wait_ms: int, limit: int = 100) -> None:
        """Answer with ``on_request`` up to ``limit`` requests waiting on the ``rpc`` ROUTER,
        after waiting up to ``wait_ms`` for the first; a request that raises ProtocolError is
        dropped and counted, never fatal."""
        if not rpc.sock.poll(wait_ms):
            return
        for _ in range(limit):
            got = rpc.recv(block=False)
            if got is None:
                return
            ident, msg = got
            assert ident is not None
            try:
                self.on_request(ident, msg)
            except P.ProtocolError as exc:
                rpc.drop(msg.sender or "?", str(exc))

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        """One request on the role's rpc (``serve_requests``); ProtocolError: dropped."""
        raise P.ProtocolError(f"the {self.role} serves no {msg.kind!r} requests")

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
        if threading.current_thread() is threading.main_thread():  # a role process, not --inproc
            keep_freed_memory(self.config.limits.heap_keep_mb)
        # Now, not at the first report: a PUB drops what it sends before the broker's
        # subscriptions reach it, and a short run may have only a report or two.
        self._metrics_channel()
        self.start_pulse()  # a setup of minutes (imports, envs, a device) is no silence
        try:
            self.setup()
            self.state = "running"
            self.report_to_parent()
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
        self.stop_pulse()  # before the sockets it uses go
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
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        for ch in self._channels:
            if not ch.sock.closed:
                ch.close()
        self._channels.clear()
