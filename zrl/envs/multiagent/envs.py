"""PettingZoo envs as the actor's vector env: one slot per agent of the learning policy.

``env.id: pettingzoo/<name>`` (``pettingzoo/tictactoe_v3``, ``pettingzoo/connect_four_v3``:
PettingZoo's families are searched) or ``<package>/<name>`` for another package of PettingZoo
envs (``mpe2/simple_spread_v3``), found by ``zrl.envs.multiagent.pettingzoo``. ``env.multiagent``
maps each agent to a policy (``zrl.config.multiagent``).

Both vector envs keep the runtime's contract: gymnasium's NEXT_STEP autoreset (the step after
a slot's episode ended only starts a new game, reward 0), float32 slot observations
(``zrl.envs.multiagent.spaces``), one Discrete action per slot.

- :class:`TurnBasedVectorEnv` (AEC): one game per slot. After the learning policy's move the
  other agents move inside ``step`` (batched over the games, per opponent) until it is the
  learning policy's turn again or the game ends; the slot's reward is what its agent earned
  in between. Each episode's opponent comes from :class:`~zrl.envs.multiagent.opponents.Opponents`,
  which hears the result.
- :class:`ParallelVectorEnv` (parallel API): every agent mapped to main is a slot, all agents
  act at once; games end when all their agents are done.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from zrl.config.multiagent import MultiAgentConfig
from zrl.envs.multiagent.games import BoardGame, board_game
from zrl.envs.multiagent.opponents import FixedOpponents, Opponents
from zrl.envs.multiagent.pettingzoo import (
    MultiAgentEnvError,
    env_module,
    env_name,
    uses_parallel_api,
)
from zrl.envs.multiagent.spaces import AgentObservationSpace, agent_space, encode

SELF_PLAY = "self"
"""The opponents' name of the learning policy's own current weights."""


def seat_policies(cfg: MultiAgentConfig, agents: list[str], turn_based: bool) -> dict[str, str]:
    """Agent id -> policy, from ``policy_mapping`` ("*" for the agents it does not name) or
    the default (turn-based: all "opponent", the learning seat is chosen per episode;
    parallel: all "main")."""
    mapping = cfg.policy_mapping
    unknown = sorted(set(mapping) - {*agents, "*"})
    if unknown:
        raise MultiAgentEnvError(
            f"env.multiagent.policy_mapping names {', '.join(unknown)}, not agents of this env "
            f"({', '.join(agents)})"
        )
    if not mapping:
        return {a: "opponent" if turn_based else "main" for a in agents}
    unmapped = [a for a in agents if a not in mapping and "*" not in mapping]
    if unmapped:
        raise MultiAgentEnvError(
            f"env.multiagent.policy_mapping maps no policy to {', '.join(unmapped)}: name them, "
            'or give "*" for every agent it does not name'
        )
    return {a: mapping.get(a, mapping.get("*", "")) for a in agents}


class MultiAgentVectorEnv(gym.vector.VectorEnv):
    """What the two vector envs share: the games, the mapping, the spaces, the per-game
    NEXT_STEP bookkeeping and the opponents."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    turn_based: ClassVar[bool]
    """Whether the games take turns (PettingZoo's AEC API) or all agents act at once."""
    step_info: tuple[str, ...] = ()
    """The per-slot arrays of ``step``'s info the actor records with each step (``passes``)."""

    def __init__(
        self,
        make: Callable[[], Any],
        num_games: int,
        cfg: MultiAgentConfig,
        board: BoardGame | None = None,
    ) -> None:
        self.games = [make() for _ in range(num_games)]
        self.agents = agents = list(self.games[0].possible_agents)
        self.cfg = cfg
        self.mapping = seat_policies(cfg, agents, self.turn_based)
        probe = self.games[0]
        spaces = {a: probe.observation_space(a) for a in agents}
        actions = {a: probe.action_space(a) for a in agents}
        main = [a for a in agents if self.mapping[a] in ("main", "opponent")] or agents
        first = main[0]
        for a in main:
            if spaces[a] != spaces[first] or actions[a] != actions[first]:
                raise MultiAgentEnvError(
                    f"agents {first} and {a} share the learning policy but have different "
                    "observation or action spaces"
                )
        if not isinstance(actions[first], gym.spaces.Discrete):
            raise MultiAgentEnvError(
                f"agent {first}'s action space {actions[first]} is not Discrete"
            )
        state_space = getattr(probe, "state_space", None) if cfg.central_value else None
        if cfg.central_value and state_space is None:
            raise MultiAgentEnvError("env.multiagent.central_value: this env has no state()")
        self.single_observation_space: AgentObservationSpace = agent_space(
            spaces[first], state_space
        )
        self.single_action_space = actions[first]
        self.num_actions = int(actions[first].n)
        self.opponents: Opponents | None = None
        """Who plays the agents the learning policy does not (None: random legal moves). Set
        after construction: opponents are made for the env's spaces (``fixed_opponents``)."""
        self.board = board
        """The game's scripted player (None: the game has none)."""
        self.over = np.zeros(num_games, bool)
        self.episodes = np.zeros(num_games, np.int64)
        self.seed: int | None = None
        self._take_seats(num_games)

    def _take_seats(self, num_games: int) -> None:
        """Which agents the learning policy plays, and the slots and state that follow."""
        raise NotImplementedError

    def set_num_envs(self, num_envs: int) -> None:
        """The slot count, and the batched spaces that follow from it."""
        self.num_envs = num_envs
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def game_seed(self, g: int) -> int | None:
        """The reset seed of game ``g``'s current episode: distinct per game and episode."""
        if self.seed is None:
            return None
        return self.seed + g + len(self.games) * int(self.episodes[g])

    def _opponents(self) -> Opponents:
        if self.opponents is None:  # a probe of the spaces, or a test: random legal moves
            self.opponents = FixedOpponents(
                "random", self.single_observation_space, self.num_actions, self.board, seed=0
            )
        return self.opponents

    def heartbeat_info(self) -> dict[str, Any]:
        """Figures for the actor's heartbeat."""
        return {}

    def close(self, **kwargs: Any) -> None:
        for env in self.games:
            env.close()


class TurnBasedVectorEnv(MultiAgentVectorEnv):
    """One slot per game of a turn-based (AEC) PettingZoo env; see the module docstring."""

    turn_based = True

    def _take_seats(self, num_games: int) -> None:
        agents = self.agents
        learning = [a for a in agents if self.mapping[a] == "main"]
        if len(learning) > 1:
            raise MultiAgentEnvError(
                "env.multiagent.policy_mapping: a turn-based game has one main seat, "
                f"not {learning}"
            )
        self.fixed_seat = learning[0] if learning else None
        # Without a main seat the learning policy takes turns over the opponent seats (never
        # one the mapping gives to a fixed player).
        self.learning_seats = learning or [a for a in agents if self.mapping[a] == "opponent"]
        if not self.learning_seats:
            raise MultiAgentEnvError(
                "env.multiagent.policy_mapping leaves the learning policy no seat: map one "
                "agent to main or opponent"
            )
        # The unwrapped envs: PettingZoo's wrappers forward every attribute through several
        # __getattr__ calls and observe twice per step (most of a game's cost). Their one
        # check that matters, an illegal move, is made here on the mask the mover saw.
        self.raw = [env.unwrapped for env in self.games]
        self.set_num_envs(num_games)
        self.seat = [agents[0]] * num_games
        self.opponent = ["random"] * num_games
        self.episode_return = np.zeros(num_games)
        self.pending_reward = np.zeros(num_games)
        self.last_obs = np.zeros((num_games, *self.single_observation_space.shape), np.float32)
        self.forfeit = np.zeros(num_games, bool)
        self.illegal_moves = 0
        # self_play_seats: both: in a game against "self" the slot makes every move, for
        # whichever seat is to move, and reports in info["passes"] that the turn passed.
        self.both_seats = self.cfg.self_play_seats == "both"
        self.plays_both = np.zeros(num_games, bool)
        self.step_info = ("passes",) if self.both_seats else ()

    def heartbeat_info(self) -> dict[str, Any]:
        return {"illegal_moves": self.illegal_moves}

    def _player(self, g: int, agent: str) -> str:
        if agent == self.seat[g]:
            return "main"
        policy = self.mapping[agent]
        return self.opponent[g] if policy in ("opponent", "main") else policy

    def _start(self, g: int) -> None:
        self.games[g].reset(seed=self.game_seed(g))
        if self.fixed_seat is not None:
            self.seat[g] = self.fixed_seat
        else:  # alternate, so the learning policy moves first in half its games
            seats = self.learning_seats
            self.seat[g] = seats[(g + int(self.episodes[g])) % len(seats)]
        if self._player_is_opponent(g):
            self.opponent[g] = self._opponents().choose()
        self.plays_both[g] = self.both_seats and self.opponent[g] == SELF_PLAY
        if self.plays_both[g]:  # the slot moves first, and then for every seat in turn
            self.seat[g] = self.raw[g].agent_selection
        self.episode_return[g] = 0.0
        self.pending_reward[g] = 0.0
        self.over[g] = False
        self.forfeit[g] = False

    def _game_over(self, g: int) -> bool:
        env = self.raw[g]
        return (
            self.forfeit[g]
            or not env.agents
            or all(env.terminations[a] or env.truncations[a] for a in env.agents)
        )

    def _legal(self, obs: np.ndarray, action: int) -> bool:
        space = self.single_observation_space
        return not space.mask or (0 <= action < space.mask and obs[space.features + action] > 0.5)

    def _apply(self, g: int, action: int, obs: np.ndarray) -> None:
        """Step game ``g`` with ``action`` of the agent to move, who saw ``obs``. An illegal
        move by the learning policy forfeits the game (reward -1, as PettingZoo's own check
        rules); one by another player is a bug of that player."""
        if not self._legal(obs, action):
            if self.raw[g].agent_selection != self.seat[g]:
                raise MultiAgentEnvError(
                    f"opponent {self.opponent[g]!r} played illegal move {action}"
                )
            self.illegal_moves += 1
            self.forfeit[g] = True
            self.pending_reward[g] -= 1.0
            self.episode_return[g] -= 1.0
            return
        self.raw[g].step(int(action))
        reward = float(self.raw[g].rewards.get(self.seat[g], 0.0))
        self.pending_reward[g] += reward
        self.episode_return[g] += reward

    def _play_others(self) -> None:
        """Step the agents that are not the learning policy until every game waits for it
        or is over: one batched ``act`` per opponent per round of moves."""
        while True:
            waiting: dict[str, list[int]] = defaultdict(list)
            for g, env in enumerate(self.raw):
                if not self.over[g] and env.agent_selection != self.seat[g]:
                    if self._game_over(g):
                        continue
                    waiting[self._player(g, env.agent_selection)].append(g)
            if not waiting:
                return
            for name, games in waiting.items():
                obs = np.stack([self._observe(g, self.raw[g].agent_selection) for g in games])
                actions = self._opponents().act(name, obs)
                for i, (g, action) in enumerate(zip(games, actions, strict=True)):
                    self._apply(g, int(action), obs[i])

    def _observe(self, g: int, agent: str) -> np.ndarray:
        env = self.raw[g]
        state = env.state() if self.single_observation_space.state else None
        return encode(env.observe(agent), self.single_observation_space, state)

    def _observations(self) -> np.ndarray:
        for g in range(self.num_envs):
            self.last_obs[g] = self._observe(g, self.seat[g])
        return self.last_obs.copy()

    def reset(
        self, *, seed: int | None = None, options: Any = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.seed = seed
        for g in range(self.num_envs):
            self._start(g)
        self._play_others()
        return self._observations(), {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        n = self.num_envs
        restarted = self.over.copy()
        passes = np.zeros(n, bool)
        for g in range(n):
            if restarted[g]:
                self.episodes[g] += 1
                self._start(g)
            elif not self._game_over(g):
                self._apply(g, int(actions[g]), self.last_obs[g])
                if self.plays_both[g] and not self._game_over(g):
                    # The other seat is to move, and this slot plays it: its reward and
                    # values are that seat's from now on (negamax).
                    self.seat[g] = self.raw[g].agent_selection
                    passes[g] = True
        self._play_others()
        rewards = np.zeros(n, np.float32)
        terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
        for g in range(n):
            if restarted[g]:
                continue
            rewards[g] = self.pending_reward[g]
            self.pending_reward[g] = 0.0
            if self._game_over(g):
                env, seat = self.raw[g], self.seat[g]
                terminated[g] = self.forfeit[g] or bool(env.terminations.get(seat, False))
                truncated[g] = not terminated[g]
                self.over[g] = True
                if self._player_is_opponent(g):
                    # A game the slot played from both seats is even: its returns sum the
                    # winner's reward, nobody's result.
                    outcome = 0 if self.plays_both[g] else int(np.sign(self.episode_return[g]))
                    self._opponents().finished(self.opponent[g], outcome)
        info = {"passes": passes} if self.both_seats else {}
        return self._observations(), rewards, terminated, truncated, info

    def _player_is_opponent(self, g: int) -> bool:
        """Whether game ``g`` has a seat the episode's chosen opponent plays."""
        return any(self.mapping[a] == "opponent" for a in self.agents if a != self.seat[g])


class ParallelVectorEnv(MultiAgentVectorEnv):
    """Every agent mapped to main is a slot; all agents act at once (PettingZoo's parallel
    API). Agents mapped to random or scripted play inside ``step``."""

    turn_based = False

    def _take_seats(self, num_games: int) -> None:
        if "opponent" in self.mapping.values():
            raise MultiAgentEnvError(
                "env.multiagent.policy_mapping: opponent seats are for turn-based games; map "
                "the agents of a parallel env to main, random or scripted"
            )
        self.slots = [a for a in self.agents if self.mapping[a] == "main"]
        if not self.slots:
            raise MultiAgentEnvError("env.multiagent.policy_mapping maps no agent to main")
        self.set_num_envs(num_games * len(self.slots))
        self.last_obs: list[dict[str, Any]] = [{} for _ in self.games]

    def _start(self, g: int) -> None:
        obs, _ = self.games[g].reset(seed=self.game_seed(g))
        self.last_obs[g] = dict(obs)
        self.over[g] = False

    def _slot_obs(self, g: int, agent: str, state: np.ndarray | None = None) -> np.ndarray:
        raw = self.last_obs[g].get(agent)
        if raw is None:  # a finished agent: its last observation was not kept
            return np.zeros(self.single_observation_space.shape, np.float32)
        if state is None and self.single_observation_space.state:
            state = self.games[g].state()
        return encode(raw, self.single_observation_space, state)

    def _observations(self) -> np.ndarray:
        out = []
        for g, env in enumerate(self.games):
            # One state() per game, not per slot: MPE recomputes every agent's observation.
            state = env.state() if self.single_observation_space.state else None
            out += [self._slot_obs(g, a, state) for a in self.slots]
        return np.stack(out)

    def reset(
        self, *, seed: int | None = None, options: Any = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.seed = seed
        for g in range(len(self.games)):
            self._start(g)
        return self._observations(), {}

    def _fixed_actions(self, live: list[int]) -> list[dict[str, int]]:
        """The random/scripted agents' actions of the live games, batched per player."""
        out: list[dict[str, int]] = [{} for _ in self.games]
        by_player: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for g in live:
            for a in self.games[g].agents:
                if self.mapping[a] != "main":
                    by_player[self.mapping[a]].append((g, a))
        for name, seats in by_player.items():
            obs = np.stack([self._slot_obs(g, a) for g, a in seats])
            for (g, a), action in zip(seats, self._opponents().act(name, obs), strict=True):
                out[g][a] = int(action)
        return out

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        L = len(self.slots)
        rewards = np.zeros(self.num_envs, np.float32)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        live = [g for g in range(len(self.games)) if not self.over[g]]
        fixed = self._fixed_actions(live)
        for g in range(len(self.games)):
            if self.over[g]:
                self.episodes[g] += 1
                self._start(g)
                continue
            env = self.games[g]
            acts = {a: int(actions[g * L + i]) for i, a in enumerate(self.slots) if a in env.agents}
            acts.update(fixed[g])
            obs, rew, term, trunc, _ = env.step(acts)
            self.last_obs[g].update(obs)
            for i, a in enumerate(self.slots):
                rewards[g * L + i] = float(rew.get(a, 0.0))
                terminated[g * L + i] = bool(term.get(a, False))
                truncated[g * L + i] = bool(trunc.get(a, False))
            done = [bool(term.get(a, False) or trunc.get(a, False)) for a in self.slots]
            if any(done) and not all(done):
                raise MultiAgentEnvError(
                    "agents of a parallel env finished at different steps; zrl's slots need "
                    "them to end together"
                )
            if all(done) or not env.agents:
                self.over[g] = True
        return self._observations(), rewards, terminated, truncated, {}


def make_multiagent_vector_env(
    env_id: str,
    kwargs: dict[str, Any],
    cfg: MultiAgentConfig,
    num_games: int,
) -> MultiAgentVectorEnv:
    """``num_games`` games of ``env_id`` as one vector env of the learning policy's slots.
    Its ``opponents``, set once it exists, play the other agents (until then random legal
    moves, enough for probes and tests)."""
    module = env_module(env_id)
    parallel = uses_parallel_api(cfg, module)
    factory = module.parallel_env if parallel else module.env

    def make() -> Any:
        try:
            return factory(**kwargs)
        except TypeError as exc:
            raise MultiAgentEnvError(
                f"cannot make {env_id} with env.kwargs {kwargs}: {exc}"
            ) from None

    cls = ParallelVectorEnv if parallel else TurnBasedVectorEnv
    return cls(make, num_games, cfg, board_game(env_name(env_id)))


def fixed_opponents(env: MultiAgentVectorEnv, opponent: str, seed: int) -> FixedOpponents:
    """Random and scripted players for ``env``'s games, ``opponent`` in every episode."""
    return FixedOpponents(opponent, env.single_observation_space, env.num_actions, env.board, seed)
