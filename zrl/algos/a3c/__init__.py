"""A3C (Mnih et al. 2016): each actor is a worker that computes the actor-critic gradient of
its own rollout and pushes it to the parameter server, which applies it (no learner).

- ``zrl.algos.kernel.policy_gradient``: the pure math (the A2C loss).
- ``policy``: the actor side (``A3CPolicy``: samples actions, then computes the gradient).
- ``server``: the parameter-server side (``A3CGradientServer``: validates, combines and
  applies the gradients with Adam).
"""

from zrl.algos.a3c.config import A3CConfig
from zrl.algos.api.algorithm import Algorithm, Wiring

ALGORITHM = Algorithm(
    name="a3c",
    summary="A3C: workers compute gradients, the parameter server applies them",
    wiring=Wiring(actions="discrete", experience="gradients", learner_input=""),
    policy="zrl.algos.a3c.policy:A3CPolicy",
    update="",
    gradient_server="zrl.algos.a3c.server:A3CGradientServer",
    model="zrl.nets.discrete:actor_critic_for",
    # learner: the parameter server takes learner.torch_threads
    config={"a3c": A3CConfig},
    sections=("learner",),
)
