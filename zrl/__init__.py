"""zrl: distributed reinforcement learning on ZeroMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zrl.utils.version import __version__

if TYPE_CHECKING:
    from zrl.config.factories import Factories
    from zrl.run.experiment import Experiment, RunFailed

__all__ = ["Experiment", "Factories", "RunFailed", "__version__"]

# Imported on first use: every zrl process imports this package (for __version__), and
# zrl.run.experiment sits on top of everything else (the supervisor, the roles).
_LAZY = {
    "Experiment": "zrl.run.experiment",
    "RunFailed": "zrl.run.experiment",
    "Factories": "zrl.config.factories",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zrl' has no attribute {name!r}")
