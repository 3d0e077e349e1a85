"""Greedy evaluation of a policy (Q-network argmax, actor-critic mode or the deterministic
continuous action, clipped to the bounds; recurrent models carry their state), shared by the
evaluator role and ``zrl eval``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from zrl.algos.models import experiment_model
from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import FACTORIES_FILE, Factories
from zrl.envs.multiagent.games import BoardGame
from zrl.envs.multiagent.search import Exploitability, enumerable_game, exploitability
from zrl.envs.vector import make_vector_env
from zrl.nets.continuous import clip_to_bounds
from zrl.nets.discrete import greedy_actions
from zrl.nets.recurrent import greedy_step, is_recurrent
from zrl.nets.wire import load_arrays
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


def exploitability_game(setting: str | bool, env_id: str) -> BoardGame | None:
    """The game whose exploitability an evaluation computes (``evaluator.exploitability``:
    auto, true or false), or None. ValueError naming the env when ``true`` asks for it on one
    too big to enumerate or with no board game."""
    game = enumerable_game(env_id)
    if setting is True and game is None:
        raise ValueError(
            f"evaluator.exploitability: true, but {env_id} is no board game small enough to "
            "enumerate (tic-tac-toe is): set it to auto or false"
        )
    return game if setting is not False else None


@torch.no_grad()
def greedy_exploitability(model: Any, game: BoardGame) -> Exploitability:
    """The exploitability of ``model``'s greedy policy (its masked argmax on the slot
    observation, ``greedy_actions``) in ``game``: a best response by exhaustive search from
    both seats (``zrl.envs.multiagent.search.exploitability``). A feed-forward model only: a
    recurrent one's action depends on its history, not on the position alone."""
    if is_recurrent(model):
        raise ValueError(
            "exploitability: the model is recurrent; its moves are no function of "
            "the position (set evaluator.exploitability: false)"
        )

    def policy(obs: np.ndarray) -> np.ndarray:
        return greedy_actions(model, torch.from_numpy(obs)).numpy()

    return exploitability(game, policy)


def exploitability_fields(found: Exploitability) -> dict[str, Any]:
    """An evaluation's exploitability figures (eval.csv's columns): the best response's win
    rate over both seats, the policy's outcome under it moving first and second (+1 win, 0
    draw, -1 loss) and the opponent lines that beat it, over both seats."""
    return {
        "exploitability": found.value,
        "exploitability_first": found.outcomes[0],
        "exploitability_second": found.outcomes[1],
        "losing_lines": sum(found.losing_lines),
    }


MODEL_FILES = ("model.pt", "model_best.pt", "model_last.pt")
"""The weights ``zrl run`` saves (``zrl.run.rundir``): those that met the stop rule (else the
best evaluated), the best single evaluation's, the final ones."""
SOURCES = {
    "confirmed": "the weights that met the stop rule",
    "best": "the best evaluated weights",
    "last": "the final weights",
}


def _read_saved(path: Path) -> dict[str, Any]:
    """A saved model file as ``torch.load`` gives it; FileNotFoundError or ValueError (naming
    the file) for a missing or foreign one."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: was the run stopped before saving a model?"
        )
    try:
        # Tensors, strings and dicts only (the config is JSON): nothing in model.pt runs code.
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict):
            raise TypeError(f"a {type(saved).__name__}, not a dict")
        return saved
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which one
        raise ValueError(f"{path} is not a model zrl saved: {_first_line(exc)}") from None


def describe_saved(run_dir: Path, name: str = "model.pt") -> str:
    """Which of a run's weights ``run_dir/name`` holds, with their version and evaluation
    return: what ``zrl eval`` says before it plays them."""
    saved = _read_saved(Path(run_dir) / name)
    source = saved.get("source")
    what = SOURCES.get(source, "the final weights") if isinstance(source, str) else None
    if what is None:  # written before model.pt was the confirmed weights: always the last
        what = "the final weights (saved by an older zrl)"
    ret = saved.get("eval_return")
    evaluated = f"eval return {ret:.2f}" if isinstance(ret, float) else "never evaluated"
    return f"{name}: {what}, weights v{saved.get('version', '?')}, {evaluated}"


def load_policy(
    run_dir: Path, name: str = "model.pt"
) -> tuple[torch.nn.Module, ExperimentConfig, Factories]:
    """A model saved by ``zrl run`` in ``run_dir/name`` (one of ``MODEL_FILES``; model.pt:
    the weights that met the stop rule), the run's config and factories."""
    path = Path(run_dir) / name
    saved = _read_saved(path)
    try:
        cfg = ExperimentConfig.model_validate(json.loads(saved["config"]))
        weights = {k: v.numpy() for k, v in saved["weights"].items()}
        factories = Factories(**saved.get("factory_refs", {}))
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which one
        raise ValueError(f"{path} is not a model zrl saved: {_first_line(exc)}") from None
    pickled = Path(run_dir) / FACTORIES_FILE
    if pickled.is_file():  # written by our own supervisor into the user's run directory
        factories = Factories.from_wire(factories.references, pickled.read_bytes())
    probe = make_vector_env(cfg.env, 1, factories.env_fn())
    model = experiment_model(
        cfg, probe.single_observation_space, probe.single_action_space, factories.model_fn()
    )
    probe.close()
    try:
        load_arrays(model, weights)
    except ValueError as exc:
        raise ValueError(f"{path} does not fit its run's model: {_first_line(exc)}") from None
    model.eval()
    return model, cfg, factories


def _first_line(exc: BaseException) -> str:
    """``Type: the first line of its message`` (torch's run on for pages)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


VIDEO_INSTALL = "pip install 'zrl[video]' (moviepy, which gymnasium's RecordVideo writes with)"


def video_envs(
    cfg: ExperimentConfig, env_fn: Callable[[], Any] | None, video_dir: Path, n: int
) -> gym.vector.VectorEnv:
    """``n`` evaluation envs that render ``rgb_array`` frames, each recording its first
    episode to ``video_dir/<name>-<i>-episode-0.mp4`` (gymnasium's RecordVideo). Atari envs
    keep zrl's preprocessing (the video shows the raw frames); a user's env factory must make
    its env with ``render_mode="rgb_array"``."""
    from gymnasium.vector import AutoresetMode
    from gymnasium.wrappers import RecordVideo

    from zrl.config.multiagent import is_multiagent
    from zrl.envs import atari

    if is_multiagent(cfg.env.id):
        raise ValueError(
            f"--video: {cfg.env.id} is a multi-agent env, which zrl does not record yet"
        )

    def maker(i: int) -> Callable[[], gym.Env[Any, Any]]:
        def make() -> gym.Env[Any, Any]:
            if env_fn is not None:
                env = env_fn()
                if getattr(env, "render_mode", None) != "rgb_array":
                    raise ValueError(
                        f"--video: the env factory's env renders {env.render_mode!r}; make it "
                        "with render_mode='rgb_array'"
                    )
            elif atari.is_atari(cfg.env.id):
                kwargs = {**cfg.env.kwargs, "render_mode": "rgb_array"}
                env = atari.make_atari_env(cfg.env.model_copy(update={"kwargs": kwargs}), True)
            else:
                env = gym.make(cfg.env.id, render_mode="rgb_array", **cfg.env.kwargs)
            try:
                with warnings.catch_warnings():  # every env after the first finds the folder
                    warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
                    return RecordVideo(
                        env,
                        str(video_dir),
                        episode_trigger=lambda episode: episode == 0,
                        name_prefix=f"{cfg.name}-{i}",
                        disable_logger=True,
                    )
            except gym.error.DependencyNotInstalled:
                env.close()
                raise ValueError(f"--video needs moviepy: {VIDEO_INSTALL}") from None

        return make

    return gym.vector.SyncVectorEnv(
        [maker(i) for i in range(n)], autoreset_mode=AutoresetMode.NEXT_STEP
    )


def evaluate_run_dir(
    run_dir: Path,
    episodes: int = 10,
    seed: int = 12345,
    opponent: str | None = None,
    video_dir: Path | None = None,
    model_file: str = "model.pt",
) -> list[float]:
    """Greedy returns of a run's saved policy (``model_file``, one of ``MODEL_FILES``); a
    turn-based multi-agent game is played against ``opponent`` (random or scripted; random
    when None). With ``video_dir`` every episode is recorded there (``video_envs``)."""
    from zrl.envs.multiagent.envs import TurnBasedVectorEnv, fixed_opponents

    model, cfg, factories = load_policy(run_dir, model_file)
    env_fn = factories.env_fn()

    def make_envs(n: int) -> Any:
        if video_dir is not None:
            return video_envs(cfg, env_fn, video_dir, n)
        envs = make_vector_env(cfg.env, n, env_fn, evaluation=True)
        if isinstance(envs, TurnBasedVectorEnv):
            envs.opponents = fixed_opponents(envs, opponent or "random", seed)
        elif opponent is not None:
            envs.close()
            raise ValueError(f"--opponent {opponent}: {cfg.env.id} is not a turn-based game")
        return envs

    returns = greedy_returns(model, make_envs, episodes, seed)
    return [float(r) for r in returns]
