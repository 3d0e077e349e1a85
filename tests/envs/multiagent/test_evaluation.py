"""The evaluator's measures on multi-agent envs: ``greedy_returns`` plays one greedy game per
slot of a turn-based env (returns +1/0/-1, never an illegal move) and one return per agent
slot of a parallel env; ``outcome_rates`` turns the returns' signs into shares."""

from __future__ import annotations

import numpy as np
import torch

from zrl.config.multiagent import MultiAgentConfig
from zrl.envs.multiagent.envs import fixed_opponents, make_multiagent_vector_env
from zrl.nets.discrete import build_actor_critic
from zrl.roles.evaluation import greedy_returns, outcome_rates

torch.set_num_threads(1)


def test_outcome_rates():
    rates = outcome_rates(np.array([1.0, 1.0, 0.0, -1.0, 2.5, -0.2, 0.0, 0.0]))
    assert rates == {"win_rate": 3 / 8, "draw_rate": 3 / 8, "loss_rate": 2 / 8}


def test_greedy_returns_of_a_masked_policy_against_random():
    env_id = "pettingzoo/tictactoe_v3"
    probe = make_multiagent_vector_env(env_id, {}, MultiAgentConfig(), 1)
    torch.manual_seed(0)
    model = build_actor_critic(probe.single_observation_space, probe.single_action_space, (16,))
    probe.close()
    with torch.no_grad():  # the top-left corner first, and again whenever the weights decide
        model.policy_head.bias[0] = 40.0
    made = []

    def make(n):
        env = make_multiagent_vector_env(env_id, {}, MultiAgentConfig(opponent="random"), n)
        env.opponents = fixed_opponents(env, "random", seed=0)
        made.append(env)
        return env

    returns = greedy_returns(model, make, episodes=20, seed=5)
    assert returns.shape == (20,)
    assert set(np.unique(returns)) <= {-1.0, 0.0, 1.0}
    counts = made[0].opponents.results["random"]  # every game reported, none lost to rules
    assert counts.sum() >= 20
    rates = outcome_rates(returns)
    assert sum(rates.values()) == 1.0
    # Unmasked, the second move would be the corner again: illegal, every game forfeited.
    # Masked, the policy wins some.
    assert rates["win_rate"] > 0.2


def test_greedy_returns_one_per_agent_slot():
    env_id = "mpe2/simple_spread_v3"
    cfg = MultiAgentConfig(central_value=True)

    def make(n):
        return make_multiagent_vector_env(env_id, {"max_cycles": 5}, cfg, n)

    probe = make(1)
    model = build_actor_critic(probe.single_observation_space, probe.single_action_space, (16,))
    probe.close()
    returns = greedy_returns(model, make, episodes=2, seed=0)
    assert returns.shape == (2 * 3,)
    assert np.all(returns < 0.0)  # simple spread's rewards are distances: negative
