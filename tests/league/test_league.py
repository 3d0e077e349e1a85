"""The League: recording, snapshot rules, eviction, matchmaking shares, state."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from zrl.config.league import MAIN, LeagueConfig
from zrl.league.population import League
from zrl.testing.fakes import FakeClock


def league(**overrides: object) -> tuple[League, FakeClock]:
    clock = FakeClock()
    return League(LeagueConfig(**overrides), seed=0, clock=clock), clock  # type: ignore[arg-type]


def play(lg: League, opponent: str, wins: int = 0, losses: int = 0, draws: int = 0) -> None:
    for outcome, n in ((1, wins), (-1, losses), (0, draws)):
        for _ in range(n):
            assert lg.record(opponent, outcome)


# --- recording -------------------------------------------------------------------------------


def test_empty_pool_always_self_play() -> None:
    lg, _ = league(fixed_opponents=[])
    assert {lg.choose_opponent() for _ in range(200)} == {MAIN}


def test_self_play_only_counts() -> None:
    lg, _ = league()
    play(lg, MAIN, wins=2, losses=1)
    assert (lg.games, lg.self_play_games) == (3, 3)
    assert lg.payoff.state_dict() == {"pairs": []}
    assert lg.elo.ratings() == {}


def test_record_updates_payoff_and_elo() -> None:
    lg, _ = league(elo_k=16, payoff_decay=1.0)
    play(lg, "random", wins=1)
    assert lg.payoff.counts(MAIN, "random") == (1.0, 0.0, 0.0)
    assert lg.elo.ratings() == {MAIN: 1008.0, "random": 992.0}
    assert lg.games == 1 and lg.self_play_games == 0


def test_game_against_a_departed_member_is_dropped() -> None:
    lg, _ = league(max_snapshots=1, fixed_opponents=[])
    old = lg.add_snapshot(1)
    lg.add_snapshot(2)
    assert not lg.record(old, 1)
    assert not lg.record("nobody", -1)
    assert (lg.games, lg.dropped_games) == (0, 2)
    assert lg.payoff.games(MAIN, old) == 0.0
    with pytest.raises(ValueError, match="outcome"):
        lg.record(MAIN, 5)


# --- snapshot rules --------------------------------------------------------------------------


def test_win_rate_trigger_waits_for_min_games_on_every_snapshot() -> None:
    lg, _ = league(min_games=5, payoff_decay=1.0, snapshot_win_rate=0.7, fixed_opponents=[])
    assert not lg.snapshot_reason()  # no snapshots: the win-rate rule has nothing to count
    a, b = lg.add_snapshot(1), lg.add_snapshot(2)
    play(lg, a, wins=4)
    play(lg, b, wins=4)
    assert lg.main_win_rate() == 1.0
    assert not lg.snapshot_reason()  # 4 < 5 games on both
    play(lg, a, wins=1)
    assert not lg.snapshot_reason()  # b still has 4
    play(lg, b, wins=1)
    assert lg.snapshot_reason() == "win_rate"
    assert lg.snapshot_reason()


def test_win_rate_trigger_needs_the_rate() -> None:
    lg, _ = league(min_games=5, payoff_decay=1.0, snapshot_win_rate=0.7, fixed_opponents=[])
    a, b = lg.add_snapshot(1), lg.add_snapshot(2)
    play(lg, a, wins=5)  # 1.0
    play(lg, b, wins=2, losses=3)  # 0.4: mean 0.7
    assert lg.main_win_rate() == pytest.approx(0.7)
    assert lg.snapshot_reason()
    play(lg, b, losses=1)  # 2/6: mean 0.667
    assert not lg.snapshot_reason()


def test_min_games_counts_decayed_games() -> None:
    # 6 games with decay 0.9 count (1 - 0.9^6) / 0.1 = 4.69 < 5; 7 count 5.22
    lg, _ = league(min_games=5, payoff_decay=0.9, fixed_opponents=[])
    a = lg.add_snapshot(1)
    play(lg, a, wins=6)
    assert lg.payoff.games(MAIN, a) == pytest.approx((1 - 0.9**6) / 0.1)
    assert not lg.snapshot_reason()
    play(lg, a, wins=1)
    assert lg.snapshot_reason()


def test_time_trigger_with_a_fake_clock() -> None:
    lg, clock = league(snapshot_interval_s=10.0)
    clock.t = 9.99
    assert lg.snapshot_reason() is None
    clock.t = 10.0
    assert lg.snapshot_reason() == "time"
    lg.add_snapshot(7)
    assert not lg.snapshot_reason()
    clock.t = 19.99
    assert not lg.snapshot_reason()
    clock.t = 20.0
    assert lg.snapshot_reason() == "time"


def test_snapshot_ids_and_starting_elo() -> None:
    lg, _ = league(elo_k=16)
    play(lg, "random", wins=1)
    name = lg.add_snapshot(42)
    assert name == "main@42"
    assert lg.snapshots == ["main@42"]
    assert lg.elo.rating(name) == lg.elo.rating(MAIN) == 1008.0
    assert lg.add_snapshot(42) == name  # same weights again: nothing new
    assert lg.snapshots == ["main@42"]
    assert lg.pool == ["main@42", "random"]


def test_eviction_forgets_payoff_and_elo() -> None:
    lg, _ = league(max_snapshots=2, fixed_opponents=["random"], payoff_decay=1.0)
    first, second = lg.add_snapshot(1), lg.add_snapshot(2)
    for name in (first, second, "random"):
        play(lg, name, wins=1, losses=2)
    third = lg.add_snapshot(3)
    assert lg.snapshots == [second, third]
    assert lg.payoff.games(MAIN, first) == 0.0
    assert all(first not in pair[:2] for pair in lg.payoff.state_dict()["pairs"])
    assert first not in lg.elo.ratings()
    assert lg.payoff.games(MAIN, second) == 3.0
    assert second in lg.elo.ratings() and "random" in lg.elo.ratings()


def test_newest_snapshot_is_never_evicted() -> None:
    lg, _ = league(max_snapshots=1)
    lg.add_snapshot(1)
    assert lg.add_snapshot(2) == "main@2"
    assert lg.snapshots == ["main@2"]


# --- matchmaking -------------------------------------------------------------------------------


def frequencies(lg: League, n: int) -> dict[str, float]:
    counts = Counter(lg.choose_opponent() for _ in range(n))
    return {name: c / n for name, c in counts.items()}


def assert_close_to(freqs: dict[str, float], expected: dict[str, float], n: int) -> None:
    """Every empirical frequency within 4 binomial standard deviations of its probability
    (at n = 20000 at most 0.014); a probability of zero must never be drawn."""
    assert set(freqs) <= set(expected)
    for name, p in expected.items():
        tolerance = 4 * np.sqrt(p * (1 - p) / n)
        assert abs(freqs.get(name, 0.0) - p) <= tolerance, (name, freqs.get(name), p)


def test_matchmaking_mixture() -> None:
    """Shares 0.3 self-play, 0.2 verification, 0.5 PFSP (squared). main's win rates: 0.1 and
    0.2 (both forgotten, below 0.3), 0.5, 0.8, 1.0 against the snapshots, 0.9 against random."""
    n = 20_000
    lg, _ = league(self_play=0.3, verification=0.2, payoff_decay=1.0, weighting="squared")
    names = [lg.add_snapshot(v) for v in range(1, 6)]
    for name, wins in zip(names + ["random"], [1, 2, 5, 8, 10, 9], strict=True):
        play(lg, name, wins=wins, losses=10 - wins)
    # squared weights (1 - p)^2 over the pool: .81 .64 .25 .04 0 .01, sum 1.75;
    # over the forgotten two: .81 .64, sum 1.45
    pool = dict(zip(names + ["random"], [0.81, 0.64, 0.25, 0.04, 0.0, 0.01], strict=True))
    forgotten = {names[0]: 0.81, names[1]: 0.64}
    expected = {MAIN: 0.3}
    for name, w in pool.items():
        expected[name] = 0.5 * w / 1.75 + 0.2 * forgotten.get(name, 0.0) / 1.45
    assert sum(expected.values()) == pytest.approx(1.0)
    freqs = frequencies(lg, n)
    assert_close_to(freqs, expected, n)
    assert names[4] not in freqs  # beaten every time: squared weight 0


def test_verification_share_goes_to_pfsp_when_nothing_is_forgotten() -> None:
    """Win rates 0.5, 0.75 and 0.25 (random), none below 0.3 among the snapshots: the 0.15
    verification share joins the 0.5 PFSP share; linear weights 1-p: .5 .25 .75, sum 1.5."""
    n = 20_000
    lg, _ = league(self_play=0.35, verification=0.15, payoff_decay=1.0, weighting="linear")
    a, b = lg.add_snapshot(1), lg.add_snapshot(2)
    play(lg, a, wins=2, losses=2)
    play(lg, b, wins=3, losses=1)
    play(lg, "random", wins=1, losses=3)
    expected = {MAIN: 0.35, a: 0.65 * 0.5 / 1.5, b: 0.65 * 0.25 / 1.5, "random": 0.65 * 0.75 / 1.5}
    assert_close_to(frequencies(lg, n), expected, n)


def test_fixed_share_meets_the_fixed_players_uniformly() -> None:
    """Shares 0.3 self-play, 0.4 fixed (uniform over random and scripted), 0.3 PFSP (linear)
    over two snapshots and the two fixed players: main's win rates 0.5, 0.75, 0.95 (random),
    0.5 (scripted); weights 1-p: .5 .25 .05 .5, sum 1.3. Random keeps its 0.2 however well main
    beats it, which PFSP alone would not give it (0.3 * .05 / 1.3 = 0.012)."""
    n = 20_000
    lg, _ = league(
        self_play=0.3,
        fixed_share=0.4,
        verification=0.0,
        payoff_decay=1.0,
        weighting="linear",
        fixed_opponents=["random", "scripted"],
    )
    a, b = lg.add_snapshot(1), lg.add_snapshot(2)
    play(lg, a, wins=2, losses=2)
    play(lg, b, wins=3, losses=1)
    play(lg, "random", wins=19, losses=1)
    play(lg, "scripted", wins=1, losses=1)
    pfsp = {a: 0.5, b: 0.25, "random": 0.05, "scripted": 0.5}
    expected = {MAIN: 0.3, **{k: 0.3 * w / 1.3 for k, w in pfsp.items()}}
    expected["random"] += 0.2
    expected["scripted"] += 0.2
    assert sum(expected.values()) == pytest.approx(1.0)
    assert_close_to(frequencies(lg, n), expected, n)


def test_shares_over_one_are_refused() -> None:
    with pytest.raises(ValueError, match="fixed_share"):
        LeagueConfig(self_play=0.5, verification=0.3, fixed_share=0.3)


def test_same_seed_same_draws() -> None:
    draws = []
    for _ in range(2):
        lg, _ = league()
        lg.add_snapshot(1)
        draws.append([lg.choose_opponent() for _ in range(100)])
    assert draws[0] == draws[1]
    assert len(set(draws[0])) == 3


# --- reporting and state -------------------------------------------------------------------------


def test_info_figures() -> None:
    lg, clock = league(elo_k=16, payoff_decay=1.0)
    a = lg.add_snapshot(1)
    play(lg, a, wins=3, losses=1)
    play(lg, MAIN, wins=1)
    clock.t = 5.0
    info = lg.info()
    assert info["games"] == 5 and info["self_play_games"] == 1 and info["snapshots"] == 1
    assert info["main_win_rate"] == 0.75
    assert info["since_snapshot_s"] == 5.0
    assert info["elo_main"] == lg.elo.rating(MAIN) > 1000
    assert info["elo_random"] == 1000.0
    assert all(isinstance(v, float) for v in info.values())


def test_state_round_trip_is_exact() -> None:
    lg, clock = league(max_snapshots=3, payoff_decay=0.97)
    rng = np.random.default_rng(1)
    for version in range(1, 6):
        clock.t += 3.5
        lg.add_snapshot(version)
        for _ in range(30):
            lg.record(lg.choose_opponent(), int(rng.choice([-1, 0, 1])))
    lg.record("main@0", 1)  # dropped
    clock.t += 1.25
    state = json.loads(json.dumps(lg.state_dict()))
    other_clock = FakeClock()
    other_clock.t = 1000.0
    restored = League(lg.cfg, seed=99, clock=other_clock)
    restored.load_state_dict(state)
    assert restored.state_dict() == lg.state_dict()
    assert restored.since_snapshot_s() == 1.25
    assert restored.info() == lg.info()
    assert [restored.choose_opponent() for _ in range(200)] == [
        lg.choose_opponent() for _ in range(200)
    ]
