"""Greedy evaluation of a policy (Q-network argmax, actor-critic mode or the deterministic
continuous action, clipped to the bounds; recurrent models carry their state), shared by the
evaluator role and ``zrl eval``; and loading a run directory's saved policy, which runs no
code from the directory unless the user allows it (``RunDirTrust``)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from zrl.algos.models import experiment_model
from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import FACTORIES_FILE, Factories, env_id_module
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


def seat_outcome_rates(returns: np.ndarray) -> dict[str, float]:
    """:func:`outcome_rates` per seat of games that each evaluation env played once from its
    first episode: a turn-based vector env gives env ``g`` the first mover's seat when ``g``
    is even, the second's when odd (``TurnBasedVectorEnv`` alternates the learning seat by
    ``g + episode``). Keys ``first_win_rate``, ..., ``second_loss_rate``."""
    out: dict[str, float] = {}
    for seat, games in (("first", returns[0::2]), ("second", returns[1::2])):
        if len(games):
            out.update({f"{seat}_{k}": v for k, v in outcome_rates(games).items()})
    return out


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


TRUST_FIXES = (
    "give the experiment script the run was made from (--script PATH), or pass "
    "--trust-run-dir if you made this run directory or trust whoever did"
)


class UntrustedRunDir(ValueError):
    """A run directory names code (pickled factories, a module to import) that the user did
    not allow: user-facing, it names the file, the value and both fixes (``TRUST_FIXES``)."""


@dataclass(frozen=True)
class RunDirTrust:
    """What code ``zrl eval``, ``zrl export`` and ``zrl run --resume`` may run for a run
    directory. A run directory is data, shared as checkpoints are: nothing in it is unpickled
    or imported unless the user says so on the command line.

    ``script``: the factories of the experiment script the user named (``--script``), used
    instead of the run directory's; ``script_env_id``: that script's ``env.id``. ``trusted``
    (``--trust-run-dir``): unpickle ``factories.pkl`` and import the modules the run
    directory names, as its own run did. ``named_env_id``: the user set ``env.id`` on the
    command line (``--set env.id=...``), so it is theirs whatever it names."""

    script: Factories | None = None
    script_env_id: str | None = None
    trusted: bool = False
    named_env_id: bool = False

    def factories(self, run_dir: Path, refs: dict[str, str], where: Path) -> Factories:
        """The factories to run ``run_dir``'s experiment with: the script's when there is
        one; else, with ``trusted``, ``refs`` (the references ``where`` names) and the pickled
        ``factories.pkl``; else none (zrl's built-in env and model). UntrustedRunDir when
        the run directory names code the user did not allow."""
        pickled = Path(run_dir) / FACTORIES_FILE
        if self.script is not None:
            theirs = self.script.references
            for kind, ref in refs.items():
                if theirs.get(kind) != ref and not self.trusted:
                    own = repr(theirs[kind]) if kind in theirs else "a callable or none"
                    raise UntrustedRunDir(
                        f"{where} names the {kind} factory {ref!r}, the script {own}: not "
                        "imported from the run directory; give the script the run was made "
                        "from, or pass --trust-run-dir to run it with the script's anyway"
                    )
            return Factories(env=self.script.env, model=self.script.model)
        if self.trusted:
            factories = Factories(**refs)
            if pickled.is_file():
                factories = Factories.from_wire(factories.references, pickled.read_bytes())
            return factories
        if pickled.is_file():
            raise UntrustedRunDir(
                f"{pickled} holds the run's pickled env/model factories, and unpickling it "
                f"runs code from the run directory: not loaded; {TRUST_FIXES}"
            )
        if refs:
            kind, ref = next(iter(refs.items()))
            raise UntrustedRunDir(
                f"{where} names the {kind} factory {ref!r}, which imports the module "
                f"{ref.partition(':')[0]!r}: not imported from the run directory; {TRUST_FIXES}"
            )
        return Factories()

    def check_env_id(self, env_id: str, where: Path) -> None:
        """UntrustedRunDir if ``env_id`` (read from ``where``) names a module
        (``package.module:Env-v0``, which gymnasium imports) the user did not allow: an id
        of gymnasium's registry, or of an installed PettingZoo package, needs nothing."""
        module = env_id_module(env_id)
        if module is None or self.trusted or self.named_env_id or env_id == self.script_env_id:
            return
        raise UntrustedRunDir(
            f"{where} names env.id {env_id!r}, which imports the module {module!r}: not "
            f"imported from the run directory; {TRUST_FIXES}"
        )


def load_policy(
    run_dir: Path, name: str = "model.pt", trust: RunDirTrust | None = None
) -> tuple[torch.nn.Module, ExperimentConfig, Factories]:
    """A model saved by ``zrl run`` in ``run_dir/name`` (one of ``MODEL_FILES``; model.pt:
    the weights that met the stop rule), the run's config and factories. The run directory
    is data: its factories and a module env id are taken only as ``trust`` allows
    (``RunDirTrust``; by default none, UntrustedRunDir naming the file)."""
    trust = trust or RunDirTrust()
    path = Path(run_dir) / name
    saved = _read_saved(path)
    try:
        cfg = ExperimentConfig.model_validate(json.loads(saved["config"]))
        weights = {k: v.numpy() for k, v in saved["weights"].items()}
        refs = saved.get("factory_refs", {})
        if not isinstance(refs, dict) or not all(
            k in ("env", "model") and isinstance(v, str) for k, v in refs.items()
        ):
            raise TypeError(f"factory_refs is not env/model references: {refs!r}"[:300])
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say which one
        raise ValueError(f"{path} is not a model zrl saved: {_first_line(exc)}") from None
    factories = trust.factories(Path(run_dir), refs, path)
    trust.check_env_id(cfg.env.id, path)
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
    trust: RunDirTrust | None = None,
) -> list[float]:
    """Greedy returns of a run's saved policy (``model_file``, one of ``MODEL_FILES``; its
    code as ``trust`` allows, ``load_policy``); a turn-based multi-agent game is played
    against ``opponent`` (random or scripted; random when None). With ``video_dir`` every
    episode is recorded there (``video_envs``)."""
    from zrl.envs.multiagent.envs import TurnBasedVectorEnv, fixed_opponents

    model, cfg, factories = load_policy(run_dir, model_file, trust)
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
