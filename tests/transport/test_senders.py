"""The sender table (zrl.transport.senders): every message kind has a row, docs/protocol.md
carries the table as the code has it, and ``may_send`` answers by role and channel."""

from __future__ import annotations

import re
from pathlib import Path

from zrl.transport import protocol as P
from zrl.transport import senders as S

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_every_message_kind_has_a_sender_row() -> None:
    kinds = {
        value
        for name, value in vars(P).items()
        if name.isupper() and isinstance(value, str) and value in P.KINDS
    }
    assert kinds == set(P.KINDS)  # every kind constant is listed in KINDS
    missing = [k for k in P.KINDS if not S.routes(k)]
    assert missing == [], f"message kinds without a row in the sender table: {missing}"
    unknown = {r.kind for r in S.TABLE} - set(P.KINDS)
    assert unknown == set()
    for r in S.TABLE:
        assert r.senders and set(r.senders) <= {*S.SENDERS, S.NOBODY}, r
        assert re.fullmatch(r"registry|none|rpc:[a-z]+|stream:[a-z]+|topic:[a-z/-]+", r.channel), r


def test_docs_protocol_carries_the_sender_table_of_the_code() -> None:
    text = DOC.read_text()
    found = re.search(r"<!-- sender-table:begin -->\n(.*?)<!-- sender-table:end -->", text, re.S)
    assert found is not None, "docs/protocol.md lacks the sender table markers"
    assert found.group(1) == S.render_markdown()


def test_may_send_follows_the_role_not_the_message() -> None:
    # WEIGHTS to params' rpc: the learner only.
    assert S.may_send(P.WEIGHTS, "learner", "rpc:params")
    for role in ("actor", "replay", "evaluator", "league", S.CLIENT):
        assert not S.may_send(P.WEIGHTS, role, "rpc:params"), role
    assert S.may_send(P.WEIGHTS, "params", "rpc:params")  # its answer to get_weights
    # METRICS on the metrics topic: roles only; eval results: the evaluator only.
    assert S.may_send(P.METRICS, "actor", "topic:metrics")
    assert not S.may_send(P.METRICS, S.CLIENT, "topic:metrics")
    assert S.may_send(P.METRICS, "evaluator", "topic:eval")
    assert not S.may_send(P.METRICS, "actor", "topic:eval")
    # Per-id topics and named policies map to their family.
    assert S.may_send(P.ACK, "replay", "topic:acks/actor-3/")
    assert not S.may_send(P.ACK, "actor", "topic:acks/actor-3/")
    assert S.may_send(P.ACK, "learner", "topic:batch-acks/replay-0/")
    assert S.may_send(P.WEIGHTS, "params", "topic:policy/exploiter/weights")
    assert not S.may_send(P.WEIGHTS, "learner", "topic:weights")
    # Anyone may ask STATUS; only the head may STOP_RUN; nobody sends ERROR.
    assert S.may_send(P.STATUS, "anything", "registry")
    assert S.may_send(P.STOP_RUN, S.HEAD, "registry")
    assert not S.may_send(P.STOP_RUN, "actor", "registry")
    assert not any(S.may_send(P.ERROR, s, "none") for s in S.SENDERS)
    assert not S.may_send("no-such-kind", "actor", "registry")

    def senders(kind: str, channel: str) -> set[str]:
        return {s for r in S.routes(kind) if r.channel == channel for s in r.senders}

    assert senders(P.WEIGHTS, "rpc:params") == {"learner", "params"}
    assert senders(P.RESULTS, "rpc:league") == {"actor"}


def test_planned_ids_follow_the_config_role_counts() -> None:
    from zrl.config.experiment import ExperimentConfig

    counts = ExperimentConfig().roles.counts()
    ids = S.planned_ids({**counts, "actors": 3, "league": 0})
    assert {"actor-0", "actor-1", "actor-2", "learner-0", "replay-0", "params-0"} <= ids
    assert "actor-3" not in ids and not any(i.startswith("league-") for i in ids)
    assert set(S.ROLE_OF_COUNT) == set(counts)  # every count key of the config has a role
