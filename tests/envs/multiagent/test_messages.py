"""The league's message validators (``zrl.transport.messages``): ``match_count``,
``match_opponents`` and ``league_results`` return what a well-formed ``match``, ``matches``
or ``results`` carries and raise ``ProtocolError`` for anything else (bools for ints, wrong
lengths, names that are not short strings, more than the limits)."""

from __future__ import annotations

import pytest

from zrl.transport import messages as M
from zrl.transport import protocol as P

LONGEST = "m" * P.MAX_NAME_CHARS


def test_member_name():
    assert M.member_name("main@12") == "main@12"
    assert M.member_name(LONGEST) == LONGEST
    for bad in ("", LONGEST + "m", 3, None, b"main", ["main"]):
        with pytest.raises(P.ProtocolError, match="league member name"):
            M.member_name(bad)


@pytest.mark.parametrize("count", [1, 64, M.MAX_MATCHES])
def test_match_count_accepts(count):
    assert M.match_count({"count": count}) == count


@pytest.mark.parametrize("count", [0, -1, M.MAX_MATCHES + 1, True, False, 2.0, "3", None])
def test_match_count_refuses(count):
    with pytest.raises(P.ProtocolError, match="match count"):
        M.match_count({"count": count})


def test_match_count_refuses_a_missing_count():
    with pytest.raises(P.ProtocolError):
        M.match_count({})


def test_match_opponents_accepts():
    names = ["main", "main@3", "random", "scripted", LONGEST]
    assert M.match_opponents({"opponents": names}) == names
    many = ["main"] * M.MAX_MATCHES
    assert M.match_opponents({"opponents": many}) == many


@pytest.mark.parametrize(
    "opponents",
    [
        [],
        None,
        "main",
        ("main",),
        ["main"] * (M.MAX_MATCHES + 1),
        ["main", ""],
        ["main", LONGEST + "m"],
        ["main", 3],
        [None],
    ],
    ids=["empty", "none", "str", "tuple", "too-many", "empty-name", "long-name", "int", "null"],
)
def test_match_opponents_refuses(opponents):
    with pytest.raises(P.ProtocolError):
        M.match_opponents({"opponents": opponents})


def test_league_results_accepts():
    meta = {"opponents": ["main@1", "random", "main"], "outcomes": [1, -1, 0]}
    assert M.league_results(meta) == [("main@1", 1), ("random", -1), ("main", 0)]
    assert M.league_results({"opponents": [], "outcomes": []}) == []
    full = {"opponents": ["main"] * M.MAX_RESULTS, "outcomes": [0] * M.MAX_RESULTS}
    assert len(M.league_results(full)) == M.MAX_RESULTS
    for _, outcome in M.league_results(meta):
        assert type(outcome) is int


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"opponents": ["main"], "outcomes": [True]}, "outcome True"),
        ({"opponents": ["main"], "outcomes": [False]}, "outcome False"),
        ({"opponents": ["main"], "outcomes": [2]}, "outcome 2"),
        ({"opponents": ["main"], "outcomes": ["win"]}, "outcome 'win'"),
        ({"opponents": ["main"], "outcomes": [None]}, "outcome None"),
        ({"opponents": ["main", "random"], "outcomes": [1]}, "same length"),
        ({"opponents": ["main"], "outcomes": [1, 0]}, "same length"),
        ({"opponents": ["main"]}, "same length"),
        ({"outcomes": [1]}, "same length"),
        ({"opponents": "main", "outcomes": [1]}, "same length"),
        ({"opponents": ["main"], "outcomes": (1,)}, "same length"),
        ({"opponents": [LONGEST + "m"], "outcomes": [1]}, "league member name"),
        ({"opponents": [""], "outcomes": [1]}, "league member name"),
        ({"opponents": [7], "outcomes": [1]}, "league member name"),
        (
            {"opponents": ["main"] * (M.MAX_RESULTS + 1), "outcomes": [0] * (M.MAX_RESULTS + 1)},
            "more than",
        ),
    ],
)
def test_league_results_refuses(meta, match):
    with pytest.raises(P.ProtocolError, match=match):
        M.league_results(meta)


def test_validators_survive_the_wire():
    """What the validators read is what a ``results`` message decodes to (lists, ints)."""
    meta = {"opponents": ["main@2", "scripted"], "outcomes": [-1, 1]}
    msg = P.decode([bytes(f) for f in P.encode(P.Message("results", meta=meta, sender="actor-0"))])
    assert M.league_results(msg.meta) == [("main@2", -1), ("scripted", 1)]
