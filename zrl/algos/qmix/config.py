"""The ``qmix:`` section of an experiment config (QMIX).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from zrl.config.base import Section


class QMIXConfig(Section):
    """QMIX (Rashid et al. 2018): the mixing network, the targets and the agents' exploration.

    The discount and the n-step returns are the replay shard's (``replay.gamma``,
    ``replay.n_step``: it assembles the team's n-step transitions); the optimizer, the
    gradient clip and the batch size are ``learner.lr``, ``learner.grad_clip`` and
    ``replay.batch_size``."""

    mixer_embed: int = Field(32, ge=1, le=4096)
    """Width of the mixing network's hidden layer (the paper's 32)."""
    hypernet_hidden: int = Field(64, ge=1, le=4096)
    """Width of the hidden layer of the hypernetworks that give the mixing weights from the
    state (pymarl's ``hypernet_embed``)."""
    double: bool = True
    """Pick each agent's next action with the online agent network and value it with the
    target one (double Q-learning); false: the target network's max."""
    target_update_interval: int = Field(200, ge=1)
    """Learner updates between hard copies of the agent network and the mixer to the targets."""
    epsilon_start: float = Field(1.0, ge=0, le=1)
    """Each agent's exploration rate at an actor's first env step."""
    epsilon_end: float = Field(0.05, ge=0, le=1)
    """The rate it decays to, linearly, and keeps."""
    epsilon_steps: int = Field(50_000, ge=1)
    """Env steps of one actor (agent slots, valid steps) over which epsilon decays."""
    sequence_length: int = Field(20, ge=1)
    """With ``model.core`` (a recurrent agent network): steps per team sequence the actors
    cut, as R2D2's (``r2d2.sequence_length``); sequences start every sequence_length -
    burn_in steps of a game and never cross its end. Unused without ``model.core``."""
    burn_in: int = Field(5, ge=0)
    """With ``model.core``: leading steps of each sequence that only warm the agents' stored
    states up (no loss, no gradient), as ``r2d2.burn_in``."""

    @model_validator(mode="after")
    def _decays(self) -> QMIXConfig:
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(
                f"qmix.epsilon_end ({self.epsilon_end}) must be <= qmix.epsilon_start "
                f"({self.epsilon_start})"
            )
        if self.burn_in >= self.sequence_length:
            raise ValueError(
                f"qmix.burn_in ({self.burn_in}) must be less than qmix.sequence_length "
                f"({self.sequence_length})"
            )
        return self
