"""zrl: distributed reinforcement learning on ZeroMQ."""

__version__ = "0.1.0"

from zrl.experiment import Experiment, Factories  # noqa: E402

__all__ = ["Experiment", "Factories", "__version__"]
