"""Ape-X's spread of exploration (Horgan et al. 2018): the per-slot rates
(:func:`apex_epsilons`: Ape-X DQN's and R2D2's epsilons, Ape-X DDPG's noise scales) and the
epsilon-greedy actor policy of the algorithms that act on Q-values (:class:`EpsilonGreedyPolicy`:
Ape-X DQN, R2D2)."""

from __future__ import annotations

import numpy as np

from zrl.algos.api.actor import ActorSetup, BasePolicy


def apex_epsilons(num: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Per-actor exploration rates of Ape-X (Horgan et al. 2018).

    ``eps_i = base ** (1 + alpha * i / (num - 1))`` for ``i = 0..num-1``, so actor 0 explores
    most (``base``) and the last least (``base ** (1 + alpha)``); ``num == 1`` gives ``[base]``.
    """
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
        raise ValueError(f"num must be an integer >= 1, got num={num!r}")
    if num == 1:
        return np.array([base], dtype=np.float64)
    exponents = 1.0 + alpha * np.arange(num, dtype=np.float64) / (num - 1)
    return np.power(base, exponents)


class EpsilonGreedyPolicy(BasePolicy):
    """Ape-X's exploration for the policies that act on Q-values (Ape-X DQN, R2D2): the
    epsilons of this actor's env slots, and each trajectory's exploration coins and random
    actions, drawn at once in ``begin``."""

    action_dtype = np.int64
    action_shape: tuple[int, ...] = ()

    def __init__(self, setup: ActorSetup) -> None:
        cfg = setup.config
        self.rng = setup.rng
        self.num_actions = int(setup.action_space.n)
        E = setup.num_envs
        slots = max(cfg.roles.count("actors"), setup.actor_index + 1) * E
        all_eps = apex_epsilons(slots, cfg.actor.epsilon, cfg.actor.epsilon_alpha)
        first = setup.actor_index * E
        self.epsilons = all_eps[first : first + E].astype(np.float32)
        self.explore = np.zeros((0, E), bool)
        self.random_actions = np.zeros((0, E), np.int64)

    def begin(self, steps: int, env_steps: int) -> None:
        # The exploration coins and random actions of the whole trajectory, in two draws.
        self.explore = self.rng.random((steps, len(self.epsilons))) < self.epsilons
        self.random_actions = self.rng.integers(0, self.num_actions, size=self.explore.shape)

    def epsilon_greedy(self, q: np.ndarray, t: int, rows: slice | None = None) -> np.ndarray:
        """Step ``t``'s actions for Q-values ``q`` of the envs ``rows`` (all by default)."""
        rows = slice(None) if rows is None else rows
        return np.where(self.explore[t, rows], self.random_actions[t, rows], q.argmax(axis=1))

    def train_info(self) -> dict[str, float]:
        """The smallest and largest epsilon of this actor's env slots."""
        return {
            "epsilon_min": float(self.epsilons.min()),
            "epsilon_max": float(self.epsilons.max()),
        }
