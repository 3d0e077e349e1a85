"""``Evaluator``: greedy episodes on fresh envs with the latest weights, on a schedule.

Sockets:

- SUB ``weights`` (topic bus) plus one GET_WEIGHTS at start (late join).
- PUB ``eval`` (topic bus): one EVAL result per evaluation {weights_version, mean,
  std, min, max, episodes}; the supervisor records it and checks the stop target.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.evaluation import greedy_returns
from zrl.roles.base import Role
from zrl.roles.weights import WeightsFollower
from zrl.runtime import limit_torch_threads
from zrl.transport import protocol as P


class Evaluator(Role):
    role = "evaluator"

    def setup(self) -> None:
        limit_torch_threads(1)
        probe = self.make_envs(num_envs=1)
        self.model = self.make_model(probe.single_observation_space, probe.single_action_space)
        probe.close()
        self.model.eval()
        self.weights = WeightsFollower(self, self.model)
        self.publisher = self.open_publisher(P.EVAL_TOPIC)
        self.evaluated_version = 0
        self.next_eval = time.monotonic()
        self.evaluations = 0
        self.last: dict[str, Any] = {}
        self.weights.fetch_latest()

    def step(self) -> None:
        self.weights.update()
        now = time.monotonic()
        # ``==``, not ``<=``: after a params restart from scratch the follower goes back to v1.
        if self.weights.version == self.evaluated_version or now < self.next_eval:
            self.stop_event.wait(0.05)
            return
        self.next_eval = now + self.config.evaluator.interval
        version = self.weights.version
        started = time.monotonic()
        with torch.no_grad():
            returns = greedy_returns(
                self.model, self.make_envs, self.config.evaluator.episodes,
                seed=self.config.seed + 1_000_003 + self.evaluations, on_step=self.tick,
            )  # fmt: skip
        self.evaluated_version = version
        self.evaluations += 1
        self.last = {
            "weights_version": version,
            "mean": float(np.mean(returns)),
            "std": float(np.std(returns)),
            "min": float(np.min(returns)),
            "max": float(np.max(returns)),
            "episodes": len(returns),
            "seconds": round(time.monotonic() - started, 3),
        }
        self.log.info(
            "eval of weights v%d: %.1f +- %.1f over %d episodes",
            version, self.last["mean"], self.last["std"], len(returns),
        )  # fmt: skip
        self.publisher.send(
            P.Message(P.METRICS, meta={"kind": "eval", **self.last}),
            topic=P.EVAL_TOPIC,
            block=False,
        )

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "evaluations": self.evaluations,
            "weights_version": self.weights.version,
        }
        if self.last:
            info["eval_return"] = round(self.last["mean"], 2)
        return info
