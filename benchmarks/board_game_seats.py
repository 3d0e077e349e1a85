"""A board-game run's saved policy, played greedily from each seat against reference players.

The evaluator's win/draw/loss rates (eval.csv) mix both seats; the league's targets are per
seat (tic-tac-toe: never lose to a perfect player from either seat, win at least 95 % against
random moves as the first mover; connect four: rates against alpha-beta at depths 2 and 4 as
first and second mover). This plays the greedy policy of ``RUN_DIR/model.pt`` (or --model) on
bitboards (``zrl.envs.multiagent.search``: the observation is the env's, the rules the same)
against each reference player, ``--games`` games per seat, and prints the rates:

    python benchmarks/board_game_seats.py runs/tictactoe_league-...        # random, perfect
    python benchmarks/board_game_seats.py runs/connect_four_ppo-... --games 200
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from zrl.envs.multiagent.games import BoardGame, board_game
from zrl.envs.multiagent.pettingzoo import env_name
from zrl.envs.multiagent.search import AlphaBetaPlayer, Bitboards, PerfectPlayer, observation
from zrl.nets.discrete import greedy_actions
from zrl.roles.evaluation import MODEL_FILES, load_policy

SOLVED_SQUARES = 9  # the perfect player solves boards up to tic-tac-toe's


def reference_players(game: BoardGame) -> dict[str, PerfectPlayer | AlphaBetaPlayer | None]:
    """Random moves (None) and the strong players the game allows."""
    if game.rows * game.cols <= SOLVED_SQUARES:
        return {"random": None, "perfect": PerfectPlayer(game)}
    return {
        "random": None,
        "alphabeta2": AlphaBetaPlayer(game, 2),
        "alphabeta4": AlphaBetaPlayer(game, 4),
    }


def play(
    game: BoardGame,
    model: torch.nn.Module,
    player: PerfectPlayer | AlphaBetaPlayer | None,
    policy_first: bool,
    rng: np.random.Generator,
) -> int:
    """One game: +1 the policy won, 0 draw, -1 it lost (an illegal move of it loses)."""
    boards = Bitboards(game)
    pieces = [0, 0]  # the policy's, the reference player's
    mover = 0 if policy_first else 1
    while legal := boards.moves(pieces[0] | pieces[1]):
        own, other = pieces[mover], pieces[1 - mover]
        obs = observation(game, own, other)
        if mover == 0:
            with torch.no_grad():
                action = int(greedy_actions(model, torch.from_numpy(obs[None]))[0])
        elif player is None:
            action = legal[int(rng.integers(len(legal)))][0]
        else:
            planes = obs[: game.rows * game.cols * 2].reshape(game.rows, game.cols, 2)
            action = player.action(planes, rng)
        bit = dict(legal).get(action)
        if bit is None:
            return -1 if mover == 0 else 1
        pieces[mover] = own | bit
        if boards.completes_line(pieces[mover], bit):
            return 1 if mover == 0 else -1
        mover = 1 - mover
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--model", default="model.pt", choices=MODEL_FILES)
    p.add_argument("--games", type=int, default=1000, help="games per seat and player")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model, cfg, _ = load_policy(args.run_dir, args.model)
    game = board_game(env_name(cfg.env.id))
    if game is None:
        raise SystemExit(f"{cfg.env.id} is no board game zrl has reference players for")
    rng = np.random.default_rng(args.seed)
    print(f"{args.run_dir / args.model}: greedy policy, {args.games} games per seat and player")
    for name, player in reference_players(game).items():
        for first in (True, False):
            results = np.array([play(game, model, player, first, rng) for _ in range(args.games)])
            print(
                f"  vs {name:10s} moving {'first ' if first else 'second'}: win "
                f"{np.mean(results > 0):.3f}  draw {np.mean(results == 0):.3f}  loss "
                f"{np.mean(results < 0):.3f}"
            )


if __name__ == "__main__":
    main()
