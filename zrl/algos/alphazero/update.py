"""The AlphaZero learner: a window of the newest self-play samples, sampled uniformly, and
the policy-value loss (``losses``).

Every ``search_samples`` message from the actors (topic ``rollouts/``) is validated here:
its schema (``zrl.transport.messages.SEARCH_SAMPLES``) for this env's widths, then each
row's visit distribution (non-negative, summing to 1, nothing on an illegal move of its
observation) and outcome (in [-1, 1]). The learner trains at most ``received * reuse /
batch_size`` updates, so it follows self-play instead of overfitting the first games.
With ``mirror`` each sampled position may be trained on as its left-right mirror.
The window is checkpointed with the weights: a resumed learner trains on the games it had.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from zrl.algos.alphazero.config import AlphaZeroConfig
from zrl.algos.alphazero.losses import policy_value_loss
from zrl.algos.alphazero.policy import board_game_of
from zrl.algos.alphazero.search import mirror_indices
from zrl.algos.api.learner import BaseUpdate, LearnerSetup, UpdateResult
from zrl.algos.kernel.optim import checked_step, make_adam
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import validate

SUM_TOLERANCE = 1e-3


class SampleWindow:
    """The newest ``capacity`` samples (observation, visit distribution, outcome)."""

    def __init__(self, capacity: int, obs_dim: int, num_actions: int) -> None:
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.policy = np.zeros((capacity, num_actions), np.float32)
        self.value = np.zeros(capacity, np.float32)
        self.capacity = capacity
        self.size = 0
        self.next = 0

    def add(self, obs: np.ndarray, policy: np.ndarray, value: np.ndarray) -> None:
        for start in range(0, len(obs), self.capacity):
            o, p, v = (a[start : start + self.capacity] for a in (obs, policy, value))
            idx = (self.next + np.arange(len(o))) % self.capacity
            self.obs[idx], self.policy[idx], self.value[idx] = o, p, v
            self.next = int((self.next + len(o)) % self.capacity)
            self.size = min(self.capacity, self.size + len(o))

    def ordered(self) -> tuple[np.ndarray, ...]:
        """The samples held, oldest first."""
        order = (self.next - self.size + np.arange(self.size)) % self.capacity
        return self.obs[order], self.policy[order], self.value[order]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        idx = rng.integers(0, self.size, n)
        return self.obs[idx], self.policy[idx], self.value[idx]


class AlphaZeroUpdate(BaseUpdate):
    def __init__(self, setup: LearnerSetup) -> None:
        cfg = setup.config
        self.c = c = cfg.section(AlphaZeroConfig)
        self.model = setup.model
        self.device = torch.device(setup.device)
        space = setup.observation_space
        self.obs_dim = int(np.prod(space.shape))
        self.num_actions = int(setup.action_space.n)
        self.features = int(getattr(space, "features", 0))
        self.has_mask = int(getattr(space, "mask", 0)) == self.num_actions
        self.window = SampleWindow(c.window, self.obs_dim, self.num_actions)
        self.mirror: tuple[np.ndarray, np.ndarray] | None = None
        if c.mirror:
            self.mirror = mirror_indices(board_game_of(cfg.env.id))
            if len(self.mirror[0]) != self.obs_dim or len(self.mirror[1]) != self.num_actions:
                raise ValueError(
                    f"alphazero.mirror: the observation ({self.obs_dim}) and actions "
                    f"({self.num_actions}) are not the board's; set alphazero.mirror: false"
                )
        self.optimizer = make_adam(
            self.model.parameters(), cfg.learner.lr, cfg.learner.adam_eps, c.weight_decay
        )
        self.grad_clip = cfg.learner.grad_clip
        self.rng = np.random.default_rng(cfg.seed + 17 * setup.index)
        self.received = 0
        self.counted = 0
        """Samples received that an update's ``samples`` has counted (each once)."""
        self.updates = 0
        self.last_parts: dict[str, float] = {}

    def receive(self, msg: P.Message, version: int) -> None:
        validate(msg, M.SEARCH_SAMPLES, O=self.obs_dim, A=self.num_actions)
        obs, policy, value = (msg.arrays[k] for k in ("obs", "policy", "value"))
        if len(value) == 0:
            return
        if (policy < 0).any() or (np.abs(policy.sum(axis=1) - 1.0) > SUM_TOLERANCE).any():
            raise P.ProtocolError("search_samples: a visit distribution is not a distribution")
        if self.has_mask:
            legal = obs[:, self.features : self.features + self.num_actions] > 0.5
            if (policy[~legal] > 0).any():
                raise P.ProtocolError("search_samples: visits on an illegal move")
        if (np.abs(value) > 1.0).any():
            raise P.ProtocolError("search_samples: an outcome outside [-1, 1]")
        self.window.add(obs, policy, value)
        self.received += len(value)

    def allowed_updates(self) -> int:
        """Updates the samples received so far allow (``reuse``), none before ``min_samples``."""
        if self.window.size < min(self.c.min_samples, self.window.capacity):
            return 0
        return int(self.received * self.c.reuse / self.c.batch_size)

    def train(self, version: int) -> UpdateResult | None:
        if self.updates >= self.allowed_updates():
            return None
        obs, policy, value = (
            torch.from_numpy(a).to(self.device) for a in self.sampled(self.c.batch_size)
        )
        logits, predicted = self.model(obs)
        loss, policy_loss, value_loss = policy_value_loss(
            logits, predicted, policy, value, self.c.value_coef
        )
        checked_step(self.optimizer, loss, list(self.model.parameters()), self.grad_clip)
        self.updates += 1
        self.last_parts = {
            "policy_loss": float(policy_loss.detach()),
            "value_loss": float(value_loss.detach()),
        }
        new, self.counted = self.received - self.counted, self.received
        return UpdateResult(updates=1, loss=float(loss.detach()), samples=new)

    def sampled(self, n: int) -> tuple[np.ndarray, ...]:
        """``n`` samples of the window, uniformly; with ``mirror`` each one mirrored or not
        at random."""
        obs, policy, value = self.window.sample(n, self.rng)
        if self.mirror is not None:
            flip = self.rng.random(n) < 0.5
            obs_index, action_index = self.mirror
            obs[flip] = obs[flip][:, obs_index]
            policy[flip] = policy[flip][:, action_index]
        return obs, policy, value

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "received": self.received,
            # The window too: a resumed learner trains on the games it had, not on the first
            # few new ones (at most window x (observation + actions + 1) floats).
            "window": {
                k: torch.from_numpy(a.copy())
                for k, a in zip(("obs", "policy", "value"), self.window.ordered(), strict=True)
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.received = self.counted = int(state["received"])
        saved = state.get("window")
        if isinstance(saved, dict):
            arrays = [np.asarray(saved[k], np.float32) for k in ("obs", "policy", "value")]
            if arrays[0].shape[1:] != (self.obs_dim,) or arrays[1].shape[1:] != (self.num_actions,):
                raise ValueError(
                    f"the checkpoint's window holds {arrays[0].shape} observations and "
                    f"{arrays[1].shape} visit distributions, not this env's"
                )
            self.window = SampleWindow(self.c.window, self.obs_dim, self.num_actions)
            self.window.add(*(a[-self.c.window :] for a in arrays))

    def train_info(self) -> dict[str, float]:
        return dict(self.last_parts)

    def heartbeat_info(self) -> dict[str, Any]:
        return {"samples_received": self.received, "window": self.window.size}

    def summary(self) -> str:
        return f"{self.updates} updates on {self.received} self-play samples"
