"""The ``alphazero:`` section of an experiment config (AlphaZero).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.config.base import Section


class AlphaZeroConfig(Section):
    """AlphaZero (Silver et al. 2018): self-play with PUCT search, a policy-value network."""

    simulations: int = Field(50, ge=1, le=10_000)
    """Search simulations per self-play move (each one model forward for all of an actor's
    games at once)."""
    c_puct: float = Field(1.5, gt=0)
    """The exploration constant of PUCT: ``U = c_puct P sqrt(sum N) / (1 + N)``."""
    dirichlet_alpha: float = Field(0.3, gt=0)
    """Concentration of the Dirichlet noise added to the root priors in self-play (AlphaZero:
    0.3 for chess, 0.03 for go; about 10 over the typical number of legal moves)."""
    noise_fraction: float = Field(0.25, ge=0, le=1)
    """The noise's share of the root priors in self-play (0: none)."""
    temperature_moves: int = Field(4, ge=0)
    """Moves of each game played by sampling the visit counts (temperature 1); later moves
    take the most visited move."""
    random_opening_moves: int = Field(0, ge=0)
    """Moves at the start of each game played uniformly at random among the legal moves
    (searched all the same: their samples carry the search's visit counts). Self-play alone
    rarely plays a weak opening, and a best response probes exactly those: the second mover
    must learn to answer every one."""
    window: int = Field(20_000, ge=1)
    """Samples the learner keeps (its replay window: the newest, sampled uniformly)."""
    min_samples: int = Field(512, ge=1)
    """Samples the learner waits for before its first update."""
    batch_size: int = Field(256, ge=1)
    reuse: float = Field(4.0, gt=0)
    """How often each received sample is trained on, on average: the learner takes at most
    ``received * reuse / batch_size`` updates, so it never outruns self-play."""
    mirror: bool = True
    """Train on each sampled position or its left-right mirror, at random (the game is
    symmetric: the mirrored position has the mirrored visit distribution and the same
    outcome), which doubles the samples self-play pays for."""
    value_coef: float = Field(1.0, ge=0)
    """Weight of the value loss (mean squared error to the game's outcome)."""
    weight_decay: float = Field(1e-4, ge=0)
    """L2 weight decay of the optimizer (Adam's ``weight_decay``)."""
    eval_simulations: int = Field(50, ge=0, le=10_000)
    """Simulations per move of the search player the evaluator plays beside the greedy
    policy (no root noise, the most visited move); 0: the greedy policy only."""
