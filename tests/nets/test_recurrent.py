"""The recurrent cores and networks (``zrl.nets.recurrent``): ``unroll`` over T steps with resets is
T calls of ``step`` with the state zeroed where ``first`` says, for LSTM and GRU; the state's
layout; and the models zrl builds for ``model.core``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.config.sections import ModelConfig
from zrl.nets.recurrent import (
    RecurrentActorCritic,
    RecurrentCore,
    RecurrentQNetwork,
    actor_critic_for,
    is_recurrent,
    recurrent_q_network_for,
)

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(4)


def stepwise(core: RecurrentCore, x: torch.Tensor, state: torch.Tensor, first: torch.Tensor):
    """The definition of ``unroll``: one step at a time, zeroing before each reset."""
    outs = []
    for t in range(x.shape[1]):
        state = torch.where(first[:, t, None], torch.zeros_like(state), state)
        out, state = core.step(x[:, t], state)
        outs.append(out)
    return torch.stack(outs, dim=1), state


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("resets", ["none", "start", "scattered", "all"])
def test_unroll_is_steps_with_resets(kind, resets):
    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, 7)
    B, T = 4, 9
    x = torch.randn(B, T, 5)
    state = torch.randn(B, core.state_size)
    first = torch.zeros(B, T, dtype=torch.bool)
    if resets == "start":
        first[1, 0] = True
    elif resets == "scattered":
        first[0, 3] = first[2, 3] = first[3, 7] = first[1, 1] = True
    elif resets == "all":
        first[:] = True
    with torch.no_grad():
        got, got_state = core.unroll(x, state, first)
        want, want_state = stepwise(core, x, state, first)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-6)


def test_lstm_state_is_h_then_c():
    core = RecurrentCore("lstm", 2, 3)
    assert core.state_size == 6 and RecurrentCore("gru", 2, 3).state_size == 3
    out, state = core.step(torch.randn(1, 2), core.initial_state(1))
    torch.testing.assert_close(state[:, :3], out)  # h is the output


def test_gradients_reach_the_stored_state_only_through_kept_rows():
    core = RecurrentCore("lstm", 2, 3)
    state = torch.randn(2, 6, requires_grad=True)
    first = torch.tensor([[True, False], [False, False]])
    out, _ = core.unroll(torch.randn(2, 2, 2), state, first)
    out.sum().backward()
    assert state.grad is not None
    assert torch.all(state.grad[0] == 0) and torch.any(state.grad[1] != 0)


def test_models_for_model_core():
    cfg = ModelConfig(core="gru", core_size=8, hidden=[16])
    q = recurrent_q_network_for(OBS, ACTIONS, cfg)
    assert isinstance(q, RecurrentQNetwork) and is_recurrent(q) and q.state_size == 8
    values, state = q.step(torch.zeros(2, 3), q.initial_state(2))
    assert values.shape == (2, 4) and state.shape == (2, 8)
    ac = actor_critic_for(OBS, ACTIONS, ModelConfig(core="lstm", core_size=8))
    assert isinstance(ac, RecurrentActorCritic) and ac.state_size == 16
    logits, value, _ = ac.unroll(
        torch.zeros(2, 5, 3), ac.initial_state(2), torch.zeros(2, 5, dtype=torch.bool)
    )
    assert logits.shape == (2, 5, 4) and value.shape == (2, 5)
    assert not is_recurrent(actor_critic_for(OBS, ACTIONS, ModelConfig()))
    # r2d2 without a core set gets an LSTM
    assert recurrent_q_network_for(OBS, ACTIONS, ModelConfig()).core.kind == "lstm"


def test_bad_core_is_refused():
    with pytest.raises(ValueError, match="lstm or gru"):
        RecurrentCore("rnn", 2, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("algo", ["apex_dqn", "a3c", "sac", "apex_ddpg"])
def test_algorithms_without_a_recurrent_policy_refuse_a_core(algo):
    from zrl.config.experiment import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=f"model.core: lstm: {algo} has no recurrent policy"):
        config_from_dict({"algo": algo, "model": {"core": "lstm"}})


def test_r2d2_config_checks_name_the_keys():
    from zrl.config.experiment import ConfigError, config_from_dict

    base = {"algo": "r2d2", "env": {"id": "zrl/CartPoleNoVel-v1"}}
    with pytest.raises(ConfigError, match="burn_in"):
        config_from_dict({**base, "r2d2": {"sequence_length": 10, "burn_in": 10}})
    with pytest.raises(ConfigError, match="replay.n_step"):
        config_from_dict({**base, "r2d2": {"sequence_length": 10, "burn_in": 8}})
    with pytest.raises(ConfigError, match="env_groups"):
        config_from_dict({**base, "env": {"num_envs": 4}, "actor": {"env_groups": 2}})
    with pytest.raises(ConfigError, match="r2d2 needs replay.table"):
        config_from_dict({**base, "replay": {"table": "fifo"}})


def test_a_recurrent_core_follows_the_cnn_for_frames():
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg = ModelConfig(core="lstm", core_size=32)
    q = recurrent_q_network_for(frames, ACTIONS, cfg)
    ac = actor_critic_for(frames, ACTIONS, cfg)
    obs = torch.zeros(2, 3, 4, 84, 84, dtype=torch.uint8)
    first = torch.zeros(2, 3, dtype=torch.bool)
    values, _ = q.unroll(obs, q.initial_state(2), first)
    logits, value, _ = ac.unroll(obs, ac.initial_state(2), first)  # type: ignore[union-attr]
    assert values.shape == (2, 3, 4) and logits.shape == (2, 3, 4) and value.shape == (2, 3)
    assert type(q.torso).__name__ == "NatureCNN"
