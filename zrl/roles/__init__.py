"""The roles of a zrl experiment, one class each (see ``zrl.roles.base.Role``)."""

from __future__ import annotations

import importlib

from zrl.roles.base import Role, RoleError

ROLE_MODULES = {
    "actor": "zrl.roles.actor:Actor",
    "replay": "zrl.roles.replay:ReplayServer",
    "params": "zrl.roles.params:ParameterServer",
    "learner": "zrl.roles.learner:Learner",
    "evaluator": "zrl.roles.evaluator:Evaluator",
}

# Where an algorithm needs a different class for a role. `zrl start actor` only learns the
# algorithm from the broker's WELCOME, so ``Role.run`` switches to this class right after
# registering (see ``Role.specialize``).
ALGO_ROLE_MODULES = {
    ("actor", "impala"): "zrl.roles.onpolicy_actor:OnPolicyActor",
    ("actor", "ppo"): "zrl.roles.onpolicy_actor:OnPolicyActor",
    ("actor", "a3c"): "zrl.roles.onpolicy_actor:OnPolicyActor",
    ("actor", "apex_ddpg"): "zrl.roles.continuous_actor:ContinuousActor",
    ("actor", "sac"): "zrl.roles.continuous_actor:ContinuousActor",
    ("learner", "impala"): "zrl.roles.impala_learner:ImpalaLearner",
    ("learner", "apex_ddpg"): "zrl.roles.continuous_learner:ContinuousLearner",
    ("learner", "sac"): "zrl.roles.continuous_learner:ContinuousLearner",
    ("learner", "ppo"): "zrl.roles.ppo_learner:PPOLearner",
}


def role_class(name: str, algo: str | None = None) -> type[Role]:
    """The class of a role by its CLI name, for ``algo`` if given (imported lazily: torch is
    slow to import)."""
    if name not in ROLE_MODULES:
        raise RoleError(f"unknown role {name!r}; roles are {', '.join(ROLE_MODULES)}")
    module, cls = ALGO_ROLE_MODULES.get((name, algo or ""), ROLE_MODULES[name]).split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


__all__ = ["ALGO_ROLE_MODULES", "ROLE_MODULES", "Role", "RoleError", "role_class"]
