"""Greedy evaluation of a policy (Q-network argmax, actor-critic mode or the deterministic
continuous action, clipped to the bounds; recurrent models carry their state), shared by the evaluator role and ``zrl eval``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from zrl.config import ExperimentConfig
from zrl.continuous_models import clip_to_bounds
from zrl.envs import make_vector_env
from zrl.factories import FACTORIES_FILE, Factories
from zrl.models import build_model, greedy_actions, load_arrays
from zrl.recurrent import greedy_step, is_recurrent
from zrl.transport import messages as M


@torch.no_grad()
def greedy_returns(
    model: Any,
    make_envs: Callable[[int], Any],
    episodes: int,
    seed: int,
    on_step: Callable[[], None] | None = None,
) -> np.ndarray:
    """One greedy episode in each of ``episodes`` parallel envs (``make_envs(episodes)``);
    their undiscounted returns (one per slot: a parallel multi-agent env has one per agent of
    the learning policy in each game)."""
    envs = make_envs(episodes)
    episodes = envs.num_envs
    try:
        obs, _ = envs.reset(seed=seed)
        dtype = M.obs_dtype(envs.single_observation_space)
        returns = np.zeros(episodes)
        finished = np.zeros(episodes, dtype=bool)
        steps = 0
        # A recurrent model's state: each env plays one episode, so it never resets.
        state = model.initial_state(episodes) if is_recurrent(model) else None
        while not finished.all():
            obs_t = torch.from_numpy(M.as_obs(obs, episodes, dtype))
            if state is not None:
                greedy, state = greedy_step(model, obs_t, state)
                actions = greedy.numpy()
            else:
                actions = greedy_actions(model, obs_t).numpy()
            if isinstance(envs.single_action_space, gym.spaces.Box):
                # [B, act_dim] as the vector env expects; a user's model may ignore the bounds.
                space = envs.single_action_space
                actions = clip_to_bounds(actions.reshape(episodes, -1), space.low, space.high)
            obs, r, term, trunc, _ = envs.step(actions)
            returns += np.where(finished, 0.0, r)
            finished |= np.asarray(term) | np.asarray(trunc)
            steps += 1
            if on_step is not None:  # heartbeats (they keep their own interval)
                on_step()
        return returns
    finally:
        envs.close()


def outcome_rates(returns: np.ndarray) -> dict[str, float]:
    """Win/draw/loss shares of games scored +1/0/-1 (their returns' signs)."""
    sign = np.sign(returns)
    return {
        "win_rate": float(np.mean(sign > 0)),
        "draw_rate": float(np.mean(sign == 0)),
        "loss_rate": float(np.mean(sign < 0)),
    }


def load_policy(run_dir: Path) -> tuple[torch.nn.Module, ExperimentConfig, Factories]:
    """The model saved by ``zrl run`` in ``run_dir/model.pt``, the run's config and factories."""
    path = Path(run_dir) / "model.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: was the run stopped before saving a model?"
        )
    # Tensors, strings and dicts only (the config is JSON): nothing in model.pt runs code.
    saved = torch.load(path, map_location="cpu", weights_only=True)
    cfg = ExperimentConfig.model_validate(json.loads(saved["config"]))
    factories = Factories(**saved.get("factory_refs", {}))
    pickled = Path(run_dir) / FACTORIES_FILE
    if pickled.is_file():  # written by our own supervisor into the user's run directory
        factories = Factories.from_wire(factories.references, pickled.read_bytes())
    probe = make_vector_env(cfg.env, 1, factories.env_fn())
    model = build_model(
        probe.single_observation_space, probe.single_action_space, cfg.model, cfg.algo,
        factories.model_fn(), twin=cfg.ddpg.twin,
    )  # fmt: skip
    probe.close()
    load_arrays(model, {k: v.numpy() for k, v in saved["weights"].items()})
    model.eval()
    return model, cfg, factories


def evaluate_run_dir(
    run_dir: Path, episodes: int = 10, seed: int = 12345, opponent: str | None = None
) -> list[float]:
    """Greedy returns of a run's saved policy; a turn-based multi-agent game is played against
    ``opponent`` (random or scripted; random when None)."""
    from zrl.multiagent.envs import TurnBasedVectorEnv, fixed_opponents

    model, cfg, factories = load_policy(run_dir)
    env_fn = factories.env_fn()

    def make_envs(n: int) -> Any:
        envs = make_vector_env(cfg.env, n, env_fn, evaluation=True)
        if isinstance(envs, TurnBasedVectorEnv):
            envs.opponents = fixed_opponents(envs, cfg.env.id, opponent or "random", seed)
        elif opponent is not None:
            envs.close()
            raise ValueError(f"--opponent {opponent}: {cfg.env.id} is not a turn-based game")
        return envs

    returns = greedy_returns(model, make_envs, episodes, seed)
    return [float(r) for r in returns]
