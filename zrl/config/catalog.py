"""The config layer's hook for the algorithms: what ``ExperimentConfig`` asks of them (their
names, the record of one, their config sections), filled in by the registry above it.

The registry is ``zrl.algos.registry``, in the ``algos`` layer: it imports the algorithm
packages (light records; their heavy pieces load later) and calls :func:`install` when
imported. The config layer names no algorithm and imports nothing above it: every entry point
that validates a config (the CLI, the roles, the run, the broker) imports the registry first,
and where none did (a script or test that builds an ``ExperimentConfig`` on its own),
:func:`catalog` imports it by its module name, as a plug-in entry point.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zrl.config.base import Section
    from zrl.config.experiment import ExperimentConfig


class WiringView(Protocol):
    """What the config layer reads of an algorithm's wiring (``zrl.algos.api.algorithm.
    Wiring``)."""

    @property
    def learner_input(self) -> str: ...


class AlgorithmView(Protocol):
    """What the config layer reads of an algorithm's record: ``zrl.algos.api.algorithm.
    Algorithm`` is one. A protocol, so that this layer names nothing above it, not even in
    its annotations."""

    @property
    def both_seats(self) -> bool: ...

    @property
    def population(self) -> tuple[str, ...]: ...

    @property
    def wiring(self) -> WiringView: ...

    @property
    def config(self) -> Mapping[str, type[Section]]: ...

    @property
    def key_aliases(self) -> Mapping[str, str]: ...

    @property
    def shared_key_aliases(self) -> Mapping[str, str]: ...

    @property
    def reads(self) -> tuple[str, ...]: ...

    def check(self, cfg: ExperimentConfig) -> None: ...


REGISTRY = "zrl.algos.registry"
"""The module that installs the catalog when imported."""


@dataclass(frozen=True)
class Catalog:
    """The algorithms, as the config layer sees them."""

    names: Callable[[], list[str]]
    """Every ``algo`` a config may name, in registry order."""
    get: Callable[[str], AlgorithmView]
    """The record of ``algo``; ValueError naming the known ones for an unknown name."""
    sections: Callable[[], dict[str, type[Section]]]
    """The config sections the algorithms define, YAML key -> section model."""

    def default(self) -> str:
        """The ``algo`` of a config that names none: the registry's first."""
        return self.names()[0]


_installed: Catalog | None = None


def install(catalog: Catalog) -> None:
    """Make ``catalog`` the algorithms every config of this process validates against."""
    global _installed
    _installed = catalog


def catalog() -> Catalog:
    """The installed catalog, importing the registry (which installs it) on first need."""
    if _installed is None:
        importlib.import_module(REGISTRY)
    assert _installed is not None, f"{REGISTRY} installs the algorithm catalog"
    return _installed
