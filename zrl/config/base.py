"""The base of every config section: what ``zrl.config.experiment`` and the algorithm packages'
``config`` modules build their sections on.

Pydantic only: it imports nothing from zrl, so every layer may use it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: an unknown key is an error (``extra="forbid"``), and so is assigning
    a bad value after construction, and so is an infinite or NaN value of any float field
    (``allow_inf_nan=False``: ``learner.lr: .inf`` names the key, whatever its bounds say)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


__all__ = ["Section"]
