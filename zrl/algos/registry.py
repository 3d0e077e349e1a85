"""The registry of the algorithms zrl runs, by the name a config's ``algo`` gives.

Each is a package (``zrl/algos/<name>/``, see ``zrl.algos.api``) imported here for real;
adding one is its package and one entry in :data:`BUILT_IN`. ``register`` adds one for the
roles of one process (tests, ``--inproc``, a script's plug-in).

An algorithm package's ``__init__`` is light (its record, its config section models, its
checks; no torch): its heavy pieces are imported inside its ``pieces`` function, when a
process first uses one. So importing this registry costs what validating a config did
before, and the config CLI and the standalone broker stay light.

The config layer, below ``algos``, validates ``algo`` and the algorithms' config sections
through the hook ``zrl.config.catalog``, which this module fills in when imported: every
entry point that validates configs (the CLI, the roles, the run, the broker) imports it
first, and the config layer imports it by name the first time it needs it otherwise.
"""

from __future__ import annotations

from zrl.algos import (
    a3c,
    alphazero,
    apex_ddpg,
    apex_dqn,
    appo,
    impala,
    ppo,
    qmix,
    r2d2,
    sac,
)
from zrl.algos.api.algorithm import Algorithm
from zrl.config import catalog
from zrl.config.base import Section

BUILT_IN: dict[str, Algorithm] = {
    a.name: a
    for a in (
        apex_dqn.ALGORITHM,
        impala.ALGORITHM,
        appo.ALGORITHM,
        ppo.ALGORITHM,
        a3c.ALGORITHM,
        apex_ddpg.ALGORITHM,
        sac.ALGORITHM,
        r2d2.ALGORITHM,
        qmix.ALGORITHM,
        alphazero.ALGORITHM,
    )
}
"""``algo`` name -> the record of a zrl algorithm (every process knows these)."""

_registered: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> None:
    """Make ``algorithm`` runnable as ``algo: <its name>`` by the roles of this process (an
    in-process experiment). Roles in other processes know only :data:`BUILT_IN`."""
    _registered[algorithm.name] = algorithm


def unregister(name: str) -> None:
    """Forget an algorithm ``register`` added (tests; a no-op for one that was not)."""
    _registered.pop(name, None)


def algorithm_names() -> list[str]:
    return [*BUILT_IN, *(n for n in _registered if n not in BUILT_IN)]


def get_algorithm(name: str) -> Algorithm:
    """The :class:`Algorithm` called ``name``; ValueError naming the known ones otherwise."""
    if name in _registered:
        return _registered[name]
    if name not in BUILT_IN:
        raise ValueError(f"unknown algo {name!r}; algorithms are {', '.join(algorithm_names())}")
    return BUILT_IN[name]


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


catalog.install(
    catalog.Catalog(names=algorithm_names, get=get_algorithm, sections=algorithm_sections)
)

__all__ = [
    "BUILT_IN",
    "algorithm_names",
    "algorithm_sections",
    "get_algorithm",
    "register",
    "unregister",
]
