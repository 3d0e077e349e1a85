"""The registry of the algorithms zrl runs, by the name a config's ``algo`` gives.

Each is a package (``zrl/algos/<name>/``, see ``zrl.algos.api``); adding one is its package
and one line here. ``register`` adds one for the roles of one process (tests, ``--inproc``).

The registry lives in the config layer, below the algorithms: it names their packages as
strings and imports one only when asked for it, so validating ``algo:`` and the algorithms'
config sections needs no static import of anything above this layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zrl.algos.api.algorithm import Algorithm
    from zrl.config.base import Section

ALGORITHMS: dict[str, str] = {
    "apex_dqn": "zrl.algos.apex_dqn",
    "impala": "zrl.algos.impala",
    "appo": "zrl.algos.appo",
    "ppo": "zrl.algos.ppo",
    "a3c": "zrl.algos.a3c",
    "apex_ddpg": "zrl.algos.apex_ddpg",
    "sac": "zrl.algos.sac",
    "r2d2": "zrl.algos.r2d2",
    "qmix": "zrl.algos.qmix",
    "alphazero": "zrl.algos.alphazero",
}
"""``algo`` name -> the package whose ``ALGORITHM`` describes it."""

_registered: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> None:
    """Make ``algorithm`` runnable as ``algo: <its name>`` by the roles of this process (an
    in-process experiment). Roles in other processes know only ``ALGORITHMS``."""
    _registered[algorithm.name] = algorithm


def unregister(name: str) -> None:
    """Forget an algorithm ``register`` added (tests; a no-op for one that was not)."""
    _registered.pop(name, None)


def algorithm_names() -> list[str]:
    return [*ALGORITHMS, *(n for n in _registered if n not in ALGORITHMS)]


def get_algorithm(name: str) -> Algorithm:
    """The :class:`Algorithm` called ``name``; ValueError naming the known ones otherwise."""
    if name in _registered:
        return _registered[name]
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algo {name!r}; algorithms are {', '.join(algorithm_names())}")
    algorithm = importlib.import_module(ALGORITHMS[name]).ALGORITHM
    assert getattr(algorithm, "name", None) == name, ALGORITHMS[name]
    return algorithm


def algorithm_sections() -> dict[str, type[Section]]:
    """The config sections the algorithms define (``Algorithm.config``), YAML key -> model, in
    registry order: ``ExperimentConfig`` validates every one of them beside its own sections.
    ValueError where two algorithms give one key different models."""
    sections: dict[str, type[Section]] = {}
    for name in algorithm_names():
        for key, model in get_algorithm(name).config.items():
            if sections.setdefault(key, model) is not model:
                raise ValueError(
                    f"algorithm {name}: config section {key!r} is already "
                    f"{sections[key].__name__}, not {model.__name__}"
                )
    return sections


__all__ = [
    "ALGORITHMS",
    "algorithm_names",
    "algorithm_sections",
    "get_algorithm",
    "register",
    "unregister",
]
