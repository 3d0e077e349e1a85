"""The zrl wire protocol: message kinds, the version, and frame encoding/validation.

Frame layout of every message (after any ROUTER envelope or PUB topic frame)::

    frame 0   header: msgpack map
                v   protocol version (int)          k   kind (str)
                s   sender id (str)                 q   per-stream sequence number (int)
                st  stream name (str)               m   metadata (map of plain values)
                a   [[name, dtype, shape], ...]     one entry per array frame, in order
    frame 1.. raw array buffers, C order, no padding

Arrays go out as the numpy buffers themselves (``send_multipart(copy=False)``)
and come back as ``np.frombuffer`` views on the received frames, so array bytes
are never copied by zrl. No pickle is ever decoded from a data frame.

Threat model: any peer that can reach a socket can send any bytes. ``decode``
therefore checks everything a malicious or buggy sender controls (frame count,
header type and size, version, dtypes from an allow-list, shapes, sizes) and
raises :class:`ProtocolError`; receivers count and drop such messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# Registry (role <-> broker ROUTER)
HELLO = "hello"
WELCOME = "welcome"
REFUSED = "refused"
HEARTBEAT = "heartbeat"
HEARTBEAT_ACK = "heartbeat_ack"
UNKNOWN_ROLE = "unknown_role"  # heartbeat from an id the broker does not know (it restarted)
BYE = "bye"
LOOKUP = "lookup"
LOOKUP_REPLY = "lookup_reply"
STATUS = "status"
STATUS_REPLY = "status_reply"
ERROR = "error"
# Data paths
TRAJECTORY = "trajectory"  # actor -> replay on `experience`
BATCH = "batch"  # replay -> learner on `batches`
PRIORITIES = "priorities"  # learner -> replay shard (topic priorities/<shard>)
WEIGHTS = "weights"  # params -> everyone (topic weights); learner -> params (rpc)
GET_WEIGHTS = "get_weights"  # rpc to params: latest weights for a late joiner
NO_WEIGHTS = "no_weights"
ACK = "ack"
METRICS = "metrics"  # every role -> topic metrics
END_OF_STREAM = "end_of_stream"  # a producer's last message on a stream, carries its final seq
GRADIENTS = "gradients"  # A3C worker -> params on `gradients`; DD-PPO learner -> learners (topic)
MATCH = "match"  # actor -> league rpc: opponents for the next episodes
MATCHES = "matches"  # league -> actor: the opponents it chose
RESULTS = "results"  # actor -> league rpc: outcomes of finished episodes
GET_SNAPSHOT = "get_snapshot"  # actor -> league rpc: a snapshot's weights (answered WEIGHTS)
STOP_RUN = "stop_run"  # head -> broker registry: the experiment is over; every role stops
INCARNATION = "incarnation"  # replay shard -> actors (topic incarnations/<shard>/): it restarted?
RESET = "reset"  # league -> params rpc: a named policy's learner restarts from its initial weights
INFER = "infer"  # actor -> inference rpc: observations to run the policy on
INFERRED = "inferred"  # inference -> actor: the policy's outputs for them
EXPLOIT = "exploit"  # pbt -> params rpc: a member's learner copies a better one and explores
GET_CONTROL = "get_control"  # learner -> params rpc: the league's and pbt's word on its policy
CONTROL = "control"  # params -> learner: its policy's resets and newest exploit
# Every message kind above: who sends each, its metadata and arrays are in zrl.transport.messages.
KINDS: tuple[str, ...] = (
    HELLO,
    WELCOME,
    REFUSED,
    HEARTBEAT,
    HEARTBEAT_ACK,
    UNKNOWN_ROLE,
    BYE,
    LOOKUP,
    LOOKUP_REPLY,
    STATUS,
    STATUS_REPLY,
    ERROR,
    TRAJECTORY,
    BATCH,
    PRIORITIES,
    WEIGHTS,
    GET_WEIGHTS,
    NO_WEIGHTS,
    ACK,
    METRICS,
    END_OF_STREAM,
    GRADIENTS,
    MATCH,
    MATCHES,
    RESULTS,
    GET_SNAPSHOT,
    STOP_RUN,
    INCARNATION,
    RESET,
    INFER,
    INFERRED,
    EXPLOIT,
    GET_CONTROL,
    CONTROL,
)

# Topics on the bus (PUB/SUB prefix matching; a trailing "/" keeps "replay-1" from
# matching "replay-10").
WEIGHTS_TOPIC = "weights"
METRICS_TOPIC = "metrics"
EVAL_TOPIC = "eval"
ROLLOUTS_TOPIC = "rollouts/"  # PPO actors -> every PPO learner
INCARNATIONS_TOPIC = "incarnations/"  # replay shards -> actors: each shard's incarnation


def priority_topic(shard_id: str) -> str:
    """Priority updates for the keys one replay shard sampled."""
    return f"priorities/{shard_id}/"


def batch_ack_topic(shard_id: str) -> str:
    """Learners' acknowledgements of the batches they took from one replay shard (its credit
    window, ``replay.prefetch``)."""
    return f"batch-acks/{shard_id}/"


def acked_seq(msg: Message, sender_prefix: str, sent: int, what: str) -> int:
    """The sequence number a credit-window ACK releases: ``msg`` must be an ACK from a
    ``sender_prefix*`` role for one of the ``sent`` messages we sent (an actor's trajectories
    to a replay shard, a shard's batches to a learner). Raises ProtocolError otherwise."""
    seq = msg.meta.get("seq")
    if (
        msg.kind != ACK
        or not msg.sender.startswith(sender_prefix)
        or not isinstance(seq, int)
        or isinstance(seq, bool)
        or not 0 <= seq < sent
    ):
        raise ProtocolError(f"not an ack of a sent {what}: {msg.kind} from {msg.sender} {seq!r}")
    return seq


def incarnation_topic(shard_id: str) -> str:
    """A replay shard's INCARNATION, once a second: how actors learn that it restarted."""
    return f"{INCARNATIONS_TOPIC}{shard_id}/"


def ack_topic(actor_id: str) -> str:
    """A replay shard's acknowledgements of one actor's inserted trajectories."""
    return f"acks/{actor_id}/"


MAX_HEADER_BYTES = 4 * 2**20
# Pages one STATUS listing may take (the broker's pages are far under MAX_HEADER_BYTES, and
# ``max_roles`` rows fill far fewer): a client stops after this many whatever it is told.
MAX_STATUS_PAGES = 1024
MAX_ARRAYS = 256
MAX_NDIM = 16
# A sender id or stream name is a short label (``actor-12``, ``experience``). Receivers key
# per-sender state by it, so an unbounded one lets a peer grow their memory and logs at will.
MAX_NAME_CHARS = 128
# Sequence numbers count messages: 2**53 is centuries of them at any rate, and keeps every
# counter derived from them well inside msgpack's 64-bit integers.
MAX_SEQ = 2**53
# Counters saturate here instead of growing past what msgpack (and the status table) carry.
COUNTER_MAX = 2**63 - 1
# Plain numeric dtypes only: object, string and void dtypes could smuggle arbitrary
# Python objects or mislead size checks.
ALLOWED_DTYPES = frozenset(
    np.dtype(t).str
    for t in (
        "bool",
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)


class ProtocolError(ValueError):
    """A received message that does not follow the protocol (always dropped, never fatal)."""


class VersionMismatch(ProtocolError):
    """A peer speaks another protocol version."""

    def __init__(self, theirs: object, ours: int = PROTOCOL_VERSION) -> None:
        super().__init__(
            f"protocol version mismatch: peer speaks {theirs!r}, this zrl speaks {ours}"
        )
        self.theirs = theirs


@dataclass
class Message:
    """One zrl message: a kind, plain metadata and named numpy arrays."""

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    sender: str = ""
    seq: int = 0
    stream: str = ""
    version: int = PROTOCOL_VERSION

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _plain(obj: Any) -> Any:
    # numpy scalars and arrays in metadata would otherwise make msgpack raise.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple | set):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in message metadata")


def saturate(n: int) -> int:
    """``n`` clamped to ``[0, COUNTER_MAX]``: what a counter reports, whatever it counted."""
    return min(max(n, 0), COUNTER_MAX)


def plain_meta(obj: Any, depth: int = 0) -> Any:
    """``obj`` as metadata msgpack can always encode: integers clamped to 64 bits, numpy
    values unwrapped, tuples as lists, keys as strings, anything else as its short repr.

    For what a role reports about itself (heartbeats, metrics), so that no value it came to
    hold, whoever made it grow, can stop it from reporting."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, float | str | bytes):
        return obj
    if isinstance(obj, int):
        return min(max(obj, -(2**63)), 2**64 - 1)
    if isinstance(obj, np.generic):
        return plain_meta(obj.item(), depth)
    if depth < 8 and isinstance(obj, dict):
        return {str(k): plain_meta(v, depth + 1) for k, v in obj.items()}
    if depth < 8 and isinstance(obj, list | tuple | np.ndarray):
        return [plain_meta(v, depth + 1) for v in obj]
    return repr(obj)[:200]


def encode(msg: Message) -> list[Any]:
    """Message -> frames. Array frames are the arrays themselves (no copy for contiguous ones)."""
    specs = []
    bufs: list[Any] = []
    for name, arr in msg.arrays.items():
        a = np.asarray(arr)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # (ascontiguousarray alone would turn 0-d into 1-d)
        if a.dtype.str not in ALLOWED_DTYPES:
            raise TypeError(f"array {name!r} has dtype {a.dtype} which the protocol does not carry")
        specs.append([name, a.dtype.str, list(a.shape)])
        # A 0-d or empty array has no usable buffer view; send its bytes.
        bufs.append(a if a.ndim and a.size else a.tobytes())
    header = msgpack.packb(
        {
            "v": msg.version,
            "k": msg.kind,
            "s": msg.sender,
            "q": msg.seq,
            "st": msg.stream,
            "m": msg.meta,
            "a": specs,
        },
        default=_plain,
        use_bin_type=True,
    )
    return [header, *bufs]


def _buffer(frame: Any) -> memoryview:
    # zmq.Frame exposes .buffer; bytes and memoryview are accepted too (tests, copy=True).
    buf = getattr(frame, "buffer", frame)
    return memoryview(buf)


def peek_sender(frames: Sequence[Any]) -> str:
    """Best-effort sender id of a (possibly malformed) message, for logging drops."""
    try:
        head = msgpack.unpackb(_buffer(frames[0]), raw=False, strict_map_key=True)
        sender = head.get("s") if isinstance(head, dict) else None
        return sender if isinstance(sender, str) and sender else "?"
    except Exception:
        return "?"


def decode(frames: Sequence[Any], *, max_bytes: int = 256 * 2**20) -> Message:
    """Frames -> Message, validating everything; raises ProtocolError on any fault.

    Arrays are read-only views on the received frames (zero copy)."""
    if not frames:
        raise ProtocolError("empty message")
    head_buf = _buffer(frames[0])
    if head_buf.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {head_buf.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        head = msgpack.unpackb(head_buf, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"header is not msgpack: {type(exc).__name__}") from None
    if not isinstance(head, dict):
        raise ProtocolError(f"header is a {type(head).__name__}, not a map")
    version = head.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatch(version)
    kind, sender, seq, stream = (
        head.get("k"),
        head.get("s", ""),
        head.get("q", 0),
        head.get("st", ""),
    )
    meta, specs = head.get("m", {}), head.get("a", [])
    if not isinstance(kind, str) or not kind:
        raise ProtocolError("header has no kind")
    if not isinstance(sender, str) or not isinstance(stream, str):
        raise ProtocolError("sender and stream must be strings")
    if len(sender) > MAX_NAME_CHARS or len(stream) > MAX_NAME_CHARS:
        raise ProtocolError(
            f"sender id or stream name longer than {MAX_NAME_CHARS} characters "
            f"({len(sender)}, {len(stream)})"
        )
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
        raise ProtocolError(f"bad sequence number {seq!r} (0..2**53)")
    if not isinstance(meta, dict):
        raise ProtocolError("metadata is not a map")
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError("array list is not a list of at most MAX_ARRAYS entries")
    if len(frames) != 1 + len(specs):
        raise ProtocolError(
            f"header announces {len(specs)} arrays but {len(frames) - 1} frames came"
        )
    arrays: dict[str, np.ndarray] = {}
    total = head_buf.nbytes
    for spec, frame in zip(specs, frames[1:], strict=True):
        if not (isinstance(spec, list) and len(spec) == 3):
            raise ProtocolError("array spec is not [name, dtype, shape]")
        name, dtype, shape = spec
        if not isinstance(name, str) or name in arrays:
            raise ProtocolError(f"bad or duplicate array name {name!r}")
        if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
            raise ProtocolError(f"array {name!r}: dtype {dtype!r} not allowed")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_NDIM
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError(f"array {name!r}: bad shape {shape!r}")
        dt = np.dtype(dtype)
        # Python ints: a numpy product would wrap around and let a huge shape pass as 0 bytes.
        expected = dt.itemsize * math.prod(shape)
        buf = _buffer(frame)
        if buf.nbytes != expected:
            raise ProtocolError(
                f"array {name!r}: {buf.nbytes} bytes, header says {expected} ({dtype} {shape})"
            )
        total += expected
        if total > max_bytes:
            raise ProtocolError(f"message exceeds size cap of {max_bytes} bytes")
        try:
            arr = np.frombuffer(buf, dtype=dt).reshape(shape)
        except ValueError:  # e.g. an empty array with a dimension numpy cannot represent
            raise ProtocolError(f"array {name!r}: bad shape {shape!r}") from None
        # Over inproc the frame may be the sender's own memory: never let a receiver write it.
        arr.flags.writeable = False
        arrays[name] = arr
    return Message(
        kind=kind, meta=meta, arrays=arrays, sender=sender, seq=seq, stream=stream, version=version
    )


def require_meta(msg: Message, spec: Mapping[str, type | tuple[type, ...]]) -> None:
    """Check metadata fields and their types; a mismatch is a ProtocolError."""
    for key, typ in spec.items():
        value = msg.meta.get(key)
        if not isinstance(value, typ) or (isinstance(value, bool) and typ in (int, float)):
            raise ProtocolError(f"{msg.kind} field {key!r} is {value!r}, expected {typ}")
