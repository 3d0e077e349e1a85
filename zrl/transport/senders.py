"""The sender table: which role may send which message kind on which channel.

What a message may do is decided by the config, the env's spaces and the registry, never by
the message. This table is the "who" half of that rule: each row names a kind, the channel it
travels on and the roles allowed to send it there. A receiver asks :func:`may_send` with the
sender's role as it knows it from the registry (the connection the registry saw, as for
heartbeats: a role's rpc connection is matched to a registry entry, a topic publisher's
messages are attributed by the roster of planned roles), never with a field of the message
itself. The ``check`` column says what a receiver verifies beyond the role.

Channels are named ``registry`` (the broker's ROUTER), ``rpc:<server role>`` (a server's own
ROUTER), ``stream:<name>`` (the broker's PULL/PUSH devices) and ``topic:<prefix>`` (the
broker's XSUB/XPUB bus; ``topic:acks/`` covers ``acks/<actor id>/``, and a named policy's
``policy/<name>/<topic>`` is the same channel as ``<topic>``). Senders are role names
(``zrl.roles.ROLE_MODULES``) or the parts of zrl that are not roles: ``broker``, ``head`` (the
supervisor of the run), ``client`` (anyone that may read the registry: ``zrl status``, host
agents, the head) and ``nobody`` for kinds this version defines but never sends.

``docs/protocol.md`` section 4.2 is :func:`render_markdown`'s output (a test keeps them equal).

Sockets: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zrl.transport import protocol as P

BROKER = "broker"
HEAD = "head"
CLIENT = "client"
"""Any peer that may reach the registry (the head, host agents, ``zrl status``, any role)."""
NOBODY = "nobody"

ROLES = ("actor", "replay", "learner", "params", "evaluator", "league", "inference", "pbt")
"""The role names of ``zrl.roles.ROLE_MODULES`` (not imported: that pulls in torch)."""
SENDERS = (*ROLES, BROKER, HEAD, CLIENT)

ROLE_OF_COUNT = {
    "actors": "actor",
    "replay": "replay",
    "params": "params",
    "learners": "learner",
    "evaluator": "evaluator",
    "league": "league",
    "inference": "inference",
    "pbt": "pbt",
}
"""The config's ``roles`` count keys (``config_sections.ROLE_COUNT_KEYS``) -> role names."""


def planned_ids(counts: Mapping[str, int]) -> frozenset[str]:
    """The ids of a run's own roles: ``<role>-<n>`` for n below each ``roles`` count of the
    config (``counts``: ``config.roles.counts()``). The registry keeps a slot for each,
    and counters follow these peers only."""
    return frozenset(
        f"{ROLE_OF_COUNT[key]}-{n}"
        for key, count in counts.items()
        if key in ROLE_OF_COUNT
        for n in range(count)
    )


@dataclass(frozen=True)
class Route:
    """One row of the table: ``senders`` may send ``kind`` on ``channel`` to ``receivers``;
    ``check`` is what the receiver verifies beyond the sender's role."""

    kind: str
    channel: str
    senders: tuple[str, ...]
    receivers: str
    check: str


_ANY_ROLE = ROLES
TABLE: tuple[Route, ...] = (
    # Registry: identity is the ROUTER routing id the HELLO registered.
    Route(
        P.HELLO,
        "registry",
        _ANY_ROLE,
        "broker",
        "planned roles of the run have reserved slots; a connection holds few entries",
    ),
    Route(P.WELCOME, "registry", (BROKER,), "the role that said hello", "reply on its connection"),
    Route(P.REFUSED, "registry", (BROKER,), "the asker", "reply on its connection"),
    Route(
        P.HEARTBEAT,
        "registry",
        _ANY_ROLE,
        "broker",
        "only from the connection that registered the id; a host agent's (`zrl host`) "
        "`roles` reports only for roles registered under it, on its host",
    ),
    Route(P.HEARTBEAT_ACK, "registry", (BROKER,), "the role", "reply on its connection"),
    Route(P.UNKNOWN_ROLE, "registry", (BROKER,), "the role", "reply on its connection"),
    Route(
        P.BYE, "registry", _ANY_ROLE, "broker", "only from the connection that registered the id"
    ),
    Route(P.LOOKUP, "registry", (CLIENT,), "broker", "none (public)"),
    Route(P.LOOKUP_REPLY, "registry", (BROKER,), "the asker", "reply on its connection"),
    Route(
        P.STATUS,
        "registry",
        (CLIENT,),
        "broker",
        "none (public); the reply is paged and capped per row",
    ),
    Route(P.STATUS_REPLY, "registry", (BROKER,), "the asker", "reply on its connection"),
    Route(P.STOP_RUN, "registry", (HEAD,), "broker", "the broker's stop token"),
    Route(P.STOP_RUN, "registry", (BROKER,), "the head", "reply on its connection"),
    Route(P.ERROR, "none", (NOBODY,), "nobody", "defined, never sent"),
    # Streams (PUSH/PULL through the broker's devices).
    Route(
        P.TRAJECTORY,
        "stream:experience",
        ("actor",),
        "replay",
        "layout from the config and the env's spaces",
    ),
    Route(
        P.TRAJECTORY,
        "topic:rollouts/",
        ("actor",),
        "learner",
        "layout from the config and the env's spaces",
    ),
    Route(P.BATCH, "stream:batches", ("replay",), "learner", "layout from the config"),
    Route(
        P.GRADIENTS,
        "stream:gradients",
        ("actor",),
        "params",
        "layout of the model the config builds",
    ),
    Route(P.END_OF_STREAM, "none", (NOBODY,), "nobody", "defined, never sent"),
    # Topics (the broker's bus).
    Route(P.PRIORITIES, "topic:priorities/", ("learner",), "replay", "keys the shard sampled"),
    Route(P.ACK, "topic:acks/", ("replay",), "actor", "seq of a sent trajectory"),
    Route(P.ACK, "topic:batch-acks/", ("learner",), "replay", "seq of a sent batch"),
    Route(P.INCARNATION, "topic:incarnations/", ("replay",), "actor", "an int in [0, 2**63)"),
    Route(
        P.WEIGHTS,
        "topic:weights",
        ("params",),
        "actor, evaluator, learner, inference",
        "layout of the model the config builds; versions only grow",
    ),
    Route(
        P.METRICS,
        "topic:metrics",
        _ANY_ROLE,
        "head",
        "counted by the head for planned roles of the run only (its roster)",
    ),
    Route(P.METRICS, "topic:eval", ("evaluator",), "head", "the planned evaluator only"),
    # rpc (a server's own ROUTER, found with LOOKUP).
    Route(
        P.WEIGHTS,
        "rpc:params",
        ("learner",),
        "params",
        "the registered learner of that policy only; layout of the model the config builds",
    ),
    Route(P.ACK, "rpc:params", ("params",), "learner", "reply on its connection"),
    Route(
        P.GET_WEIGHTS,
        "rpc:params",
        ("actor", "evaluator", "learner", "league", HEAD),
        "params",
        "none (public)",
    ),
    Route(P.WEIGHTS, "rpc:params", ("params",), "the asker", "reply to get_weights"),
    Route(P.NO_WEIGHTS, "rpc:params", ("params",), "the asker", "reply to get_weights"),
    Route(P.RESET, "rpc:params", ("league",), "params", "the registered league only"),
    Route(
        P.EXPLOIT,
        "rpc:params",
        ("pbt",),
        "params",
        "the registered pbt role only; members and hyperparameters from the config's pbt",
    ),
    Route(
        P.GET_CONTROL,
        "rpc:params",
        ("learner",),
        "params",
        "the registered learner of that policy only",
    ),
    Route(P.CONTROL, "rpc:params", ("params",), "learner", "reply on its connection"),
    Route(P.MATCH, "rpc:league", ("actor",), "league", "count in [1, MAX_MATCHES]"),
    Route(P.MATCHES, "rpc:league", ("league",), "actor", "reply on its connection"),
    Route(P.RESULTS, "rpc:league", ("actor",), "league", "the run's registered actors only"),
    Route(P.GET_SNAPSHOT, "rpc:league", ("actor", "evaluator"), "league", "none (public)"),
    Route(
        P.WEIGHTS,
        "rpc:league",
        ("league",),
        "actor",
        "reply to get_snapshot: confirmed params versions only (fetched from params' rpc)",
    ),
    Route(P.NO_WEIGHTS, "rpc:league", ("league",), "actor", "reply to get_snapshot"),
    Route(
        P.INFER,
        "rpc:inference",
        ("actor",),
        "inference",
        "the run's registered actors only; arrays from the config and the env's spaces",
    ),
    Route(P.INFERRED, "rpc:inference", ("inference",), "actor", "reply on its connection"),
)


def channel_family(channel: str) -> str:
    """The table's name of ``channel``: a topic's per-id suffix (``topic:acks/actor-3/``) and
    a named policy's prefix (``topic:policy/main2/weights``) are dropped."""
    if not channel.startswith("topic:"):
        return channel
    topic = channel[len("topic:") :]
    if topic.startswith("policy/"):
        parts = topic.split("/", 2)
        topic = parts[2] if len(parts) == 3 else topic
    for route in TABLE:
        family = route.channel[len("topic:") :]
        if route.channel.startswith("topic:") and family.endswith("/") and topic.startswith(family):
            return route.channel
    return "topic:" + topic


def routes(kind: str) -> tuple[Route, ...]:
    """The table's rows for ``kind`` (empty for a kind it does not know)."""
    return tuple(r for r in TABLE if r.kind == kind)


def may_send(kind: str, role: str, channel: str) -> bool:
    """Whether a sender whose role (as the registry knows it, never as the message says) is
    ``role`` may send ``kind`` on ``channel``. ``client`` rows admit every sender."""
    family = channel_family(channel)
    for r in TABLE:
        if r.kind == kind and r.channel == family and (role in r.senders or CLIENT in r.senders):
            return True
    return False


def render_markdown() -> str:
    """The table as ``docs/protocol.md`` carries it (section 4.2)."""
    lines = [
        "| kind | channel | senders | receivers | receiver checks |",
        "|---|---|---|---|---|",
    ]
    for r in TABLE:
        lines.append(
            f"| `{r.kind}` | `{r.channel}` | {', '.join(r.senders)} | {r.receivers} | {r.check} |"
        )
    return "\n".join(lines) + "\n"
