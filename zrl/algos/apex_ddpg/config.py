"""The ``ddpg:`` section of an experiment config (Ape-X DDPG).

Pydantic only (no torch, no numpy): the package's ``ALGORITHM`` names it (``Algorithm.config``),
so ``zrl.config.experiment`` validates it, and the CLI stays fast.
"""

from __future__ import annotations

from pydantic import Field

from zrl.config.base import Section
from zrl.config.help import other_names


class DDPGConfig(Section):
    """Ape-X DDPG (Horgan et al. 2018), with TD3's tricks (Fujimoto et al. 2018) as options.

    n-step, gamma, batch size and the replay table come from ``replay:``; ``learner.grad_clip``
    and ``learner.publish_interval`` apply as for DQN."""

    noise_sigma: float = Field(0.3, ge=0)
    """Largest std of the actors' Gaussian exploration noise, as a fraction of the action
    half-range ``(high - low) / 2``. Env slot k of all N = actors x envs slots uses the Ape-X
    spread ``noise_sigma ** (1 + noise_alpha * k / (N - 1))`` (as ``actor.epsilon``), so some
    slots explore widely and others stay close to the deterministic policy."""
    noise_alpha: float = Field(2.0, ge=0)
    """Spread exponent of the per-slot noise (0: every slot uses noise_sigma)."""
    twin: bool = False
    """TD3 clipped double-Q: a second critic, targets use min(Q'1, Q'2)."""
    target_noise: float = Field(0.0, ge=0)
    """TD3 target policy smoothing: std of the noise added to mu'(s'), as a fraction of the
    half-range (TD3 uses 0.2); 0 disables it."""
    target_noise_clip: float = Field(0.5, ge=0)
    """The smoothing noise is clipped to +- this fraction of the half-range."""
    policy_delay: int = Field(1, ge=1)
    """Update the actor and the targets every this many critic updates (TD3 uses 2)."""
    tau: float = Field(0.005, gt=0, le=1)
    """Polyak rate of the target networks (1 = hard copy every update)."""
    actor_lr: float = Field(1e-3, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    huber_delta: float | None = Field(None, gt=0)
    """Huber loss of the critics with this delta; null: squared error."""
    warmup_steps: int = Field(1000, ge=0)
    """Env steps (per actor, over all its envs) of uniform random actions before the policy acts."""


KEY_ALIASES: dict[str, str] = {
    **other_names(
        lr="ddpg.actor_lr or ddpg.critic_lr",
        n_step="replay.n_step",
        batch_size="replay.batch_size",
        epsilon="ddpg.noise_sigma",
    ),
    "q_lr": "ddpg.critic_lr",
    "policy_lr": "ddpg.actor_lr",
}
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""


SHARED_KEY_ALIASES: dict[str, str] = {
    **other_names(tau="ddpg.tau"),
    "exploration_noise": "ddpg.noise_sigma",
    "action_noise": "ddpg.noise_sigma",
    "policy_delay": "ddpg.policy_delay",
    "policy_frequency": "ddpg.policy_delay",
    "target_policy_noise": "ddpg.target_noise",
    "policy_noise": "ddpg.target_noise",
    "target_noise_clip": "ddpg.target_noise_clip",
    "noise_clip": "ddpg.target_noise_clip",
}
"""Other libraries' names for keys of its own section, suggested whichever algorithm runs
where that one has no name of its own for the key (``zrl.config.help``)."""
