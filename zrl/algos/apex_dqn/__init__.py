"""Ape-X DQN (Horgan et al. 2018): epsilon-greedy actors with a spread of epsilons, n-step
transitions in (prioritized) replay, double DQN learners.

- ``losses``: the pure math (targets, Huber loss, one update, Ape-X epsilons, initial priorities).
- ``policy``: the actor side (``ApexDQNPolicy``).
- ``update``: the learner side (``ApexDQNUpdate``).
"""

from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring
from zrl.config.help import other_names

KEY_ALIASES: dict[str, str] = other_names(
    lr="learner.lr", n_step="replay.n_step", batch_size="replay.batch_size"
)
"""What users of SB3, CleanRL, RLlib and Sample Factory call its keys: an unknown key with one
of these names in a config of this algorithm is suggested the zrl key (``zrl.config.help``)."""


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.apex_dqn.policy import ApexDQNPolicy
    from zrl.algos.apex_dqn.update import ApexDQNUpdate
    from zrl.nets.discrete import q_network_for

    return Pieces(policy=ApexDQNPolicy, update=ApexDQNUpdate, model=q_network_for)


ALGORITHM = Algorithm(
    name="apex_dqn",
    summary="Ape-X DQN: epsilon-greedy actors, prioritized n-step replay, double DQN",
    pieces=pieces,
    wiring=Wiring.off_policy("discrete"),
    sections=("replay", "learner"),
    remote_inference=True,
    data_parallel=True,
    key_aliases=KEY_ALIASES,
)
