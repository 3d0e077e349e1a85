"""Recurrent policies driven without an env: the spaces and sizes, ``ScriptedActor`` (the actor
role's resets around a recurrent policy, on scripted episode ends) and ``step_by_step`` (the
actor's computation redone one step at a time). Shared by ``tests/algos/test_recurrent_ppo.py``
and ``test_recurrent_unrolls.py``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from zrl.algos.api.actor import Trajectory
from zrl.algos.ppo.policy import RecurrentPPOPolicy
from zrl.nets.recurrent import RecurrentActorCritic
from zrl.transport import protocol as P

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)  # CartPoleNoVel's
ACT_SPACE = gym.spaces.Discrete(2)
E, T = 3, 8  # env.num_envs, actor.trajectory_length
CORE = 16


class ScriptedActor:
    """What the actor role does around its policy, on scripted episode ends (no env): the
    NEXT_STEP autoreset validity, and ``episodes_started`` after each reset-only step."""

    def __init__(self, policy: RecurrentPPOPolicy, seed: int = 0) -> None:
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.needs_reset = np.zeros(E, bool)
        self.obs = self.rng.normal(size=(E, 2)).astype(np.float32)

    def collect(self, done_at: dict[int, list[int]], version: int = 1) -> P.Message:
        """One trajectory; env ``e`` ends an episode (terminated) at the steps ``done_at[e]``."""
        p = self.policy
        p.begin(T, 0)
        obs = np.empty((T, E, 2), np.float32)
        action, logp, first = np.empty((T, E), np.int64), np.empty((T, E)), np.empty((T, E), bool)
        term = np.zeros((T, E), bool)
        first_needs_reset = self.needs_reset
        for t in range(T):
            obs[t] = self.obs
            action[t], extras = p.act(self.obs, t)
            logp[t], first[t] = extras["logp"], extras["first"]
            for e, steps in done_at.items():
                term[t, e] = t in steps
            self.obs = self.rng.normal(size=(E, 2)).astype(np.float32)
            reset = first_needs_reset if t == 0 else term[t - 1]
            if reset.any():
                p.episodes_started(np.flatnonzero(reset))
        self.needs_reset = term[-1].copy()
        valid = np.empty((E, T), bool)
        valid[:, 0] = ~first_needs_reset
        valid[:, 1:] = ~term.T[:, :-1]
        reward = np.where(valid, 1.0, 0.0).astype(np.float32)
        trajectory = Trajectory(
            obs=obs.swapaxes(0, 1).copy(),
            next_obs=None,
            action=action.T.copy(),
            reward=reward,
            terminated=term.T.copy(),
            truncated=np.zeros((E, T), bool),
            valid=valid,
            final_obs=self.obs.copy(),
            extras={"logp": logp.T.astype(np.float32), "first": first.T.copy()},
        )
        out = p.finish(trajectory)
        meta = {"weights_version": version, "actor": 0, "env_steps": int(valid.sum())}
        return P.Message(out.kind, meta=meta, arrays=out.arrays, sender="actor-0")


def step_by_step(
    model: RecurrentActorCritic, a: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """The actor's computation redone one step at a time from the rollout's state and resets:
    log-probs of the taken actions ``[E, T]``, values ``[E, T]``, the state after the last step."""
    state = torch.from_numpy(a["state"])
    logps, values = [], []
    with torch.no_grad():
        for t in range(T):
            state = state * torch.from_numpy(~a["first"][:, t, None])
            logits, value, state = model.step(torch.from_numpy(a["obs"][:, t]), state)
            logp = torch.log_softmax(logits, -1).gather(
                1, torch.from_numpy(a["action"][:, t, None])
            )
            logps.append(logp[:, 0].numpy())
            values.append(value.numpy())
    return np.stack(logps, 1), np.stack(values, 1), state
