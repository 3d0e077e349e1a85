"""QMIX's network: one agent Q-network shared by the agents of a game, and the mixing network
(:class:`QMixer`) with its hypernetworks; and :func:`team_size`, the agents of a game.

The model's ``forward`` is the agent network on slot observations (``zrl.envs.multiagent.spaces``:
the agent's own observation, its action mask, the global state): ``[N, slot] -> [N, A]``,
illegal actions at :data:`~zrl.algos.qmix.losses.ILLEGAL_Q`. The agent network reads only the
agent's own observation; the mixer reads only the state. The actors and the evaluator use
``forward`` (its argmax is the greedy action); the learner uses :meth:`QMIXModel.team_q` and
``mixer`` on team transitions. With ``model.core`` the agent network is recurrent
(:class:`RecurrentQMIXModel`: ``step``/``unroll`` over a state per agent, as zrl's recurrent
Q-networks; :meth:`RecurrentQMIXModel.team_unroll` for the learner's team sequences). The
mixer travels with the weights (its parameters are published with the agent network's; the
actors never run it).
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

import gymnasium as gym
import torch
from torch import Tensor, nn

from zrl.algos.qmix.losses import ILLEGAL_Q, mix
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.discrete import QNetwork, check_discrete_spaces
from zrl.nets.encoders import MLPEncoder
from zrl.nets.recurrent import CoreKind, RecurrentCore, RecurrentQNetwork

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig
    from zrl.config.sections import ModelConfig


class QMixer(nn.Module):
    """QMIX's mixing network: hypernetworks from the state ``[B, state]`` give the weights and
    biases that :func:`~zrl.algos.qmix.losses.mix` combines the agents' Q-values with. ``W1``
    and ``W2`` come from two-layer hypernetworks (``hypernet`` wide, as pymarl's), ``b1`` from
    a linear layer, the final bias ``V(s)`` from a two-layer network (the paper's)."""

    def __init__(self, state_dim: int, agents: int, embed: int = 32, hypernet: int = 64) -> None:
        super().__init__()
        if min(state_dim, agents, embed, hypernet) < 1:
            raise ValueError(
                f"QMixer sizes must be >= 1, got state_dim={state_dim}, agents={agents}, "
                f"embed={embed}, hypernet={hypernet}"
            )
        self.agents, self.embed = agents, embed
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_dim, hypernet), nn.ReLU(), nn.Linear(hypernet, agents * embed)
        )
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_dim, hypernet), nn.ReLU(), nn.Linear(hypernet, embed)
        )
        self.hyper_b2 = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def hyper(self, state: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The mixing parameters for states ``[B, state]``, before the absolute value:
        ``w1 [B, L, E]``, ``b1 [B, E]``, ``w2 [B, E]``, ``b2 [B]``."""
        B = state.shape[0]
        return (
            self.hyper_w1(state).view(B, self.agents, self.embed),
            self.hyper_b1(state),
            self.hyper_w2(state),
            self.hyper_b2(state).squeeze(1),
        )

    def forward(self, q: Tensor, state: Tensor) -> Tensor:
        """``Q_tot [B]`` of the agents' chosen Q-values ``q [B, L]`` in states ``[B, state]``."""
        return mix(q, *self.hyper(state))


class TeamSlots(nn.Module):
    """What both QMIX networks read of a slot observation (``zrl.envs.multiagent.spaces``):
    the agent's own features, its action mask and the global state, ``slot`` wide; masking
    illegal actions, and the mixer's state from team observations."""

    def __init__(self, slot_space: AgentObservationSpace, num_actions: int, agents: int) -> None:
        super().__init__()
        if not slot_space.state:
            raise ValueError(
                "QMIX's mixer needs the global state in every slot observation: set "
                "env.multiagent.central_value: true"
            )
        self.slot_space = slot_space
        self.features, self.mask, self.state_dim = (
            slot_space.features,
            slot_space.mask,
            slot_space.state,
        )
        self.slot = self.features + self.mask + self.state_dim
        self.agents, self.num_actions = agents, num_actions

    def masked(self, q: Tensor, obs: Tensor) -> Tensor:
        """Q-values ``[..., A]`` with the actions illegal in slot observations ``[..., slot]``
        (mask 0) at ``ILLEGAL_Q``."""
        if not self.mask:
            return q
        legal = obs[..., self.features : self.features + self.mask] > 0.5
        return q.masked_fill(~legal, ILLEGAL_Q)

    def team_states(self, team_obs: Tensor) -> Tensor:
        """The global states ``[..., state]`` (agent 0's copy) of team observations
        ``[..., L * slot]``, for the mixer."""
        return team_obs[..., self.features + self.mask : self.slot].float()


class QMIXModel(TeamSlots):
    """The shared agent Q-network (an MLP over the agent's own observation) and the mixer."""

    def __init__(
        self,
        slot_space: AgentObservationSpace,
        num_actions: int,
        agents: int,
        hidden: tuple[int, ...] = (64, 64),
        embed: int = 32,
        hypernet: int = 64,
    ) -> None:
        super().__init__(slot_space, num_actions, agents)
        self.agent = QNetwork(self.features, num_actions, hidden, dueling=False)
        self.mixer = QMixer(self.state_dim, agents, embed, hypernet)

    def forward(self, obs: Tensor) -> Tensor:
        """Each slot's Q-values ``[N, A]`` for slot observations ``[N, slot]``; illegal actions
        (mask 0) at ``ILLEGAL_Q``."""
        obs = obs.reshape(obs.shape[0], -1).float()
        return self.masked(self.agent(obs[:, : self.features]), obs)

    def team_q(self, team_obs: Tensor) -> tuple[Tensor, Tensor]:
        """Team observations ``[B, L * slot]`` -> the agents' Q-values ``[B, L, A]`` and the
        state ``[B, state]`` (agent 0's copy)."""
        B = team_obs.shape[0]
        slots = team_obs.reshape(B, self.agents, self.slot)
        q = self(slots.reshape(B * self.agents, self.slot)).view(B, self.agents, -1)
        return q, self.team_states(team_obs)


class RecurrentQMIXModel(TeamSlots):
    """QMIX with a recurrent agent network (``model.core``): the shared agent network is an
    MLP over the agent's own observation, an LSTM/GRU core (``model.core_size``) and a plain
    Q head (``zrl.nets.recurrent.RecurrentQNetwork``), one state ``[state_size]`` per agent;
    the mixer is :class:`QMixer`, as feed-forward QMIX's.

    Its ``step``/``forward`` (actors, evaluator) and ``unroll`` run slots as any recurrent
    Q-network of zrl does (``zrl.nets.recurrent``), illegal actions at ``ILLEGAL_Q``; the
    learner unrolls a game's agents with :meth:`team_unroll` and reads the mixer's states
    with :meth:`team_states`."""

    def __init__(
        self,
        slot_space: AgentObservationSpace,
        num_actions: int,
        agents: int,
        hidden: tuple[int, ...] = (64,),
        core: CoreKind = "gru",
        core_size: int = 64,
        embed: int = 32,
        hypernet: int = 64,
    ) -> None:
        super().__init__(slot_space, num_actions, agents)
        torso = MLPEncoder((self.features,), hidden, "relu")
        rnn = RecurrentCore(core, torso.out_features, core_size)
        self.agent = RecurrentQNetwork(torso, (self.features,), rnn, num_actions, dueling=False)
        self.state_size = self.agent.state_size
        self.mixer = QMixer(self.state_dim, agents, embed, hypernet)

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> Tensor:
        """Zeros ``[batch, state_size]``: an agent's state at a game's first step."""
        return self.agent.initial_state(batch, device)

    def step(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Slot observations ``[N, slot]`` and states ``[N, S]`` -> (Q-values ``[N, A]``,
        illegal actions at ``ILLEGAL_Q``; the next states)."""
        obs = obs.reshape(obs.shape[0], -1).float()
        q, state = self.agent.step(obs[:, : self.features], state)
        return self.masked(q, obs), state

    def forward(self, obs: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return self.step(obs, state)

    def unroll(self, obs: Tensor, state: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        """Slot observations ``[N, T, slot]`` from states ``[N, S]``, zeroed where ``first
        [N, T]`` -> (Q-values ``[N, T, A]``, masked; the states after the last step)."""
        obs = obs.float()
        q, state = self.agent.unroll(obs[..., : self.features], state, first)
        return self.masked(q, obs), state

    def team_unroll(
        self, team_obs: Tensor, team_state: Tensor, first: Tensor
    ) -> tuple[Tensor, Tensor]:
        """A batch of team sequences: observations ``[B, T, L * slot]``, the agents' states
        ``[B, L * S]`` side by side, ``first [B, T]`` (a game's agents start together) ->
        each agent's Q-values ``[B, T, L, A]`` (masked) and the final states ``[B, L * S]``.
        Every agent is unrolled by the shared network from its own state."""
        B, T = team_obs.shape[:2]
        L = self.agents
        slots = team_obs.reshape(B, T, L, self.slot).transpose(1, 2).reshape(B * L, T, self.slot)
        states = team_state.reshape(B * L, self.state_size)
        q, final = self.unroll(slots, states, first.repeat_interleave(L, dim=0))
        q = q.reshape(B, L, T, -1).transpose(1, 2)
        return q, final.reshape(B, L * self.state_size)


def qmix_model_for(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    agents: int = 1,
    embed: int = 32,
    hypernet: int = 64,
) -> QMIXModel | RecurrentQMIXModel:
    """zrl's network for QMIX (``Algorithm.model``): ``agents`` from :func:`team_size`,
    ``embed`` and ``hypernet`` from ``qmix:`` (``Algorithm.model_options``); with
    ``model.core`` (lstm or gru) the recurrent agent network (``model.hidden`` before a core
    of ``model.core_size``)."""
    check_discrete_spaces(observation_space, action_space)
    if not isinstance(observation_space, AgentObservationSpace):
        raise ValueError(
            f"QMIX needs the slot observations of a PettingZoo env, not {observation_space!r}"
        )
    assert isinstance(action_space, gym.spaces.Discrete)
    if model_cfg.core != "none":
        kind: CoreKind = "gru" if model_cfg.core == "gru" else "lstm"
        return RecurrentQMIXModel(
            observation_space,
            int(action_space.n),
            agents,
            tuple(model_cfg.hidden),
            kind,
            model_cfg.core_size,
            embed,
            hypernet,
        )
    return QMIXModel(
        observation_space, int(action_space.n), agents, tuple(model_cfg.hidden), embed, hypernet
    )


def team_size(cfg: ExperimentConfig) -> int:
    """The agents of one game of the experiment's env that the learning policy plays (its slots
    per game), from one probe game; ValueError unless the env is a parallel PettingZoo env."""
    env = cfg.env
    kwargs = json.dumps(env.kwargs, sort_keys=True, default=str)
    return _team_size(env.id, kwargs, env.multiagent.model_dump_json())


@functools.lru_cache(maxsize=8)
def _team_size(env_id: str, kwargs: str, multiagent: str) -> int:
    """:func:`team_size` by the JSON of the env's kwargs and ``env.multiagent`` (cached: every
    model an experiment's process builds asks)."""
    from zrl.config.multiagent import MultiAgentConfig
    from zrl.envs.multiagent.envs import ParallelVectorEnv, make_multiagent_vector_env

    ma = MultiAgentConfig.model_validate_json(multiagent)
    probe = make_multiagent_vector_env(env_id, json.loads(kwargs), ma, 1)
    try:
        if not isinstance(probe, ParallelVectorEnv):
            raise ValueError(
                f"env.id: {env_id}: QMIX needs a parallel PettingZoo env (all agents act at "
                "once), not a turn-based one"
            )
        return int(probe.num_envs)
    finally:
        probe.close()


__all__ = ["QMIXModel", "QMixer", "RecurrentQMIXModel", "qmix_model_for", "team_size"]
