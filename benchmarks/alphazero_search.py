"""Self-play speed of the AlphaZero actor policy on one core: searches (moves), leaf
evaluations, simulations and finished games per second, for a config's game, envs,
simulations and network (its initial weights: the speed does not depend on them).

It drives ``AlphaZeroPolicy`` over the config's vector env in this process, as an actor
does, with one torch thread:

    python benchmarks/alphazero_search.py configs/tictactoe_alphazero.yaml
    python benchmarks/alphazero_search.py configs/connect_four_alphazero.yaml --seconds 30
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from zrl.algos.alphazero.config import AlphaZeroConfig
from zrl.algos.alphazero.policy import AlphaZeroPolicy
from zrl.algos.models import experiment_model
from zrl.config.experiment import load_config
from zrl.envs.multiagent.envs import fixed_opponents, make_multiagent_vector_env
from zrl.testing.fakes import actor_setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    cfg = load_config(args.config)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    E = cfg.env.num_envs
    envs = make_multiagent_vector_env(cfg.env.id, cfg.env.kwargs, cfg.env.multiagent, E)
    envs.opponents = fixed_opponents(envs, "self", seed=cfg.seed)  # the slot plays both seats
    spaces = envs.single_observation_space, envs.single_action_space
    model = experiment_model(cfg, *spaces).eval()
    policy = AlphaZeroPolicy(actor_setup(cfg, model, *spaces, num_envs=E, seed=cfg.seed))
    obs, _ = envs.reset(seed=cfg.seed)
    started, games, t = time.perf_counter(), 0, 0
    while time.perf_counter() - started < args.seconds:
        actions, _ = policy.act(np.asarray(obs, np.float32), t)
        obs, _, term, trunc, _ = envs.step(actions)
        done = np.asarray(term) | np.asarray(trunc)
        games += int(np.asarray(term).sum())
        if done.any():
            policy.episodes_started(np.flatnonzero(done))
        t += 1
    took = time.perf_counter() - started
    sims = cfg.section(AlphaZeroConfig).simulations
    print(
        f"{cfg.env.id}, {E} games, {sims} simulations: {policy.searches / took:.0f} searches/s, "
        f"{policy.searches * sims / took:.0f} simulations/s, "
        f"{policy.evaluated / took:.0f} leaf evaluations/s, {games / took:.1f} games/s "
        f"({took:.1f} s, one core)"
    )
    envs.close()


if __name__ == "__main__":
    main()
