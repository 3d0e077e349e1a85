"""The parameter server under test: a small CartPole config and weights in its model's layout,
array comparisons, and a publisher known to reach a ``WeightsFollower``. Shared by
``tests/roles/test_params.py``, ``test_hostile_params.py`` and ``test_policies.py``."""

from __future__ import annotations

import numpy as np
import torch

from zrl.config.experiment import ExperimentConfig
from zrl.roles.weights import WeightsFollower
from zrl.testing.fakes import config_model, model_weights
from zrl.testing.inproc import InProc
from zrl.testing.probes import wait_for
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel


def config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "params-test",
            # CartPole's model with one small layer: torso.0 (8, 4), advantage_head (2, 8).
            "model": {"hidden": [8], "dueling": False},
            "broker": {"heartbeat_interval": 0.2, "heartbeat_timeout": 5.0, "setup_grace": 20.0},
        }
    )


def weights(seed: int, **extra: np.ndarray) -> dict[str, np.ndarray]:
    """Random values in the layout of ``config()``'s model, plus ``extra`` arrays."""
    return {**model_weights(config(), seed), **extra}


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k])


def TinyModel() -> torch.nn.Module:  # noqa: N802 - a model class to its callers
    """The model of ``config()``: parameters named and shaped like ``weights()``."""
    return config_model(config())


def model_arrays(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def connected(inproc: InProc, follower: WeightsFollower, sender: str) -> Channel:
    """A publisher whose messages reach ``follower`` (a probe of a kind it drops got through)."""
    pub = inproc.pub(f"probe-{sender}")  # probes late to arrive are not counted as ``sender``

    def through() -> bool:
        pub.send(P.Message(P.METRICS), topic=P.WEIGHTS_TOPIC)
        follower.update()
        return follower.sub.stats.dropped_by_sender.get(pub.sender, 0) > 0

    wait_for(through, timeout=5, interval=0.05)
    pub.sender = sender
    return pub
