"""A3C (Mnih et al. 2016): each actor is a worker that computes the actor-critic gradient of
its own rollout and pushes it to the parameter server, which applies it (no learner).

- ``zrl.algos.kernel.policy_gradient``: the pure math (the A2C loss).
- ``policy``: the actor side (``A3CPolicy``: samples actions, then computes the gradient).
- ``server``: the parameter-server side (``A3CGradientServer``: validates, combines and
  applies the gradients with Adam).
"""

from zrl.algos.a3c.config import KEY_ALIASES, A3CConfig
from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.a3c.policy import A3CPolicy
    from zrl.algos.a3c.server import A3CGradientServer
    from zrl.nets.discrete import actor_critic_for

    return Pieces(policy=A3CPolicy, model=actor_critic_for, gradient_server=A3CGradientServer)


ALGORITHM = Algorithm(
    name="a3c",
    summary="A3C: workers compute gradients, the parameter server applies them",
    pieces=pieces,
    wiring=Wiring(actions="discrete", experience="gradients", learner_input=""),
    # learner: the parameter server takes learner.torch_threads
    config={"a3c": A3CConfig},
    sections=("learner",),
    key_aliases=KEY_ALIASES,
)
