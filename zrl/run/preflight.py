"""The checks ``zrl run`` and ``zrl start broker`` make before any role starts.

Roles make the env and the model only after the broker and every role have started; a
mistyped env id, ``env.kwargs`` the env does not take or a model that does not fit the env's
spaces then crash every role, which is restarted with back-off, and gymnasium's "Did you
mean" ends up in a role's log a minute later. One env, one reset and one model cost well
under a second beyond the imports the roles need anyway, so the same mistakes become a
``ConfigError`` that names the key, before anything starts.
"""

from __future__ import annotations

import importlib
from typing import Any

from zrl.algos.registry import algorithm_names, get_algorithm
from zrl.config.experiment import ConfigError, ExperimentConfig, check_fits_machine
from zrl.config.factories import Factories, FactoryError
from zrl.run.sizing import resolve_auto_roles


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _name(fn: Any) -> str:
    return fn if isinstance(fn, str) else getattr(fn, "__qualname__", None) or repr(fn)


def check_env_id(env_id: str, kwargs: dict[str, Any] | None = None) -> None:
    """ConfigError naming ``env.id`` unless gymnasium can make ``env_id``; it carries
    gymnasium's own hint ("Did you mean: `CartPole`?", the versions there are). ``kwargs``
    (``env.kwargs``): a dm_control env with ``pixels`` picks MuJoCo's headless renderer as
    dm_control is imported."""
    import gymnasium as gym
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    from zrl.config.multiagent import is_multiagent
    from zrl.envs.base import ENV_NAMESPACE_PACKAGES, register_env_namespace
    from zrl.envs.multiagent.pettingzoo import MultiAgentEnvError, env_module

    if is_multiagent(env_id):
        try:
            env_module(env_id)
        except MultiAgentEnvError as exc:
            raise ConfigError(f"env.id: {_one_line(exc)}") from None
        return
    module, _, name = env_id.rpartition(":")
    if module:  # "package.module:Env-v0": importing the module registers the env, as in gym.make
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(
                f"env.id {env_id!r}: cannot import {module!r}, which should register it: "
                f"{_one_line(exc)}"
            ) from None
    from zrl.envs.atari import game_name, is_atari
    from zrl.envs.base import EnvError

    if is_atari(name):  # ale-py's name for the game: NoFrameskip-v4 ids have no namespace
        try:
            game_name(name)
        except EnvError as exc:
            raise ConfigError(f"env.id: {_one_line(exc)}") from None
        return
    from zrl.envs.vizdoom import is_vizdoom, scenario_config

    if is_vizdoom(name):  # no gymnasium id: the scenario file, or the install line
        try:
            scenario_config(name)
        except EnvError as exc:
            raise ConfigError(f"env.id: {_one_line(exc)}") from None
        return
    from zrl.envs.dmcontrol import is_dm_control, require_dm_control
    from zrl.envs.minigrid import is_minigrid, require_minigrid

    pixels = bool((kwargs or {}).get("pixels"))  # dm_control: MUJOCO_GL before its import
    for is_family, require in (
        (is_minigrid, require_minigrid),
        (is_dm_control, lambda env: require_dm_control(env, pixels=pixels)),
    ):
        if is_family(name):
            try:  # a missing extra: its install line, before any role starts
                require(name)
            except EnvError as exc:
                raise ConfigError(f"env.id: {_one_line(exc)}") from None
    register_env_namespace(name)
    try:
        namespace, base, version = parse_env_id(name)
        if version is None and find_highest_version(namespace, base) is not None:
            return  # gym.make takes the latest version of an unversioned id
        gym.spec(name)
    except gym.error.Error as exc:
        hint = ""
        if isinstance(exc, gym.error.NamespaceNotFound) and namespace in ENV_NAMESPACE_PACKAGES:
            hint = f" (pip install {ENV_NAMESPACE_PACKAGES[namespace][1]})"
        raise ConfigError(
            f"env.id {env_id!r} is not a registered gymnasium environment: {_one_line(exc)}{hint}"
        ) from None


def _factory(factories: Factories, kind: str) -> Any:
    try:
        return factories.env_fn() if kind == "env" else factories.model_fn()
    except FactoryError as exc:
        raise ConfigError(f"the {kind} factory: {exc}") from None


def check_env(cfg: ExperimentConfig, factories: Factories | None = None) -> tuple[Any, Any]:
    """Make one env of the experiment as the roles do (the user's env factory if there is
    one), reset it and close it; return its (observation space, action space). First, the
    roles this host runs must fit its cores and memory (``check_fits_machine``)."""
    from zrl.envs.vector import make_vector_env

    check_fits_machine(resolve_auto_roles(cfg)[0])
    env_fn = _factory(factories or Factories(), "env")
    if env_fn is None:
        check_env_id(cfg.env.id, cfg.env.kwargs)
    env_cfg = cfg.env
    if env_cfg.vectorization == "async":  # a process per env is not what a probe should cost
        env_cfg = env_cfg.model_copy(update={"vectorization": "sync"})
    try:
        env = make_vector_env(env_cfg, 1, env_fn)
        try:
            env.reset(seed=cfg.seed)
            return env.single_observation_space, env.single_action_space
        finally:
            env.close()
    except Exception as exc:  # noqa: BLE001 - whatever the env raises is the user's to see
        raise ConfigError(_env_failure(cfg, env_fn, exc)) from None


def describe_space(space: Any) -> str:
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if type(space).__name__ == "Box" and shape is not None:  # bounds would fill the line
        return f"Box(shape={shape}, dtype={dtype})"
    return str(space)


def _env_failure(cfg: ExperimentConfig, env_fn: Any, exc: Exception) -> str:
    from zrl.envs.base import EnvError

    why = _one_line(exc) if isinstance(exc, EnvError) else f"{type(exc).__name__}: {_one_line(exc)}"
    if env_fn is not None:
        return f"the env factory {_name(env_fn)} failed: {why}"
    if cfg.env.kwargs:
        import gymnasium as gym

        try:  # the same id without the kwargs: which of the two keys is wrong?
            gym.make(cfg.env.id).close()
        except Exception:  # noqa: BLE001 - the id itself fails too: blame it below
            pass
        else:
            return f"env.kwargs {cfg.env.kwargs!r} do not apply to {cfg.env.id!r}: {why}"
    return f"env.id {cfg.env.id!r}: making and resetting the env failed: {why}"


def check_model(
    cfg: ExperimentConfig,
    observation_space: Any,
    action_space: Any,
    factories: Factories | None = None,
) -> None:
    """Build the model for the env's spaces as the roles do (the user's model factory if
    there is one); a ConfigError says why it does not build."""
    import gymnasium as gym

    from zrl.algos.models import experiment_model

    model_fn = _factory(factories or Factories(), "model")
    try:
        experiment_model(cfg, observation_space, action_space, model_fn)
    except Exception as exc:  # noqa: BLE001 - a user's model may raise anything
        spaces = (
            f"observations {describe_space(observation_space)}, "
            f"actions {describe_space(action_space)}"
        )
        why = f"{type(exc).__name__}: {_one_line(exc)}"
        if model_fn is not None:
            raise ConfigError(
                f"the model factory {_name(model_fn)} does not build for {spaces}: {why}"
            ) from None
        actions = get_algorithm(cfg.algo).wiring.actions
        other = {"box": "discrete", "discrete": "box"}.get(actions)
        if other is not None and isinstance(
            action_space, gym.spaces.Discrete if other == "discrete" else gym.spaces.Box
        ):
            fits = [
                name
                for name in algorithm_names()
                if get_algorithm(name).wiring.actions in (other, "any")
            ]
            raise ConfigError(
                f"algo {cfg.algo!r} is for {'Box' if actions == 'box' else 'Discrete'} actions "
                f"and env.id {cfg.env.id!r} has {describe_space(action_space)}: use "
                f"{', '.join(fits)} ({why})"
            ) from None
        raise ConfigError(
            f"model: the {cfg.algo} model with {cfg.model.model_dump()} does not build for "
            f"env.id {cfg.env.id!r} ({spaces}): {why}"
        ) from None


def preflight(cfg: ExperimentConfig, factories: Factories | None = None) -> None:
    """Every check: the env id, env.kwargs, the env factory, the model."""
    observation_space, action_space = check_env(cfg, factories)
    check_model(cfg, observation_space, action_space, factories)
