"""The ``sac:`` section of an experiment config (SAC).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class SACConfig(Section):
    """Soft actor-critic (Haarnoja et al. 2018) with the automatic entropy temperature.

    Uniform or prioritized replay (``replay.table``); n-step, gamma and the batch size come
    from ``replay:``."""

    actor_lr: float = Field(1e-3, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    alpha_lr: float = Field(1e-3, gt=0)
    """Learning rate of log(alpha)."""
    tau: float = Field(0.005, gt=0, le=1)
    """Polyak rate of the target critics."""
    init_alpha: float = Field(1.0, gt=0)
    """Initial temperature (SB3's ent_coef 'auto' starts at 1)."""
    target_entropy: float | None = None
    """Entropy the temperature steers the policy towards; null: -act_dim."""
    fixed_alpha: float | None = Field(None, ge=0)
    """A constant temperature instead of the automatic one."""
    warmup_steps: int = Field(1000, ge=0)
    """Env steps (per actor, over all its envs) of uniform random actions before the policy acts."""


KEY_ALIASES: dict[str, str] = other_names(
    lr="sac.actor_lr or sac.critic_lr",
    n_step="replay.n_step",
    batch_size="replay.batch_size",
    entropy_coef="sac.fixed_alpha",
)
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""


SHARED_KEY_ALIASES: dict[str, str] = {
    "q_lr": "sac.critic_lr",
    "policy_lr": "sac.actor_lr",
    "autotune": "sac.fixed_alpha",
    "target_entropy": "sac.target_entropy",
}
"""Other libraries' names for keys of its own section, suggested whichever algorithm runs
where that one has no name of its own for the key (``zrl.config.help``)."""
