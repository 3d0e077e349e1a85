"""What the broker takes from its peers, and how it says what it dropped.

No sockets. A peer chooses every id, address and counter it sends, so what the registry
keeps is bounded here: ids and names of ``MAX_ID_CHARS``, addresses of ``MAX_FIELD_CHARS``,
printable only (no log injection); heartbeat info of ``MAX_INFO_ITEMS`` items and
``broker.max_info_bytes`` bytes; at most ``MAX_STREAMS_PER_ROLE`` streams of counters in
[0, ``COUNTER_MAX``]. ``DropLog`` counts what the registry and the topic bus drop, by
reason (shown by STATUS as ``rejected``), and logs it at most once per sender and reason
per ``DROP_LOG_INTERVAL_S``: a flood must not flood the log.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import msgpack

from zrl.transport.sockets import STAT_COUNTERS

log = logging.getLogger("zrl.broker")

MAX_ID_CHARS = 128  # role names, role ids, stream names
MAX_FIELD_CHARS = 256  # host, rpc endpoint, advertised address
MAX_STREAMS_PER_ROLE = 32
MAX_INFO_ITEMS = 256  # keys + values in a heartbeat's info, nested ones included
MAX_PID = 2**32
COUNTER_MAX = 2**63 - 1  # sums stay encodable (msgpack stops at 2**64 - 1)
DROP_LOG_INTERVAL_S = 10.0
# A STATUS reply is one page of rows of at most this many bytes: far under every client's
# header cap (``protocol.MAX_HEADER_BYTES``), whatever the registry holds.
STATUS_PAGE_BYTES = 128 * 2**10  # about 190 rows of an actor: a few ms of the registry loop
# In a listing (a STATUS without ``id``) a row carries at most this much of its role's info
# and stream counters (the items that fit, and ``truncated``); a STATUS for one ``id``
# carries its whole row.
STATUS_ROW_INFO_BYTES = 4096
STATUS_ROW_STREAMS_BYTES = 1024
# Live registry entries one connection may hold: a role holds one (a role that retried
# HELLO on a new socket holds its earlier entry on the old one).
MAX_ENTRIES_PER_CONNECTION = 4
# Replies to STATUS listings queued for peers (``transport.sockets.ReplyBudget``): per
# peer, in total, and for how long a reply counts as unread.
STATUS_REPLY_PEER_BYTES = 8 * 2**20
STATUS_REPLY_TOTAL_BYTES = 64 * 2**20
STATUS_REPLY_DRAIN_S = 2.0
MAX_LOG_KEYS = 4096
# Host agents (``zrl host``) heartbeat for the roles they started: one HEARTBEAT per interval
# carrying ``roles``, one report per role. The registry takes at most this many reports in one
# heartbeat (the whole message is bounded by the registry's max message size); the agent keeps
# its reports under AGENT_REPORT_BYTES, sending a role's liveness without its figures past it.
AGENT_ROLE = "host"
MAX_REPORTED_ROLES = 1024
AGENT_REPORT_BYTES = 768 * 2**10


def valid_name(value: Any, limit: int = MAX_ID_CHARS) -> bool:
    """A non-empty printable string of at most ``limit`` characters (no log injection)."""
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def valid_text(value: Any, limit: int = MAX_FIELD_CHARS) -> bool:
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def for_log(value: Any, limit: int = 64) -> str:
    """A peer-chosen value as a short, printable log token."""
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"
    text = ascii(value[:limit])[1:-1]
    return text if len(value) <= limit else f"{text}...({len(value)} chars)"


_SCALARS = frozenset((int, float, str, bool, type(None), bytes))


def info_fits(info: dict[str, Any], max_bytes: int, within_bytes: int | None = None) -> bool:
    """Whether a heartbeat's info is small enough to keep: bytes bound the strings in it,
    the item count bounds the Python objects (16 KiB of tiny items is ~100x that in RAM).
    ``within_bytes``: the size of the header the info was decoded from, which bounds its
    packed size; when that fits, packing it again to measure it is skipped."""
    if 2 * len(info) + 1 <= MAX_INFO_ITEMS and all(type(v) in _SCALARS for v in info.values()):
        stack: list[Any] = []  # flat, as most roles' info is: keys and values are the items
    else:
        stack = [info]
    items = 0
    while stack:
        obj = stack.pop()
        items += 1
        if items > MAX_INFO_ITEMS:
            return False
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    if within_bytes is not None and within_bytes <= max_bytes:
        return True
    try:
        return len(msgpack.packb(info, use_bin_type=True)) <= max_bytes
    except (TypeError, ValueError, OverflowError):
        return False


def brief(items: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """``items`` if it packs into ``max_bytes``, else the smallest items that fit together
    (whole ones, in their order) and ``truncated``: the packed size of the whole. What a
    STATUS listing shows of a role's info, so that no role's size of info can make a listing
    undecodable, and one big item does not hide the small figures beside it."""
    try:
        whole = len(msgpack.packb(items, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return {"truncated": -1}
    if whole <= max_bytes:
        return items
    sizes: dict[str, int] = {}
    for key, value in items.items():
        try:
            sizes[key] = len(msgpack.packb({key: value}, use_bin_type=True))
        except (TypeError, ValueError, OverflowError):
            continue
    used, chosen = 32, set()
    for key in sorted(sizes, key=sizes.__getitem__):
        if used + sizes[key] > max_bytes:
            break
        chosen.add(key)
        used += sizes[key]
    return {"truncated": whole, **{k: v for k, v in items.items() if k in chosen}}


def clean_stats(raw: Any, previous: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """A role's reported stream counters, keeping only well-formed ones (a peer may lie):
    at most ``MAX_STREAMS_PER_ROLE`` streams, counters in [0, COUNTER_MAX]."""
    if not isinstance(raw, dict):
        return previous
    clean: dict[str, dict[str, int]] = {}
    for stream, counters in raw.items():
        if len(clean) >= MAX_STREAMS_PER_ROLE:
            break
        if valid_name(stream) and isinstance(counters, dict):
            # type() is int: not a bool (msgpack decodes plain ints only).
            clean[stream] = {
                k: v if v <= COUNTER_MAX else COUNTER_MAX
                for k in STAT_COUNTERS
                if type(v := counters.get(k, 0)) is int and v >= 0
            }
    return clean


class DropLog:
    """Messages the broker refused or dropped: counted by reason, logged sparingly."""

    def __init__(self) -> None:
        self.rejected: dict[str, int] = {}  # by reason
        self._logged: dict[tuple[str, str], float] = {}

    def note(self, sender: Any, reason: str, detail: str) -> None:
        """Log a dropped message at most once per sender and reason per DROP_LOG_INTERVAL_S,
        with the count since the last line: a flood must not flood the log."""
        key = (for_log(sender), reason)
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(key, -math.inf) < DROP_LOG_INTERVAL_S:
            return
        if len(self._logged) >= MAX_LOG_KEYS:
            self._logged.clear()
        self._logged[key] = now
        log.warning("%s from %s: %s (%d so far)", reason, key[0], detail, self.rejected[reason])
