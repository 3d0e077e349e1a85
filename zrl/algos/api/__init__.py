"""What an algorithm package gives the generic roles, and what they give it.

An algorithm is a package ``zrl/algos/<name>/`` whose ``__init__.py`` defines ``ALGORITHM``,
an :class:`Algorithm`, and one import in the registry ``zrl.algos.registry`` names it. The roles
never ask which algorithm runs; they ask the ``Algorithm``:

- ``wiring``: where actors send (a replay shard, every learner, or the parameter server), what
  a replay shard stores, what the learner reads, and the action space it is for.
- ``policy``: built once by the actor after WELCOME (:class:`ActorSetup` in); given a batch of
  observations it returns actions plus the extras the actor must record, and at the end of a
  trajectory it turns the recorded steps into the message to send (:class:`ActorPolicy`).
- ``update``: built once by the learner after WELCOME (:class:`LearnerSetup` in); it receives
  the messages of the learner's input, validated, and trains on them (:class:`LearnerUpdate`).
- ``gradient_server``: for an algorithm whose actors send gradients (A3C), built once by the
  parameter server (:class:`GradientServerSetup` in); it receives each gradient, validated,
  and steps the model it owns (:class:`GradientServer`).
- ``model``: the network zrl builds for it when the user gives none.
- ``model_options``: options of that network its own config sets (Ape-X DDPG: ``ddpg.twin``).
- ``config``: the config sections it defines (its pydantic models, by YAML key).
- ``check_config``: the checks of a config that only this algorithm needs.
- ``search_player``: a player that searches with the model (AlphaZero's), which the evaluator
  plays beside the greedy policy.

The heavy parts (``policy``, ``update``, ``gradient_server``, ``model``, ``search_player``)
are its :class:`Pieces`, which its ``pieces`` function imports inside its body (real imports,
which mypy and import-linter see) when a process first uses one: the config and the CLI never
import torch.
It imports nothing else from zrl at run time, so every layer may use it. Its modules:
``algorithm`` (:class:`Algorithm`, :class:`Wiring`), ``actor`` (what the actor and its policy
exchange) and ``learner`` (what the learner or the parameter server and the algorithm's update
or gradient server exchange). This package's names are the public API for an algorithm package
written outside zrl (``from zrl.algos.api import Algorithm, Wiring``); zrl's own code imports
each name from its module.
"""

from zrl.algos.api.actor import ActorPolicy, ActorSetup, BasePolicy, Outgoing, Trajectory
from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring
from zrl.algos.api.learner import (
    BaseUpdate,
    GradientServer,
    GradientServerSetup,
    LearnerServices,
    LearnerSetup,
    LearnerUpdate,
    NonFiniteLossError,
    Priorities,
    UpdateResult,
)

__all__ = [
    "ActorPolicy",
    "ActorSetup",
    "Algorithm",
    "BasePolicy",
    "BaseUpdate",
    "GradientServer",
    "GradientServerSetup",
    "LearnerServices",
    "LearnerSetup",
    "LearnerUpdate",
    "NonFiniteLossError",
    "Pieces",
    "Outgoing",
    "Priorities",
    "Trajectory",
    "UpdateResult",
    "Wiring",
]
