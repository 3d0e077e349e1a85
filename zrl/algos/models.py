"""The one place that asks the algorithm registry for a model: the network every role of an
experiment builds (the user's ``model_fn``, or the builder its algorithm names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from torch import nn

from zrl.algos.registry import get_algorithm
from zrl.config.experiment import ExperimentConfig
from zrl.config.sections import ModelConfig
from zrl.nets.encoders import add_input_normalizers


def build_model(
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_cfg: ModelConfig,
    algo: str = "apex_dqn",
    model_fn: Callable[..., nn.Module] | None = None,
    **options: Any,
) -> nn.Module:
    """The user's model (``model_fn(observation_space, action_space)``) or zrl's network for
    ``algo``: a QNetwork for apex_dqn, an ActorCritic for impala, appo, a3c and ppo (for
    impala, appo and ppo on a Box action space a GaussianActorCritic), a DDPGModel
    (with a second critic if ``twin=True`` is among ``options``) for apex_ddpg, a SACModel for
    sac. ``options``: keyword arguments of the algorithm's builder (``experiment_model``
    takes them from the config)."""
    if model_fn is None:
        algorithm = get_algorithm(algo)
        return algorithm.model(  # type: ignore[no-any-return]
            observation_space, action_space, model_cfg, **options
        )
    model = model_fn(observation_space, action_space)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"the model factory returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def experiment_model(
    cfg: ExperimentConfig,
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    model_fn: Callable[..., nn.Module] | None = None,
) -> nn.Module:
    """The model of experiment ``cfg``, as every role builds it: :func:`build_model` with the
    builder options the algorithm's own config section sets (``Algorithm.model_options``)."""
    model_options = get_algorithm(cfg.algo).model_options
    options = model_options(cfg) if model_options is not None and model_fn is None else {}
    model = build_model(observation_space, action_space, cfg.model, cfg.algo, model_fn, **options)
    if cfg.model.normalize_input:
        add_input_normalizers(model)
    return model
