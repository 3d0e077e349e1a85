"""Recurrent networks: an LSTM or GRU core after any encoder (``model.core``).

A recurrent model's state is one float32 tensor ``[B, S]`` per batch of envs (``S`` =
``state_size``: h and c side by side for an LSTM, h for a GRU), so actors record it, messages
carry it and replay stores it as a plain array. Every recurrent model has:

- ``initial_state(batch)``: zeros, the state at an episode's first step;
- ``step(obs [B, *O], state)``: one step, for actors and the evaluator;
- ``unroll(obs [B, T, *O], state, first [B, T])``: T steps from a recorded state, the state
  zeroed before every step whose ``first`` is True (an episode starts there), for learners.

``unroll`` and T calls of ``step`` (with the same resets) give the same outputs: the learner
replays exactly what the actor computed while the weights are unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from zrl.config.sections import ModelConfig
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.discrete import (
    ActorCritic,
    AgentActorCritic,
    build_actor_critic,
    check_discrete_spaces,
)
from zrl.nets.encoders import MLPEncoder, build_encoder, resolve_encoder

CoreKind = Literal["lstm", "gru"]


class RecurrentCore(nn.Module):
    """An LSTM or GRU over encoder features, its state flat as ``[B, S]``.

    ``unroll`` runs torch's fused ``nn.LSTM``/``nn.GRU`` over the stretches of time between
    resets (2-3x faster on a CPU than a Python loop of cells); a reset position of any row
    starts a new stretch, where the rows that reset are zeroed."""

    def __init__(self, kind: CoreKind, in_features: int, size: int) -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"model.core must be lstm or gru, got {kind!r}")
        if size < 1 or in_features < 1:
            raise ValueError(f"core sizes must be >= 1, got in={in_features}, size={size}")
        self.kind = kind
        self.size = size
        self.rnn: nn.LSTM | nn.GRU = (
            nn.LSTM(in_features, size, batch_first=True)
            if kind == "lstm"
            else nn.GRU(in_features, size, batch_first=True)
        )
        self.state_size = 2 * size if kind == "lstm" else size

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> Tensor:
        return torch.zeros(batch, self.state_size, device=device)

    def run(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Features ``[B, T, F]`` from ``state`` without resets -> (outputs, next state)."""
        if isinstance(self.rnn, nn.LSTM):
            h0 = state[:, : self.size].unsqueeze(0).contiguous()
            c0 = state[:, self.size :].unsqueeze(0).contiguous()
            out, (h, c) = self.rnn(x, (h0, c0))
            return out, torch.cat((h[0], c[0]), dim=1)
        out, h = self.rnn(x, state.unsqueeze(0).contiguous())
        return out, h[0]

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Features ``[B, F]`` and state ``[B, S]`` -> (output ``[B, size]``, next state)."""
        out, state = self.run(x.unsqueeze(1), state)
        return out[:, 0], state

    def unroll(self, x: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        """Features ``[B, T, F]`` from ``state`` with resets where ``first [B, T]`` ->
        (outputs ``[B, T, size]``, the state after the last step)."""
        T = x.shape[1]
        cuts = torch.nonzero(first[:, 1:].any(dim=0)).flatten().add(1).tolist()
        outputs = []
        for a, b in zip([0, *cuts], [*cuts, T], strict=True):
            keep = (~first[:, a]).to(x.dtype).unsqueeze(-1)
            out, state = self.run(x[:, a:b], state * keep)
            outputs.append(out)
        return torch.cat(outputs, dim=1), state


def _torso(
    observation_space: gym.spaces.Space, cfg: ModelConfig, activation: str
) -> tuple[nn.Module, tuple[int, ...], int]:
    """The encoder before the core: the configured CNN for images, the ``hidden`` MLP (or
    nothing, for ``hidden: []``) for vectors; with its observation shape and width."""
    shape = tuple(observation_space.shape or ())
    if resolve_encoder(cfg.encoder, shape) != "mlp":
        encoder: Any = build_encoder(cfg.encoder, observation_space, cfg.hidden, activation)
        return encoder, tuple(encoder.obs_shape), int(encoder.out_features)
    obs_dim = math.prod(shape)
    if not cfg.hidden:
        return nn.Flatten(), (obs_dim,), obs_dim
    mlp = MLPEncoder((obs_dim,), cfg.hidden, activation)
    return mlp, (obs_dim,), mlp.out_features


class _Recurrent(nn.Module):
    """Encoder -> core; subclasses add heads over the core's output."""

    def __init__(self, torso: nn.Module, obs_shape: tuple[int, ...], core: RecurrentCore) -> None:
        super().__init__()
        self.torso = torso
        self.core = core
        self.obs_shape = obs_shape
        self.obs_dim = math.prod(obs_shape)
        self.state_size = core.state_size

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> Tensor:
        return self.core.initial_state(batch, device)

    def features(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return self.core.step(self.torso(obs), state)

    def unrolled_features(self, obs: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        B, T = obs.shape[:2]
        x = self.torso(obs.reshape(B * T, *obs.shape[2:]))
        out, state = self.core.unroll(x.reshape(B, T, -1), state, first)
        return out, state


class RecurrentQNetwork(_Recurrent):
    """R2D2's network: encoder, LSTM/GRU core, dueling (or plain) Q head."""

    def __init__(
        self,
        torso: nn.Module,
        obs_shape: tuple[int, ...],
        core: RecurrentCore,
        num_actions: int,
        dueling: bool = True,
    ) -> None:
        super().__init__(torso, obs_shape, core)
        self.num_actions = num_actions
        self.advantage_head = nn.Linear(core.size, num_actions)
        self.value_head: nn.Linear | None = nn.Linear(core.size, 1) if dueling else None

    def head(self, x: Tensor) -> Tensor:
        advantages = self.advantage_head(x)
        if self.value_head is None:
            return advantages  # type: ignore[no-any-return]
        return self.value_head(x) + advantages - advantages.mean(dim=-1, keepdim=True)

    def step(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """``obs [B, *O]``, ``state [B, S]`` -> (``q [B, A]``, next state)."""
        x, state = self.features(obs, state)
        return self.head(x), state

    def unroll(self, obs: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        """``obs [B, T, *O]`` -> (``q [B, T, A]``, the state after the last step)."""
        x, state = self.unrolled_features(obs, state, first)
        return self.head(x), state

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return self.step(obs, state)


class RecurrentActorCritic(_Recurrent):
    """A recurrent PPO/IMPALA network: encoder, LSTM/GRU core, policy and value heads."""

    def __init__(
        self,
        torso: nn.Module,
        obs_shape: tuple[int, ...],
        core: RecurrentCore,
        num_actions: int,
    ) -> None:
        super().__init__(torso, obs_shape, core)
        self.num_actions = num_actions
        self.policy_head = nn.Linear(core.size, num_actions)
        self.value_head = nn.Linear(core.size, 1)
        # As zrl's feed-forward ActorCritic: a near-uniform initial policy.
        nn.init.orthogonal_(self.policy_head.weight, 0.01)
        nn.init.zeros_(self.policy_head.bias)
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        nn.init.zeros_(self.value_head.bias)

    def step(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``obs [B, *O]`` -> (``logits [B, A]``, ``value [B]``, next state)."""
        x, state = self.features(obs, state)
        return self.policy_head(x), self.value_head(x)[..., 0], state

    def unroll(self, obs: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``obs [B, T, *O]`` -> (``logits [B, T, A]``, ``value [B, T]``, final state)."""
        x, state = self.unrolled_features(obs, state, first)
        return self.policy_head(x), self.value_head(x)[..., 0], state

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.step(obs, state)


def is_recurrent(model: Any) -> bool:
    """Whether ``model`` carries state (has ``initial_state``, ``step`` and ``unroll``)."""
    return all(callable(getattr(model, name, None)) for name in ("initial_state", "step", "unroll"))


def recurrent_q_network_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> RecurrentQNetwork:
    """zrl's network for R2D2 (``Algorithm.model``): ``model.core`` (lstm unless set) of
    ``model.core_size`` after the encoder."""
    check_discrete_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    torso, obs_shape, features = _torso(observation_space, model_cfg, "relu")
    kind: CoreKind = "gru" if model_cfg.core == "gru" else "lstm"
    core = RecurrentCore(kind, features, model_cfg.core_size)
    return RecurrentQNetwork(torso, obs_shape, core, int(action_space.n), model_cfg.dueling)


def recurrent_actor_critic(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> RecurrentActorCritic:
    """A recurrent actor-critic for ``model.core`` (lstm or gru): one shared encoder (the
    ``hidden`` MLP, or the CNN for images), the core, and the two heads."""
    check_discrete_spaces(observation_space, action_space)
    assert isinstance(action_space, gym.spaces.Discrete)
    assert model_cfg.core in ("lstm", "gru"), model_cfg.core
    torso, obs_shape, features = _torso(observation_space, model_cfg, model_cfg.activation)
    core = RecurrentCore(model_cfg.core, features, model_cfg.core_size)
    return RecurrentActorCritic(torso, obs_shape, core, int(action_space.n))


class EnvStates:
    """What an actor policy of a recurrent model keeps per env slot: the state ``[E, S]`` it
    acts from, and which envs start an episode at their next observation. The actor says so
    (``episodes_started``: its first observations, after an end, after an env error); the
    state is zeroed there before the model acts on that observation, and ``take_starts``
    says where it was (the ``first`` a learner unrolls with)."""

    state: np.ndarray
    starts: np.ndarray

    def init_states(self, model: Any, num_envs: int) -> None:
        self.state = model.initial_state(num_envs).numpy()
        self.starts = np.ones(num_envs, bool)  # the actor's first observations start episodes

    def episodes_started(self, envs: np.ndarray) -> None:
        self.starts[envs] = True

    def zero_starts(self) -> None:
        """Zero the state where an episode starts, keeping the marks for ``take_starts``."""
        self.state[self.starts] = 0.0

    def take_starts(self, rows: slice | None) -> np.ndarray:
        """Before acting: zero the state where an episode starts and clear the marks; the
        envs ``[E]`` where it did. All envs act at once (``actor.env_groups: 1``)."""
        if rows is not None:
            raise ValueError("a recurrent policy acts on all envs at once: actor.env_groups: 1")
        first = self.starts.copy()
        self.starts[:] = False
        self.state[first] = 0.0
        return first

    def step_q(
        self, model: Any, obs: np.ndarray, rows: slice | None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A recurrent Q-network's values ``[E, A]`` on ``obs`` from the envs' states (zeroed
        first where an episode starts), the states moved on; and what the actor records: where
        the state was zeroed (``first``) and the state it acted from (``state``)."""
        first = self.take_starts(rows)
        state = self.state.copy()
        q, next_state = model.step(torch.from_numpy(obs), torch.from_numpy(state))
        self.state = next_state.numpy()
        return q.numpy(), {"first": first, "state": state}


@torch.no_grad()
def greedy_step(model: Any, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """The greedy actions ``[B]`` of a recurrent model and its next state: the argmax of a
    Q-network's values or of an actor-critic's logits."""
    out = model.step(obs, state)
    return out[0].argmax(dim=-1), out[-1]


def actor_critic_for(
    observation_space: gym.spaces.Space, action_space: gym.spaces.Space, model_cfg: ModelConfig
) -> ActorCritic | AgentActorCritic | RecurrentActorCritic:
    """zrl's network for PPO (``Algorithm.model``): the recurrent actor-critic when
    ``model.core`` is set, else the feed-forward one."""
    if model_cfg.core != "none":
        if isinstance(observation_space, AgentObservationSpace) and (
            observation_space.mask or observation_space.state
        ):
            raise ValueError(
                f"model.core: {model_cfg.core}: the actor-critic of multi-agent slots with action "
                "masks or a global state is feed-forward; set model.core: none"
            )
        return recurrent_actor_critic(observation_space, action_space, model_cfg)
    return build_actor_critic(
        observation_space, action_space, model_cfg.hidden, model_cfg.activation, model_cfg.encoder
    )
