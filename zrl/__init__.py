"""zrl: distributed reinforcement learning on ZeroMQ."""

__version__ = "0.1.0"

from zrl.experiment import Experiment, Factories, RunFailed  # noqa: E402

__all__ = ["Experiment", "Factories", "RunFailed", "__version__"]
