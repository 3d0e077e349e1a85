"""Argument checks shared by the replay tables, their sum tree and the rate limiter."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an ``int``; ValueError naming ``name`` unless it is an integer (a bool is
    not) and ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
