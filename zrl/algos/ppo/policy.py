"""The PPO actor policy: the categorical policy, collecting only as far as the round allows.

``ppo.mode: sync``: one rollout per weights version, then the actor waits for the next one,
so a round never mixes versions. ``async``: up to ``ppo.max_lag + 1`` rollouts per version.
Version 0 is the actor's own initialisation, never the learner's weights: it waits for 1.

:func:`make_policy` (the algorithm's ``policy``) builds :class:`PPOPolicy` for a feed-forward
model and :class:`RecurrentPPOPolicy` for a recurrent one (``model.core``), which carries each
env's state and sends ``recurrent_unroll`` rollouts. The feed-forward policy's rollouts of
frame stacks are ``frame_unroll``s, each frame once (``zrl.algos.kernel.sampling``). On a Box action
space it builds :class:`GaussianPPOPolicy` (``continuous_unroll`` rollouts).
"""

from __future__ import annotations

import gymnasium as gym

from zrl.algos.api.actor import ActorSetup, Outgoing, Trajectory
from zrl.algos.kernel.sampling import CategoricalPolicy, GaussianPolicy, RecurrentCategoricalPolicy
from zrl.algos.ppo.config import PPOConfig
from zrl.nets.recurrent import is_recurrent

KEEP_VERSIONS = 8  # per-version counts kept for the versions this far behind the newest


class Rounds:
    """What PPO adds to a sampling policy: collect only as far as the round allows."""

    def init_rounds(self, setup: ActorSetup) -> None:
        c = setup.config.section(PPOConfig)
        self.allowed = 1 if c.mode == "sync" else c.max_lag + 1
        self.sent_per_version: dict[int, int] = {}

    def may_collect(self, weights_version: int) -> bool:
        return weights_version > 0 and self.sent_per_version.get(weights_version, 0) < self.allowed

    def sent(self, weights_version: int) -> None:
        count = self.sent_per_version
        count[weights_version] = count.get(weights_version, 0) + 1
        for old in [v for v in count if v < weights_version - KEEP_VERSIONS]:
            del count[old]


class PPOPolicy(Rounds, CategoricalPolicy):
    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        self.init_rounds(setup)

    def finish(self, trajectory: Trajectory) -> Outgoing:
        """The unroll, with the turn passes of a game played from both seats (``turn_unroll``:
        ``env.multiagent.self_play_seats: both``, recorded by the actor from the env)."""
        out = super().finish(trajectory)
        passes = trajectory.extras.get("passes")
        if passes is not None:
            out.arrays["passes"] = passes
        return out


class RecurrentPPOPolicy(PPOPolicy, RecurrentCategoricalPolicy):
    """PPO's rounds over the recurrent categorical policy (its state, resets and rollouts)."""

    frame_unrolls = False  # its learners take recurrent_unroll rollouts, full stacks


class GaussianPPOPolicy(Rounds, GaussianPolicy):
    """PPO's rounds over the Gaussian policy of a Box action space (``continuous_unroll``
    rollouts)."""

    def __init__(self, setup: ActorSetup) -> None:
        super().__init__(setup)
        self.init_rounds(setup)


def make_policy(setup: ActorSetup) -> PPOPolicy | GaussianPPOPolicy:
    """The PPO policy for the actor's model and action space: Gaussian for a Box, else
    categorical, recurrent when the model carries a state."""
    if isinstance(setup.action_space, gym.spaces.Box):
        return GaussianPPOPolicy(setup)
    if is_recurrent(setup.model):
        return RecurrentPPOPolicy(setup)
    return PPOPolicy(setup)
