"""Strong players and exploitability (``zrl.envs.multiagent.search``): the perfect player
against a plain minimax written from the rules, hand-checked positions, alpha-beta in connect
four, exploitability of policies whose holes are counted by hand, and the observation the search
shows a policy against PettingZoo's own."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tests.envs.multiagent.test_games import planes
from tests.helpers.games import play_random_against
from zrl.envs.multiagent.games import GAMES
from zrl.envs.multiagent.search import (
    AlphaBetaPlayer,
    BestResponse,
    Bitboards,
    PerfectPlayer,
    best_response,
    exploitability,
    from_planes,
    observation,
)

TICTACTOE = GAMES["tictactoe"]
CONNECT_FOUR = GAMES["connect_four"]
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


@cache
def reference_value(board: tuple[int, ...], player: int) -> int:
    """Plain minimax from the rules: ``board`` 9 squares of 0 (empty), 1 or 2, ``player`` to
    move; +1 when the player to move wins with perfect play, 0 draw, -1 loss."""
    other = 3 - player
    if any(all(board[i] == other for i in line) for line in LINES):
        return -1
    empty = [i for i in range(9) if board[i] == 0]
    if not empty:
        return 0
    return max(-reference_value(board[:i] + (player,) + board[i + 1 :], other) for i in empty)


def bits(squares: tuple[int, ...], who: int) -> int:
    return sum(1 << i for i, v in enumerate(squares) if v == who)


def test_the_perfect_player_values_every_position_as_plain_minimax_does() -> None:
    player = PerfectPlayer(TICTACTOE)
    checked = 0

    def walk(board: tuple[int, ...], to_move: int) -> None:
        nonlocal checked
        other = 3 - to_move
        if any(all(board[i] == other for i in line) for line in LINES) or 0 not in board:
            return
        expected = reference_value(board, to_move)
        assert player.value(bits(board, to_move), bits(board, other)) == expected, board
        checked += 1
        for i in range(9):
            if board[i] == 0:
                walk(board[:i] + (to_move,) + board[i + 1 :], other)

    walk((0,) * 9, 1)
    assert checked >= 4520  # every non-final position reachable in play (4,520)
    assert player.value(0, 0) == 0  # tic-tac-toe is a draw


def test_hand_checked_tictactoe_positions() -> None:
    player = PerfectPlayer(TICTACTOE, tie_break="first")
    rng = np.random.default_rng(0)
    # x to move wins at once.
    assert player.best_actions(*from_planes(planes(["xx.", "oo.", "..."]))) == [2]
    # After a corner, the centre is the only reply that does not lose.
    assert player.best_actions(*from_planes(planes(["...", "...", "..."])[..., ::-1])) == list(
        range(9)
    )
    corner = planes(["o..", "...", "..."])
    assert player.best_actions(*from_planes(corner)) == [4]
    assert player.action(corner, rng) == 4
    # Random tie-breaking among equally good moves probes every one of them.
    open_board = planes(["...", "...", "..."])
    random = PerfectPlayer(TICTACTOE)
    assert {random.action(open_board, np.random.default_rng(s)) for s in range(200)} == set(
        range(9)
    )


def test_alpha_beta_wins_blocks_and_prefers_the_centre() -> None:
    rng = np.random.default_rng(0)
    empty = ["......."] * 6
    for depth in (3, 4):  # most lines pass through the centre
        assert AlphaBetaPlayer(CONNECT_FOUR, depth).action(planes(empty), rng) == 3
    for depth in (2, 4):
        player = AlphaBetaPlayer(CONNECT_FOUR, depth)
        win = planes(empty[:5] + ["xxx.oo."])
        assert player.action(win, rng) == 3
        block = planes(empty[:4] + ["x......", "ooo.xx."])
        assert player.action(block, rng) == 3
    # Depth 4 sees a double threat two of its own moves ahead; depth 2 does not.
    trap = planes(empty[:5] + [".xx..o."])
    assert AlphaBetaPlayer(CONNECT_FOUR, 4).scores(*from_planes(trap))[3] > 10**5
    with pytest.raises(ValueError, match="depth 0"):
        AlphaBetaPlayer(CONNECT_FOUR, 0)


def perfect_policy(hole: dict[tuple[int, int], int] | None = None):
    """Greedy actions of a perfect player (first best move), with ``hole``: positions
    (mine, theirs) where it plays the given move instead."""
    player = PerfectPlayer(TICTACTOE, tie_break="first")

    def policy(obs: np.ndarray) -> np.ndarray:
        out = []
        for row in obs:
            board = row[:18].reshape(3, 3, 2)
            position = from_planes(board)
            if hole and position in hole:
                out.append(hole[position])
            else:
                out.append(player.best_actions(*position)[0])
        return np.array(out)

    return policy


def first_legal(obs: np.ndarray) -> np.ndarray:
    return np.argmax(obs[:, 18:] > 0.5, axis=1)


def test_exploitability_of_policies_counted_by_hand() -> None:
    perfect = exploitability(TICTACTOE, perfect_policy())
    assert perfect.outcomes == (0, 0) and perfect.value == 0 and perfect.losing_lines == (0, 0)
    # One hole: answering a corner with an edge loses as the second mover, and only there.
    holed = exploitability(TICTACTOE, perfect_policy({(0, 1): 1}))
    assert holed.outcomes == (0, -1) and holed.value == 0.5
    assert holed.losing_lines[0] == 0 and holed.losing_lines[1] >= 1
    # Always the first legal square: as first mover x takes 0, 1, 3 while o takes 4, 2 and
    # wins on 2-4-6; as second mover o takes 0, 1, 2 in turn and x wins on a line o cannot
    # block. A best response beats it from both seats.
    naive = exploitability(TICTACTOE, first_legal)
    assert naive.outcomes == (-1, -1) and naive.value == 1.0
    assert naive.positions < 600  # asked once per position it can reach


def test_an_illegal_move_loses_at_once() -> None:
    def occupied_square(obs: np.ndarray) -> np.ndarray:
        taken = obs[:, :18].reshape(-1, 9, 2).sum(axis=2)
        return np.where(taken.any(axis=1), taken.argmax(axis=1), 0)

    result = exploitability(TICTACTOE, occupied_square)
    assert result.outcomes[1] == -1  # second mover: it plays on x's first piece


def test_the_search_shows_a_policy_pettingzoos_observation() -> None:
    from pettingzoo.classic import tictactoe_v3

    env = tictactoe_v3.env()
    env.reset(seed=0)
    boards = Bitboards(TICTACTOE)
    mine = theirs = 0
    for action in (4, 0, 8, 2):
        raw = env.observe(env.agent_selection)
        want = np.concatenate(
            [np.asarray(raw["observation"], np.float32).ravel(), raw["action_mask"]]
        )
        np.testing.assert_array_equal(observation(TICTACTOE, mine, theirs), want)
        env.step(action)
        bit = dict(boards.moves(mine | theirs))[action]
        mine, theirs = theirs, mine | bit
    env.close()


def test_the_perfect_player_never_loses_in_the_real_env() -> None:
    counts = play_random_against("pettingzoo/tictactoe_v3", "perfect", 200)
    assert counts.sum() >= 200 and counts[0] == 0  # random moves never win
    assert counts[2] / counts.sum() > 0.8


def test_alpha_beta_beats_random_moves_in_connect_four() -> None:
    counts = play_random_against("pettingzoo/connect_four_v3", "alphabeta2", 16)
    assert counts.sum() >= 16 and counts[2] / counts.sum() > 0.9


def test_the_perfect_player_refuses_a_board_too_big_to_solve() -> None:
    from zrl.envs.multiagent.opponents import FixedOpponents, UnknownOpponentError
    from zrl.envs.multiagent.spaces import AgentObservationSpace

    space = AgentObservationSpace((6, 7, 2), 7, 0)
    fixed = FixedOpponents("perfect", space, 7, CONNECT_FOUR, seed=0)
    with pytest.raises(UnknownOpponentError, match="too big to solve; play alphabeta2"):
        fixed.act("perfect", np.zeros((1, space.shape[0]), np.float32))


def play_out(policy, responder: BestResponse, policy_first: bool, rng: np.random.Generator) -> int:
    """One game of ``policy`` (greedy, deterministic) against ``responder`` (an ``action(planes,
    rng)`` player) on bitboards: +1 the policy won, 0 draw, -1 it lost."""
    boards = Bitboards(TICTACTOE)
    pieces = [0, 0]  # the policy's, the responder's
    mover = 0 if policy_first else 1
    while boards.moves(pieces[0] | pieces[1]):
        own, other = pieces[mover], pieces[1 - mover]
        obs = observation(TICTACTOE, own, other)
        if mover == 0:
            action = int(policy(obs[None])[0])
        else:
            action = responder.action(obs[:18].reshape(3, 3, 2), rng)
        bit = dict(boards.moves(own | other))[action]
        pieces[mover] = own | bit
        if boards.completes_line(pieces[mover], bit):
            return 1 if mover == 0 else -1
        mover = 1 - mover
    return 0


def test_the_best_response_beats_exactly_the_seats_exploitability_says() -> None:
    rng = np.random.default_rng(0)
    # One planted hole (answering a corner with an edge as the second mover): the best
    # response finds it every game it moves first, and cannot beat the policy moving first.
    holed = perfect_policy({(0, 1): 1})
    responder = best_response(TICTACTOE, holed)
    assert all(play_out(holed, responder, False, rng) == -1 for _ in range(20))
    assert all(play_out(holed, responder, True, rng) == 0 for _ in range(20))
    # Its first move as first mover is the corner of the hole: the only winning one.
    assert responder.moves[(0, 0)] == [0]
    # Against perfect play nothing wins: every game is a draw, from both seats.
    perfect = perfect_policy()
    responder = best_response(TICTACTOE, perfect)
    assert all(play_out(perfect, responder, first, rng) == 0 for first in (True, False) * 10)
    # Against the first legal square it wins from both seats (exploitability 1).
    responder = best_response(TICTACTOE, first_legal)
    assert all(play_out(first_legal, responder, first, rng) == -1 for first in (True, False) * 5)


def test_the_best_response_probes_every_winning_line_and_falls_back_off_them() -> None:
    rng = np.random.default_rng(1)
    responder = best_response(TICTACTOE, first_legal)
    # Moving first against the first legal square, several first moves win: all are kept,
    # and the choice among them is random.
    winning = responder.moves[(0, 0)]
    assert len(winning) > 1
    empty = np.zeros((3, 3, 2), np.float32)
    assert {responder.action(empty, rng) for _ in range(200)} == set(winning)
    # A position outside its table (the policy sampled off its greedy line): perfect play.
    fallback = BestResponse({}, PerfectPlayer(TICTACTOE))
    odd = np.zeros((3, 3, 2), np.float32)
    odd[0, 0, 1] = odd[0, 1, 1] = 1.0  # the other player holds 0 and 1; this one the centre
    odd[1, 1, 0] = 1.0
    assert {fallback.action(odd, rng) for _ in range(20)} == {2}
