"""Experiment scripts: a config plus the user's own env and model factories.

A script is plain Python::

    import gymnasium as gym, torch.nn as nn, zrl

    def make_env():
        return gym.make("CartPole-v1")

    class QNet(nn.Module):
        def __init__(self, observation_space, action_space): ...
        def forward(self, obs): ...          # [B, obs] -> Q-values [B, actions]

    experiment = zrl.Experiment("configs/cartpole_apex_dqn.yaml", env=make_env, model=QNet)

    if __name__ == "__main__":
        experiment.run()                     # the same as `zrl run this_script.py`

A factory is either a callable or an importable reference ``"package.module:name"``; how
factories travel to other hosts, and when a role runs them, is in ``zrl.config.factories``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from zrl.config.experiment import ConfigError, ExperimentConfig, config_from_dict, load_config
from zrl.config.factories import Factories
from zrl.run.supervisor import Supervisor


class RunFailed(RuntimeError):
    """``Experiment.run`` ended because roles kept crashing; ``summary`` is summary.json."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(
            f"the run failed: {summary.get('error')} "
            f"(summary: {summary.get('run_dir')}/summary.json)"
        )
        self.summary = summary


@dataclass
class Experiment:
    """A config (YAML path, dict or ExperimentConfig) with optional env and model factories."""

    config: str | Path | dict[str, Any] | ExperimentConfig
    env: Callable[[], Any] | str | None = None
    model: Callable[..., Any] | str | None = None
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A config path in a script is relative to the script, not to where it is run from
        # (`python examples/x.py` from anywhere, as `zrl run examples/x.py` does).
        if isinstance(self.config, str | Path) and not Path(self.config).is_absolute():
            script = Path(sys._getframe(2).f_code.co_filename)  # whoever called __init__
            candidate = script.parent / self.config
            if script.is_file() and candidate.is_file() and not Path(self.config).is_file():
                self.config = candidate

    def resolved_config(self, extra_overrides: list[str] | None = None) -> ExperimentConfig:
        overrides = [*self.overrides, *(extra_overrides or [])]
        if isinstance(self.config, ExperimentConfig):
            return config_from_dict(self.config.model_dump(mode="json"), overrides)
        if isinstance(self.config, dict):
            return config_from_dict(self.config, overrides)
        return load_config(self.config, overrides)

    @property
    def factories(self) -> Factories:
        return Factories(env=self.env, model=self.model)

    def run(self, **kwargs: Any) -> dict[str, Any]:
        """Run locally under the supervisor (the same as ``zrl run SCRIPT``) and return the
        summary. Raises ``RunFailed`` when roles kept crashing, so a script exits non-zero
        as ``zrl run`` does."""
        overrides = kwargs.pop("overrides", None)
        summary = Supervisor(
            self.resolved_config(overrides), factories=self.factories, **kwargs
        ).run()
        if summary.get("failed"):
            raise RunFailed(summary)
        return summary


def load_experiment(path: str | Path) -> Experiment:
    """Import an experiment script and return the one ``Experiment`` it defines."""
    p = Path(path).resolve()
    if not p.is_file():
        raise ConfigError(f"experiment script not found: {p}")
    name = f"zrl_experiment_{abs(hash(str(p)))}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {p}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(p.parent))  # the script's own helper modules
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(
            f"{p}: the script failed to import: {type(exc).__name__}: {exc}"
        ) from None
    # Ship the script's own functions and classes by value: other hosts don't have the file.
    cloudpickle.register_pickle_by_value(module)
    found = [v for v in vars(module).values() if isinstance(v, Experiment)]
    if len(found) != 1:
        raise ConfigError(f"{p} must define exactly one zrl.Experiment, found {len(found)}")
    return found[0]  # (its relative config path was resolved against the script on creation)
