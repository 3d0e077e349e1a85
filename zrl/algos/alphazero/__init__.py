"""AlphaZero (Silver et al. 2018) on the k-in-a-row board games: actors play self-play games
whose every move is a PUCT search over the game's own model, the network's priors and
values at the leaves; the learner fits the network to the searches' visit counts and the
games' outcomes.

- ``search``: the tree search as small pure functions, many trees per model forward.
- ``player``: the model as the search's evaluator, and the search as a player (the
  evaluator's ``search_player``).
- ``policy``: the actor side (``AlphaZeroPolicy``), ``search_samples`` of finished games.
- ``losses`` and ``update``: the policy-value loss and the learner (``AlphaZeroUpdate``), a
  window of the newest samples.

Samples go to every learner on topic ``rollouts/`` (PPO's path); the env plays each game
from both seats (``env.multiagent.self_play_seats: both``, opponent ``self``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.alphazero.config import AlphaZeroConfig
from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig

BOARD_GAMES = ("pettingzoo/tictactoe_v3", "pettingzoo/connect_four_v3")
"""The envs whose model the search knows (``zrl.envs.multiagent.search.Bitboards``)."""


def check_config(cfg: ExperimentConfig) -> None:
    if cfg.env.id not in BOARD_GAMES:
        raise ValueError(
            f"env.id: {cfg.env.id}: alphazero searches the model of {' or '.join(BOARD_GAMES)}"
        )
    if not cfg.env.multiagent.plays_every_move:
        raise ValueError(
            "env.multiagent: alphazero plays every move of its self-play games: set "
            "self_play_seats: both, opponent: self and no policy_mapping"
        )
    if cfg.roles.league:
        raise ValueError("roles.league: alphazero plays itself with search; set roles.league: 0")
    az = cfg.section(AlphaZeroConfig)
    if az.min_samples > az.window:
        raise ValueError(
            f"alphazero.min_samples ({az.min_samples}) is larger than alphazero.window "
            f"({az.window}): training would never start; lower min_samples or raise window"
        )


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.alphazero.player import search_player
    from zrl.algos.alphazero.policy import AlphaZeroPolicy
    from zrl.algos.alphazero.update import AlphaZeroUpdate
    from zrl.nets.discrete import actor_critic_for

    return Pieces(
        policy=AlphaZeroPolicy,
        update=AlphaZeroUpdate,
        model=actor_critic_for,
        search_player=search_player,
    )


ALGORITHM = Algorithm(
    name="alphazero",
    summary="AlphaZero: self-play with PUCT search, a policy-value network on visit counts",
    pieces=pieces,
    wiring=Wiring(actions="discrete", experience="rollouts", learner_input="rollouts"),
    both_seats=True,
    searches=True,
    # Its self-play moves for both seats (no opponent model) and its search only calls the
    # model's forward: an inference role can evaluate the leaves of all its actors' games.
    remote_inference=True,
    config={"alphazero": AlphaZeroConfig},
    sections=("learner",),
    check_config=check_config,
)
