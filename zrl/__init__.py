"""zrl: distributed reinforcement learning on ZeroMQ."""

__version__ = "0.1.0"
