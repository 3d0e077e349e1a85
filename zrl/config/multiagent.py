"""The ``env.multiagent:`` section of an experiment config: PettingZoo envs in the actor.

Pydantic only (no numpy, no PettingZoo): ``zrl.config.experiment`` imports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from zrl.config.base import Section

SEARCH_PLAYERS = ("perfect", "alphabeta2", "alphabeta4")
"""Strong players by game-tree search (``zrl.envs.multiagent.search``): ``perfect`` solves the
game (tic-tac-toe), ``alphabeta<depth>`` searches that many plies (connect four)."""
FIXED_PLAYERS = ("random", "scripted", *SEARCH_PLAYERS)
"""The players that need no weights: uniformly random legal moves, the game's scripted player
(``zrl.envs.multiagent.games``) and the search players."""

BEST_RESPONSE = "best_response"
"""The best response to the learning policy's current greedy policy, found by exhaustive search
(``zrl.envs.multiagent.search.best_response``; small games: tic-tac-toe): a training opponent
that plays every line the policy still loses, and draws once there is none."""
REFERENCE_PLAYERS = (*FIXED_PLAYERS, BEST_RESPONSE)
"""The players a run or a league can give the learning policy that are no snapshot's weights."""

SEAT_POLICIES = ("main", "opponent", *FIXED_PLAYERS)

MULTIAGENT_PACKAGES = ("pettingzoo", "mpe2")
"""The packages whose envs ``env.id: <package>/<name>`` names (``zrl.envs.multiagent.envs``)."""


def is_multiagent(env_id: str) -> bool:
    """Whether ``env.id`` names a PettingZoo env (``pettingzoo/<name>``, ``mpe2/<name>``)."""
    return "/" in env_id and env_id.split("/", 1)[0] in MULTIAGENT_PACKAGES


class MultiAgentConfig(Section):
    """How a PettingZoo env (``env.id: pettingzoo/<name>`` or ``mpe2/<name>``) becomes the
    actor's slots.

    Every agent is mapped to a policy. ``main`` is the learning policy: each agent mapped to it
    is one slot of the actor's vector env, and its steps are the trajectories the learner
    trains on. The other agents are played inside the env: ``opponent`` by the opponent chosen
    for the episode (by the league when one runs, else ``opponent``), ``random`` and
    ``scripted`` by those fixed players."""

    api: Literal["auto", "aec", "parallel"] = "auto"
    """PettingZoo API: parallel for envs that have ``parallel_env`` (MPE), AEC (turn-based,
    one agent acts at a time) for the others (the classic board games)."""
    policy_mapping: dict[str, str] = Field(default_factory=dict)
    """Agent id -> main | opponent | random | scripted ("*" for every other agent). Empty:
    turn-based games give one seat to main and the others to opponent, the seat alternating
    every episode so the learner moves first in half its games; parallel envs map every agent
    to main (shared parameters)."""
    opponent: Literal[
        "self", "random", "scripted", "perfect", "alphabeta2", "alphabeta4", "best_response"
    ] = "self"
    """Who plays the opponent seats when no league runs (``roles.league: 0``): the
    learning policy's current weights (naive self-play), random legal moves, the game's
    scripted player, a search player (``perfect``: tic-tac-toe; ``alphabeta2``,
    ``alphabeta4``: alpha-beta that many plies deep), or ``best_response``, the best response
    to the learning policy's current greedy policy (tic-tac-toe)."""
    self_play_seats: Literal["learning", "both"] = "learning"
    """In a turn-based game against its own current weights (``self``, a league's
    self-play): ``learning``, the learning policy learns from its seat only and its weights
    play the other as an opponent; ``both``, one slot plays every move of the game, for
    whichever seat is to move, and learns from all of them (negamax: each step's value and
    advantage bootstrap on the next one's negated, ``passes`` in the rollouts). Algorithms
    whose learners take those rollouts only (ppo, without ``model.core``)."""
    central_value: bool = False
    """Append the env's global state (``state()``) to every slot's observation; zrl's
    actor-critic gives it only to the value function (a centralised critic, MAPPO)."""
    eval_opponents: list[str] = Field(default_factory=lambda: ["random"])
    """The evaluator plays the learning policy against each of these (random, scripted,
    perfect, alphabeta2, alphabeta4) and reports win/draw/loss rates; the first one's mean
    return is the evaluation return."""

    @field_validator("policy_mapping")
    @classmethod
    def _known_policies(cls, mapping: dict[str, str]) -> dict[str, str]:
        for agent, policy in mapping.items():
            if policy not in SEAT_POLICIES:
                known = ", ".join(SEAT_POLICIES)
                raise ValueError(f"policy_mapping[{agent!r}]: {policy!r} is not one of {known}")
        return mapping

    @field_validator("eval_opponents")
    @classmethod
    def _fixed_opponents(cls, names: list[str]) -> list[str]:
        for name in names:
            if name not in FIXED_PLAYERS:
                raise ValueError(
                    f"eval_opponents: {name!r} is not one of {', '.join(FIXED_PLAYERS)}"
                )
        if not names:
            raise ValueError(f"eval_opponents: give at least one ({', '.join(FIXED_PLAYERS)})")
        return names

    @property
    def plays_every_move(self) -> bool:
        """Whether the learning slot moves for every seat of its games and so plays no
        opponent model: self-play from both seats, ``opponent: self``, no policy_mapping."""
        return (
            self.self_play_seats == "both" and self.opponent == "self" and not self.policy_mapping
        )
