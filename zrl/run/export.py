"""``zrl export``: a run's saved policy as an ONNX or TorchScript file
(``zrl.nets.export``), and its check against zrl's own forward on observations recorded from
a few greedy steps of the run's env."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zrl.config.experiment import ExperimentConfig
from zrl.config.factories import Factories
from zrl.envs.vector import make_vector_env
from zrl.nets.export import (
    SUFFIXES,
    Format,
    Signature,
    export_policy,
    load_exported,
    max_differences,
    policy_module,
    reference_outputs,
)
from zrl.roles.evaluation import RunDirTrust, load_policy
from zrl.transport import messages as M

TOLERANCE = 1e-5
"""The largest difference between an exported policy's outputs and zrl's that passes
(``zrl.nets.export.max_differences``: absolute within +-1, relative beyond)."""


def default_path(run_dir: Path, fmt: Format, model_file: str = "model.pt") -> Path:
    """Where ``zrl export`` writes without ``--out``: ``RUN/policy.onnx`` (or
    ``policy.torchscript.pt``); ``RUN/policy_best.onnx`` for model_best.pt, and so on."""
    tail = Path(model_file).stem.removeprefix("model")
    return Path(run_dir) / f"policy{tail}{SUFFIXES[fmt]}"


def export_run(
    run_dir: Path,
    fmt: Format,
    out: Path | None = None,
    model_file: str = "model.pt",
    trust: RunDirTrust | None = None,
) -> tuple[Path, Signature]:
    """Write the greedy policy of ``run_dir/model_file`` (``zrl.roles.evaluation.MODEL_FILES``;
    the run's code as ``trust`` allows, ``load_policy``) to ``out`` (default:
    :func:`default_path`); where, and its signature."""
    model, cfg, factories = load_policy(run_dir, model_file, trust)
    path = default_path(run_dir, fmt, model_file) if out is None else Path(out)
    envs = make_vector_env(cfg.env, 1, factories.env_fn())
    try:
        spaces = envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()
    return path, export_policy(model, *spaces, path, fmt)


@dataclass
class CheckReport:
    """An exported policy against zrl's forward: the largest difference of each output over
    every recorded step, and how many observations were compared."""

    differences: dict[str, float] = field(default_factory=dict)
    observations: int = 0

    @property
    def max_difference(self) -> float:
        return max(self.differences.values(), default=0.0)

    @property
    def passed(self) -> bool:
        return self.observations > 0 and self.max_difference <= TOLERANCE

    def lines(self) -> list[str]:
        """What ``zrl export --check`` prints."""
        per_output = ", ".join(f"{k} {v:.2e}" for k, v in self.differences.items())
        verdict = "ok" if self.passed else f"FAILED: more than {TOLERANCE:g}"
        return [
            f"compared {self.observations} observations: {per_output}",
            f"max difference {self.max_difference:.2e}: {verdict}",
        ]


def _play_envs(cfg: ExperimentConfig, factories: Factories, n: int, seed: int) -> Any:
    """``n`` evaluation envs of the run (turn-based games against the random opponent)."""
    from zrl.envs.multiagent.envs import TurnBasedVectorEnv, fixed_opponents

    envs = make_vector_env(cfg.env, n, factories.env_fn(), evaluation=True)
    if isinstance(envs, TurnBasedVectorEnv):
        envs.opponents = fixed_opponents(envs, "random", seed)
    return envs


@torch.no_grad()
def check_run(
    run_dir: Path,
    path: Path,
    model_file: str = "model.pt",
    steps: int = 50,
    num_envs: int = 2,
    seed: int = 12345,
    trust: RunDirTrust | None = None,
) -> CheckReport:
    """Run the exported policy at ``path`` and zrl's forward of ``run_dir/model_file`` side
    by side for ``steps`` greedy steps of ``num_envs`` of the run's envs (zrl's actions drive
    the envs); every output compared at every step. A recurrent policy carries its own state
    from step to step in each, zeroed where an episode ends. The run's code as ``trust``
    allows (``load_policy``)."""
    model, cfg, factories = load_policy(run_dir, model_file, trust)
    runner, signature = load_exported(path)
    envs = _play_envs(cfg, factories, num_envs, seed)
    _, expected = policy_module(model, envs.single_observation_space, envs.single_action_space)
    if signature != expected:
        envs.close()
        raise ValueError(
            f"{path} is not a policy of this run's model: it takes {signature.obs_shape} "
            f"observations ({', '.join(signature.inputs)} -> {', '.join(signature.outputs)}), "
            f"the run's model {expected.obs_shape} ({', '.join(expected.inputs)} -> "
            f"{', '.join(expected.outputs)})"
        )
    report = CheckReport()
    try:
        n = envs.num_envs
        dtype = M.obs_dtype(envs.single_observation_space)
        obs, _ = envs.reset(seed=seed)
        ours = np.zeros((n, signature.state_size), np.float32)
        theirs = ours.copy()
        for _ in range(steps):
            batch = np.asarray(obs, dtype=dtype).reshape(n, *signature.obs_shape)
            ref = reference_outputs(
                model, signature, envs.single_action_space, {"obs": batch, "state": ours}
            )
            inputs = {"obs": batch, **({"state": theirs} if signature.state_size else {})}
            got = runner(inputs)
            for name, diff in max_differences(ref, got).items():
                report.differences[name] = max(diff, report.differences.get(name, 0.0))
            report.observations += n
            action = ref["action"]
            obs, _, term, trunc, _ = envs.step(action if action.ndim > 1 else action.astype(int))
            if signature.state_size:
                done = (np.asarray(term) | np.asarray(trunc))[:, None]
                ours = np.where(done, 0.0, ref["next_state"]).astype(np.float32)
                theirs = np.where(done, 0.0, got["next_state"]).astype(np.float32)
    finally:
        envs.close()
    return report
