"""R2D2 (Kapturowski et al. 2019): recurrent Ape-X. Actors with per-slot epsilons carry an
LSTM/GRU state per env, cut their experience into overlapping fixed-length sequences that
keep the state they started from, and send them to prioritized sequence replay; learners
replay each sequence from its stored state after a burn-in, with n-step double-Q targets
under value rescaling, and give each sequence the priority eta * max|td| + (1 - eta) * mean|td|.

- ``losses``: the pure math (value rescaling, n-step double-Q targets, the loss, priorities,
  the burn-in unroll).
- ``sequences``: how the actor cuts sequences (``SequenceCutter``).
- ``policy``: the actor side (``R2D2Policy``).
- ``update``: the learner side (``R2D2Update``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring
from zrl.algos.r2d2.config import R2D2Config

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    r2d2 = cfg.section(R2D2Config)
    steps_after_burn_in = r2d2.sequence_length - r2d2.burn_in
    if cfg.replay.n_step > steps_after_burn_in:
        raise ValueError(
            f"replay.n_step ({cfg.replay.n_step}) must be at most r2d2.sequence_length - "
            f"r2d2.burn_in ({steps_after_burn_in})"
        )
    if cfg.actor.env_groups > 1:
        raise ValueError("r2d2 actors run with actor.env_groups: 1")


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.r2d2.policy import R2D2Policy
    from zrl.algos.r2d2.update import R2D2Update
    from zrl.nets.recurrent import recurrent_q_network_for

    return Pieces(policy=R2D2Policy, update=R2D2Update, model=recurrent_q_network_for)


ALGORITHM = Algorithm(
    name="r2d2",
    summary="R2D2: recurrent Ape-X, stored-state sequences with burn-in, value rescaling",
    pieces=pieces,
    wiring=Wiring.replayed("discrete", "sequences", ("prioritized", "uniform")),
    recurrent=True,
    remote_inference=True,
    config={"r2d2": R2D2Config},
    sections=("replay", "learner"),
    data_parallel=True,
    check_config=check_config,
    sequence_length=lambda cfg: cfg.section(R2D2Config).sequence_length,
)
