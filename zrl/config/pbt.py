"""The ``pbt:`` section of an experiment config (population-based training).

Pydantic only (no torch, no numpy): ``zrl.config.experiment`` may import it, and the CLI stays
fast. The rule itself (ranking, exploit pairs, explore) is ``zrl.league.pbt``; the role that
applies it is ``zrl.roles.pbt``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zrl.config.base import Section

MEMBER_PREFIX = "member_"
"""The members' policy names: ``member_0`` .. ``member_<N-1>``."""
MAX_MEMBERS = 64
Factor = Annotated[float, Field(gt=0)]
"""A perturb factor: a finite number > 0."""


def member_names(members: int) -> list[str]:
    """The policy names of ``members`` members."""
    return [f"{MEMBER_PREFIX}{i}" for i in range(members)]


class Bounds(BaseModel):
    """The range a perturbed or resampled hyperparameter stays in (both ends included): a
    section's rules (no unknown keys, finite numbers), held in a map rather than a field."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be at most high ({self.high})")
        return self


class PBTConfig(Section):
    """Population-based training (Jaderberg et al. 2017): ``members`` policies, each with
    its own learner and actors; every ``ready_interval_s`` the ``pbt`` role ranks them by their
    ``fitness`` (mean training episode return, or latest evaluation), and each member of the
    bottom ``exploit_fraction`` copies the weights and optimizer state of one of the top
    ``exploit_fraction`` (exploit) and takes its hyperparameters, perturbed (explore)."""

    members: int = Field(0, ge=0, le=MAX_MEMBERS)
    """Members of the population (at least 2; 0: no PBT). Each is a policy ``member_<i>``
    with one learner (``roles.learners`` must equal it) and the actors ``i``, ``i + N``, ..."""
    ready_interval_s: float = Field(60.0, gt=0, le=86400)
    """Seconds between two rounds of exploit/explore; a member exploited in a round is ranked
    again only after a full interval with its new weights."""
    exploit_fraction: float = Field(0.25, gt=0, le=0.5)
    """The bottom fraction of the ranked members (at least one) copies from the top fraction."""
    perturb: list[Factor] = Field(default_factory=lambda: [0.8, 1.2], min_length=1, max_length=16)
    """Factors one of which, drawn uniformly, multiplies each copied hyperparameter."""
    resample_probability: float = Field(0.25, ge=0, le=1)
    """Chance that a hyperparameter is drawn log-uniformly within its bounds instead."""
    min_episodes: int = Field(5, ge=1, le=10**6)
    """Training episodes a member's actors must have finished before it is ranked (``fitness:
    training``)."""
    fitness: Literal["training", "evaluation"] = "training"
    """What ranks the members: ``training``, the mean return of their actors' recent training
    episodes; ``evaluation``, their latest greedy evaluation (one evaluator per member,
    ``roles.evaluator`` equal to ``members``: evaluator i evaluates ``member_<i>``) of weights
    published since the member was last exploited."""
    hyperparameters: dict[str, Bounds] = Field(
        default_factory=lambda: {"learner.lr": Bounds(low=1e-5, high=1e-2)}
    )
    """The hyperparameters explored and their bounds (``low`` > 0: a resample is
    log-uniform); the keys are those the algorithm's learner can set live (its
    ``Algorithm.population``; PPO: ``learner.lr``, ``ppo.entropy_coef``). Every member starts
    from the config's values, which must lie within the bounds (``ppo.entropy_coef`` defaults
    to 0: set it)."""

    @field_validator("members")
    @classmethod
    def _several(cls, members: int) -> int:
        if members == 1:
            raise ValueError("a population needs at least 2 members (0: no PBT)")
        return members

    @field_validator("hyperparameters")
    @classmethod
    def _some(cls, hp: dict[str, Bounds]) -> dict[str, Bounds]:
        if not hp:
            raise ValueError("name at least one hyperparameter (e.g. learner.lr)")
        return hp
