"""``AgentActorCritic``, the actor-critic of a multi-agent slot: illegal actions get probability
exactly 0 (never sampled, never greedy, no gradient into their logits) while the legal ones
keep finite log-probabilities summing to probability 1; the global state reaches the value
and not the policy; ``build_actor_critic`` picks it for masked or stateful slot spaces and
``q_network_for`` refuses masked spaces, pointing at the actor-critic algorithms."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.config.sections import ModelConfig
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.discrete import (
    ILLEGAL_LOGIT,
    ActorCritic,
    AgentActorCritic,
    QNetwork,
    build_actor_critic,
    greedy_actions,
    policy_logits,
    q_network_for,
)

torch.set_num_threads(1)

BOARD = AgentObservationSpace((3, 3, 2), mask=9, state=0)


def masked_batch(
    space: AgentObservationSpace, n: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot observations with random features, masks with at least one legal action, random
    states; and the masks."""
    g = torch.Generator().manual_seed(seed)
    own = torch.randint(0, 2, (n, space.features), generator=g).float()
    mask = torch.rand(n, space.mask, generator=g) < 0.4
    mask[torch.arange(n), torch.randint(0, space.mask, (n,), generator=g)] = True
    state = torch.randn(n, space.state, generator=g)
    return torch.cat([own, mask.float(), state], dim=1), mask


def favour_illegal(model: AgentActorCritic, action: int) -> None:
    """Make ``action`` the policy's overwhelming choice before masking."""
    with torch.no_grad():
        model.policy_head.bias.zero_()
        model.policy_head.bias[action] = 30.0


def test_illegal_actions_have_probability_exactly_zero():
    model = AgentActorCritic(BOARD, 9, hidden=(32,))
    obs, mask = masked_batch(BOARD, 256)
    logits = model.policy_logits(obs)
    assert (logits[~mask] == ILLEGAL_LOGIT).all()
    probs = torch.softmax(logits, dim=1)
    assert (probs[~mask] == 0.0).all()
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(256))
    logp = torch.log_softmax(logits, dim=1)
    assert torch.isfinite(logp).all()  # finite also for the illegal ones: no NaN in losses
    assert (logp[mask] > -30).all()
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.isfinite(entropy).all()


def test_masked_actions_are_never_sampled_nor_greedy():
    model = AgentActorCritic(BOARD, 9, hidden=(32,))
    favour_illegal(model, 4)
    obs, mask = masked_batch(BOARD, 300, seed=1)
    mask[:, 4] = False
    obs[:, BOARD.features + 4] = 0.0
    mask[:, 0] = True  # keep a legal move in every row
    obs[:, BOARD.features] = 1.0
    for _ in range(20):
        actions = model.act(obs)
        assert mask[torch.arange(300), actions].all()
    greedy = greedy_actions(model, obs)
    assert mask[torch.arange(300), greedy].all()
    assert (policy_logits(model, obs) == model.policy_logits(obs)).all()
    # where 4 is legal the favoured action wins: the mask, not the weights, kept it out
    legal_four = obs.clone()
    legal_four[:, BOARD.features + 4] = 1.0
    assert (model.act(legal_four, deterministic=True) == 4).all()


def test_no_gradient_flows_into_masked_logits():
    model = AgentActorCritic(BOARD, 9, hidden=(16,))
    obs, mask = masked_batch(BOARD, 64, seed=2)
    obs[:, BOARD.features + 7] = 0.0  # action 7 illegal everywhere
    mask[:, 7] = False
    logits, value = model(obs)
    dist = torch.distributions.Categorical(logits=logits)
    actions = dist.sample()
    loss = -(dist.log_prob(actions) * torch.randn(64)).mean() - 0.01 * dist.entropy().mean()
    loss = loss + value.square().mean()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.policy_head.weight.grad[7].abs().max() == 0.0
    assert model.policy_head.bias.grad[7] == 0.0
    assert model.policy_head.weight.grad[[i for i in range(9) if i != 7]].abs().max() > 0.0


def test_state_reaches_the_value_and_not_the_policy():
    space = AgentObservationSpace((18,), mask=0, state=54)
    model = AgentActorCritic(space, 5, hidden=(32, 32))
    obs = torch.randn(8, 72)
    moved_state = obs.clone()
    moved_state[:, 18:] += torch.randn(8, 54)
    logits, value = model(obs)
    logits2, value2 = model(moved_state)
    assert torch.equal(logits, logits2)
    assert (value - value2).abs().min() > 0.0
    moved_own = obs.clone()
    moved_own[:, :18] += torch.randn(8, 18)
    logits3, value3 = model(moved_own)
    assert (logits - logits3).abs().amax(dim=1).min() > 0.0
    assert (value - value3).abs().min() > 0.0


def test_value_ignores_the_mask_and_the_policy_ignores_the_state():
    space = AgentObservationSpace((4,), mask=3, state=5)
    model = AgentActorCritic(space, 3, hidden=(8,))
    obs, mask = masked_batch(space, 16, seed=3)
    other_mask = obs.clone()
    other_mask[:, 4:7] = 1.0
    assert torch.equal(model.value(obs), model.value(other_mask))
    other_state = obs.clone()
    other_state[:, 7:] = torch.randn(16, 5)
    assert torch.equal(model.policy_logits(obs), model.policy_logits(other_state))
    assert not torch.equal(model.value(obs), model.value(other_state))


def test_mask_size_must_match_the_actions():
    with pytest.raises(ValueError, match="9 entries for 7 actions"):
        AgentActorCritic(BOARD, 7)


def test_build_actor_critic_picks_the_agent_model():
    masked = build_actor_critic(BOARD, gym.spaces.Discrete(9), hidden=(16,))
    assert isinstance(masked, AgentActorCritic) and masked.mask == 9
    stateful = build_actor_critic(AgentObservationSpace((18,), 0, 54), gym.spaces.Discrete(5))
    assert isinstance(stateful, AgentActorCritic) and stateful.state == 54
    plain = build_actor_critic(AgentObservationSpace((18,), 0, 0), gym.spaces.Discrete(5))
    assert isinstance(plain, ActorCritic)
    assert masked(torch.zeros(2, 27))[0].shape == (2, 9)


def test_q_networks_refuse_masked_spaces():
    with pytest.raises(ValueError, match="actor-critic"):
        q_network_for(BOARD, gym.spaces.Discrete(9), ModelConfig())
    unmasked = q_network_for(
        AgentObservationSpace((18,), 0, 0), gym.spaces.Discrete(5), ModelConfig()
    )
    assert isinstance(unmasked, QNetwork)
    assert np.isfinite(unmasked(torch.zeros(1, 18)).detach().numpy()).all()
