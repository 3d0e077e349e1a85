"""The parking of requests from connections the registry has not vouched for yet
(``zrl.roles.rpc_identity.RegisteredPeers``): fair per connection (issue 39, item 6: one
connection's flood of well-formed INFER requests pushed the actors' first requests out)."""

from __future__ import annotations

from zrl.roles.rpc_identity import (
    MAX_PARKED,
    MAX_PARKED_PER_PEER,
    RegisteredPeers,
    key_digest,
    new_routing_key,
)
from zrl.transport import protocol as P


def request(n: int) -> P.Message:
    return P.Message(P.INFER, meta={"n": n})


def peers(rows: list[dict]) -> RegisteredPeers:
    return RegisteredPeers("inference", lambda: rows, lambda row: row["role"] == "actor")


def test_a_flooding_connection_holds_only_its_own_slots() -> None:
    reg = peers([])
    flooder, actors = new_routing_key(), [new_routing_key() for _ in range(MAX_PARKED - 1)]
    dropped = []
    for i, actor in enumerate(actors):
        dropped.append(reg.park(flooder, request(1000 + i)))
        dropped.append(reg.park(actor, request(i)))
    for i in range(1000):  # the flood
        dropped.append(reg.park(flooder, request(2000 + i)))
    reg.next_status = 0.0  # the registry may be asked again
    kept = reg.unpark()
    by_peer: dict[bytes, list[int]] = {}
    for ident, msg in kept:
        by_peer.setdefault(ident, []).append(msg.meta["n"])
    assert set(by_peer) == {flooder, *actors}
    assert [by_peer[a] for a in actors] == [[i] for i in range(len(actors))]
    assert by_peer[flooder] == list(range(3000 - MAX_PARKED_PER_PEER, 3000))  # its newest
    assert all(d.meta["n"] >= 1000 for d in dropped if d is not None)  # only the flooder's


def test_a_connections_requests_stay_in_order() -> None:
    """A league's RESET then a late repeat on one connection: both, in order (one slot per
    connection would keep the repeat alone and lose the reset)."""
    reg = peers([])
    league = new_routing_key()
    assert reg.park(league, request(2)) is None and reg.park(league, request(1)) is None
    reg.next_status = 0.0
    assert [m.meta["n"] for _, m in reg.unpark()] == [2, 1]


def test_past_max_parked_connections_the_longest_waiting_is_dropped() -> None:
    reg = peers([])
    idents = [new_routing_key() for _ in range(MAX_PARKED + 1)]
    results = [reg.park(ident, request(i)) for i, ident in enumerate(idents)]
    assert results[:-1] == [None] * MAX_PARKED
    assert results[-1] is not None and results[-1].meta["n"] == 0
    reg.next_status = 0.0
    assert [ident for ident, _ in reg.unpark()] == idents[1:]
    assert reg.unpark() == []


def test_only_live_allowed_rows_vouch() -> None:
    actor, learner = new_routing_key(), new_routing_key()
    rows = [
        {
            "id": "actor-0",
            "role": "actor",
            "state": "alive",
            "info": {"rpc_keys": {"inference": key_digest(actor)}},
        },
        {
            "id": "learner-0",
            "role": "learner",
            "state": "alive",
            "info": {"rpc_keys": {"inference": key_digest(learner)}},
        },
    ]
    reg = peers(rows)
    found = reg.identify(actor)
    assert found is not None and found.id == "actor-0"
    reg.next_status = 0.0
    assert reg.identify(learner) is None
