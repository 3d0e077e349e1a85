"""Ape-X DQN (Horgan et al. 2018): epsilon-greedy actors with a spread of epsilons, n-step
transitions in (prioritized) replay, double DQN learners.

- ``losses``: the pure math (targets, Huber loss, one update, Ape-X epsilons, initial priorities).
- ``policy``: the actor side (``ApexDQNPolicy``).
- ``update``: the learner side (``ApexDQNUpdate``).
"""

from zrl.algos.api.algorithm import Algorithm, Wiring

ALGORITHM = Algorithm(
    name="apex_dqn",
    summary="Ape-X DQN: epsilon-greedy actors, prioritized n-step replay, double DQN",
    wiring=Wiring.off_policy("discrete"),
    policy="zrl.algos.apex_dqn.policy:ApexDQNPolicy",
    update="zrl.algos.apex_dqn.update:ApexDQNUpdate",
    model="zrl.nets.discrete:q_network_for",
    sections=("replay", "learner"),
    remote_inference=True,
    data_parallel=True,
)
