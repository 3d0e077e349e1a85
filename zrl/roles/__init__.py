"""The roles of a zrl experiment, one class each (see ``zrl.roles.base.Role``)."""

from __future__ import annotations

import importlib

from zrl.roles.base import Role
from zrl.roles.errors import RoleError

ROLE_MODULES = {
    "actor": "zrl.roles.actor:Actor",
    "replay": "zrl.roles.replay:ReplayServer",
    "params": "zrl.roles.params:ParameterServer",
    "learner": "zrl.roles.learner:Learner",
    "evaluator": "zrl.roles.evaluator:Evaluator",
    "league": "zrl.roles.league:LeagueRole",
    "inference": "zrl.roles.inference:InferenceServer",
    "pbt": "zrl.roles.pbt:PBTRole",
}


def role_class(name: str) -> type[Role]:
    """The class of a role by its CLI name (imported lazily: torch is slow to import). Roles
    are the same for every algorithm: each asks ``zrl.algos`` for the algorithm's parts once
    the broker's WELCOME has named it."""
    if name not in ROLE_MODULES:
        raise RoleError(f"unknown role {name!r}; roles are {', '.join(ROLE_MODULES)}")
    module, cls = ROLE_MODULES[name].split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


__all__ = ["ROLE_MODULES", "role_class"]
