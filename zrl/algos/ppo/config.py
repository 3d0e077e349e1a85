"""The ``ppo:`` section of an experiment config (PPO).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class PPOConfig(Section):
    """PPO (Schulman et al. 2017) over rounds of rollouts, optionally DD-PPO across learners."""

    mode: Literal["sync", "async"] = "sync"
    """sync: every rollout of a round was collected with the weights version the round trains;
    actors wait for each new version. async: actors keep collecting, rollouts up to max_lag
    versions old are used, older ones dropped and counted."""
    max_lag: int = Field(1, ge=0)
    """async only: the oldest usable rollout, in weights versions behind the learner."""
    gamma: float = Field(0.98, ge=0, le=1)
    gae_lambda: float = Field(0.8, ge=0, le=1)
    clip: float = Field(0.2, gt=0)
    value_clip: float | None = Field(None, gt=0)
    """PPO2 value clipping range; null disables it."""
    epochs: int = Field(20, ge=1)
    minibatch_size: int = Field(256, ge=1)
    """Samples per gradient step, split evenly across the learners (DD-PPO)."""
    entropy_coef: float = Field(0.0, ge=0)
    value_coef: float = Field(0.5, ge=0)
    normalize_advantages: bool = True
    normalize_returns: bool = False
    """The value head learns the GAE returns normalized by their running mean and std
    (``zrl.algos.kernel.value_normalizer``; checkpointed with the learner), denormalized for
    GAE: one value-loss scale whatever the rewards (MuJoCo's, Pendulum's). CleanRL scales the
    rewards by the running std of the discounted return instead; both keep the critic's
    targets near unit scale."""
    round_timeout: float = Field(30.0, gt=0)
    """Seconds a learner waits for a full round (one rollout per actor) before training on
    the rollouts it has (a dead actor must not stop training); counted as short rounds."""


PBT_HYPERPARAMETERS = ("learner.lr", "ppo.entropy_coef")
"""What population-based training may change for PPO: the values its learner sets on a live
optimizer and loss (``PPOUpdate.set_hyperparameters``)."""

KEY_ALIASES: dict[str, str] = other_names(
    lr="learner.lr",
    rollout="actor.trajectory_length",
    batch_size="ppo.minibatch_size",
    minibatches="ppo.minibatch_size",
)
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""
