"""Your own actor-critic: PPO on CartPole with a shared torso and two heads.

    zrl run examples/custom_actor_critic.py
    python examples/custom_actor_critic.py      # the same

The same module works for impala, appo and a3c (swap the config). What zrl calls:

- ``forward(obs) -> (logits [B, A], value [B])``: the learners (PPO's minibatches, the
  IMPALA/APPO unrolls, A3C's workers). ``obs`` is ``[B, *obs_shape]`` as the env gives it.
- ``value(obs) -> [B]``: required by PPO (the round's old values and bootstrap values) and A3C.
- ``act(obs, deterministic) -> actions [B]``: optional; the evaluator's greedy play calls
  ``act(obs, deterministic=True)`` where present, else takes the argmax of the logits.
- ``policy_logits(obs) -> [B, A]``: optional; actors use it where present (skipping the
  value head), else ``forward(obs)[0]``.

Don't name methods ``initial_state``/``step``/``unroll``: a model with all three is
treated as recurrent.
"""

import gymnasium as gym
import torch
from torch import nn

import zrl


class SharedActorCritic(nn.Module):
    """One torso feeding a policy head and a value head."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Discrete):
        super().__init__()
        obs_dim = int(observation_space.shape[0])
        self.torso = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.logits_head = nn.Linear(64, int(action_space.n))
        self.value_head = nn.Linear(64, 1)
        nn.init.orthogonal_(self.logits_head.weight, 0.01)  # a near-uniform first policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(obs.float())
        return self.logits_head(x), self.value_head(x)[:, 0]

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.torso(obs.float()))[:, 0]

    def policy_logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.logits_head(self.torso(obs.float()))

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        logits = self.policy_logits(obs)
        if deterministic:
            return logits.argmax(dim=1)
        return torch.distributions.Categorical(logits=logits).sample()


experiment = zrl.Experiment(
    "../configs/cartpole_ppo.yaml",
    model=SharedActorCritic,
    overrides=["name=custom_actor_critic"],
)

if __name__ == "__main__":
    experiment.run()
