"""IMPALA (Espeholt et al. 2018): actors that never wait, unrolls through a FIFO replay queue,
a V-trace actor-critic learner that drops unrolls more than ``impala.max_lag`` versions old.

- ``vtrace``: the pure math (V-trace targets, the loss, one update).
- ``policy``: the actor side (``zrl.algos.sampling.CategoricalPolicy``, shared with PPO).
- ``update``: the learner side (``ImpalaUpdate``).
"""

from zrl.algos.api import Algorithm, Wiring

ALGORITHM = Algorithm(
    name="impala",
    summary="IMPALA: asynchronous actors, unrolls through a FIFO queue, V-trace learner",
    wiring=Wiring(
        actions="discrete",
        experience="replay",
        replay_item="unroll",
        replay_tables=("fifo",),
        learner_input="batches",
    ),
    policy="zrl.algos.sampling:CategoricalPolicy",
    update="zrl.algos.impala.update:ImpalaUpdate",
    model="zrl.models:actor_critic_for",
    random_actions=True,
    sections=("replay", "learner", "impala"),
)
