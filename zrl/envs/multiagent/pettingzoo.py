"""Where a PettingZoo env id's module is (``pettingzoo/<name>``: PettingZoo's families are
searched; ``<package>/<name>``: another package of PettingZoo envs) and which of its APIs zrl
steps (``env.multiagent.api``: the parallel one where it has one, unless set); and the error a
multi-agent env or mapping zrl cannot run raises.

Sockets: none.
"""

from __future__ import annotations

import importlib
from typing import Any

from zrl.config.multiagent import MultiAgentConfig
from zrl.envs.base import install_line

PETTINGZOO_FAMILIES = ("classic", "butterfly", "sisl", "mpe", "atari")


class MultiAgentEnvError(ValueError):
    """A multi-agent env or mapping zrl cannot run; user-facing."""


def env_module(env_id: str) -> Any:
    """The module of a PettingZoo env id (``pettingzoo/tictactoe_v3`` ->
    ``pettingzoo.classic.tictactoe_v3``, ``mpe2/simple_spread_v3`` -> ``mpe2.simple_spread_v3``)."""
    package, _, name = env_id.partition("/")
    candidates = (
        [f"pettingzoo.{family}.{name}" for family in PETTINGZOO_FAMILIES]
        if package == "pettingzoo"
        else [f"{package}.{name}"]
    )
    for module in candidates:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            if exc.name is not None and not module.startswith(exc.name):
                raise MultiAgentEnvError(f"{env_id}: importing {module} failed: {exc}") from None
    hint = install_line("multiagent")
    raise MultiAgentEnvError(
        f"no PettingZoo env {env_id!r} (tried {', '.join(candidates)}; {hint})"
    )


def env_name(env_id: str) -> str:
    return env_id.partition("/")[2]


def uses_parallel_api(cfg: MultiAgentConfig, module: Any) -> bool:
    if cfg.api == "auto":
        return hasattr(module, "parallel_env")
    if cfg.api == "parallel" and not hasattr(module, "parallel_env"):
        raise MultiAgentEnvError(
            f"env.multiagent.api: parallel: {module.__name__} has no parallel_env"
        )
    return cfg.api == "parallel"
