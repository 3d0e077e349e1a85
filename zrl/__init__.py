"""zrl: distributed reinforcement learning on ZeroMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from zrl.experiment import Experiment, RunFailed
    from zrl.factories import Factories

__all__ = ["Experiment", "Factories", "RunFailed", "__version__"]

# Imported on first use: every zrl process imports this package (for __version__), and
# zrl.experiment sits on top of everything else (the supervisor, the roles).
_LAZY = {
    "Experiment": "zrl.experiment",
    "RunFailed": "zrl.experiment",
    "Factories": "zrl.factories",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zrl' has no attribute {name!r}")
