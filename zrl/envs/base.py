"""What every env module of zrl shares: the error an env that cannot be made raises, and the
gymnasium namespaces whose package registers them on import."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym
from gymnasium.vector import AutoresetMode


class EnvError(ValueError):
    """An environment that cannot be made or is not supported; user-facing."""


GYMNASIUM_EXTRAS = ("mujoco", "box2d")
"""gymnasium's extras (``gymnasium[mujoco]``) that zrl has an extra of the same name for."""


def install_line(extra: str) -> str:
    """How to install one of zrl's extras (``pyproject.toml``), as the README writes it."""
    return f'pip install -e ".[{extra}]"'


def missing_dependency(env_id: str, exc: gym.error.DependencyNotInstalled) -> EnvError:
    """gymnasium's error for an env whose package is missing, with zrl's install line where
    zrl has the extra: gymnasium names its own (``pip install "gymnasium[mujoco]"``)."""
    for extra in GYMNASIUM_EXTRAS:
        if f"gymnasium[{extra}]" in str(exc):
            return EnvError(f"{env_id!r} needs {extra}: {install_line(extra)}")
    return EnvError(f"cannot make environment {env_id!r}: {exc}")


ENV_NAMESPACE_PACKAGES = {"ALE": ("ale_py", "ale-py")}
"""Namespaces of env ids whose package registers them only when imported (gymnasium >= 1.0
no longer imports it), as (module, pip name)."""


def register_env_namespace(env_id: str) -> None:
    """Import the package that registers ``env_id``'s namespace (``ALE/...``: ale_py) if it
    is installed and has not registered yet; otherwise gymnasium says the namespace is missing."""
    namespace = env_id.split(":")[-1].split("/")[0] if "/" in env_id else None
    if namespace not in ENV_NAMESPACE_PACKAGES:
        return
    if any(spec.namespace == namespace for spec in gym.registry.values()):
        return
    module_name = ENV_NAMESPACE_PACKAGES[namespace][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    gym.register_envs(module)


S = TypeVar("S")
SINGLE_IMAGE = "zrl_single_image"
"""The attribute :func:`mark_single_image` sets on an observation space."""


def mark_single_image(space: S) -> S:
    """``space`` (a uint8 ``[C, H, W]`` Box) marked as one image of C colour channels (RGB),
    not a stack of C frames: zrl then sends and stores whole observations
    (``zrl.codecs.frames.is_frame_space`` is False). Returns ``space``."""
    setattr(space, SINGLE_IMAGE, True)
    return space


def is_single_image(space: object) -> bool:
    """Whether ``space`` was marked by :func:`mark_single_image`."""
    return bool(getattr(space, SINGLE_IMAGE, False))


MAKE_ERRORS: tuple[type[Exception], ...] = (gym.error.Error, TypeError, ValueError)
"""What gymnasium and an env's constructor raise for an env that cannot be made."""


def copies_of(
    env_fn: Callable[[], gym.Env[Any, Any]],
    num_envs: int,
    mode: str,
    what: str,
    errors: tuple[type[Exception], ...] = MAKE_ERRORS,
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_fn()`` as one vector env in NEXT_STEP autoreset: async for
    ``env.vectorization: async``, sync otherwise. One of ``errors`` while making them is an
    EnvError saying it cannot make ``what``."""
    vec_cls = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
    try:
        return vec_cls([env_fn] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    except EnvError:
        raise
    except errors as exc:
        raise EnvError(f"cannot make {what}: {exc}") from None
