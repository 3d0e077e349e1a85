"""Help for a user whose config does not validate: one line per error, and for an unknown
key the key it was most likely meant to be (``did you mean learner.lr?``).

It reads the schema it is given (``zrl.config.experiment.config_schema()``: each top-level key of a
config and its type) and imports nothing from zrl, so ``zrl.config.experiment`` can use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

# What users of SB3, CleanRL, RLlib and Sample Factory call zrl's keys: an unknown key with
# one of these names is suggested the zrl key, per algo ("*": any algo). Spelling mistakes of
# zrl's own names need no entry: they are found by closeness to the schema.
_ON_POLICY_ROLLOUT = {a: "actor.trajectory_length" for a in ("impala", "appo", "ppo", "a3c")}
_OFF_POLICY_N_STEP = {a: "replay.n_step" for a in ("apex_dqn", "apex_ddpg", "sac")}
_REPLAY_ALGOS = ("apex_dqn", "impala", "appo", "apex_ddpg", "sac")
_LR = {
    "apex_dqn": "learner.lr",
    "impala": "learner.lr",
    "appo": "learner.lr",
    "ppo": "learner.lr",
    "a3c": "a3c.lr",
    "apex_ddpg": "ddpg.actor_lr or ddpg.critic_lr",
    "sac": "sac.actor_lr or sac.critic_lr",
}
_GAMMA = {
    "impala": "impala.gamma",
    "appo": "appo.gamma",
    "ppo": "ppo.gamma",
    "a3c": "a3c.gamma",
    "*": "replay.gamma",
}
_ENTROPY = {
    "impala": "impala.entropy_coef",
    "appo": "appo.entropy_coef",
    "a3c": "a3c.entropy_coef",
    "sac": "sac.fixed_alpha",
    "*": "ppo.entropy_coef",
}
_VALUE = {
    "impala": "impala.value_coef",
    "appo": "appo.value_coef",
    "a3c": "a3c.value_coef",
    "*": "ppo.value_coef",
}
_EPOCHS = {"impala": "impala.epochs", "appo": "appo.epochs", "*": "ppo.epochs"}
_CLIP = {"appo": "appo.clip", "*": "ppo.clip"}
_VALUE_CLIP = {"appo": "appo.value_clip", "*": "ppo.value_clip"}
_LAMBDA = {
    "impala": "impala.vtrace_lambda",
    "appo": "appo.vtrace_lambda",
    "a3c": "a3c.gae_lambda",
    "*": "ppo.gae_lambda",
}
_MAX_LAG = {"impala": "impala.max_lag", "appo": "appo.max_lag", "ppo": "ppo.max_lag"}
_GRAD_CLIP = {"a3c": "a3c.grad_clip", "*": "learner.grad_clip"}
_TAU = {"sac": "sac.tau", "*": "ddpg.tau"}
_EPSILON = {"*": "actor.epsilon", "apex_ddpg": "ddpg.noise_sigma"}
KEY_ALIASES: dict[str, dict[str, str]] = {
    "learning_rate": _LR,
    "lr": _LR,
    "gamma": _GAMMA,
    "discount": _GAMMA,
    "n_steps": {**_OFF_POLICY_N_STEP, **_ON_POLICY_ROLLOUT},
    "num_steps": _ON_POLICY_ROLLOUT,
    "rollout_length": _ON_POLICY_ROLLOUT,
    "rollout": _ON_POLICY_ROLLOUT,
    "unroll_length": _ON_POLICY_ROLLOUT,
    "n_step": _OFF_POLICY_N_STEP,
    "batch_size": {"ppo": "ppo.minibatch_size", **{a: "replay.batch_size" for a in _REPLAY_ALGOS}},
    "num_minibatches": {"appo": "appo.minibatches", "*": "ppo.minibatch_size"},
    "num_batches_per_epoch": {"appo": "appo.minibatches", "*": "ppo.minibatch_size"},
    "ent_coef": _ENTROPY,
    "entropy_coef": _ENTROPY,
    "ent_coeff": _ENTROPY,
    "entropy_coeff": _ENTROPY,
    "exploration_loss_coeff": _ENTROPY,
    "vf_coef": _VALUE,
    "value_coef": _VALUE,
    "vf_loss_coeff": _VALUE,
    "value_loss_coeff": _VALUE,
    "clip_range": _CLIP,
    "clip_coef": _CLIP,
    "clip_param": _CLIP,
    "ppo_clip_ratio": _CLIP,
    "clip_range_vf": _VALUE_CLIP,
    "vf_clip_param": _VALUE_CLIP,
    "ppo_clip_value": _VALUE_CLIP,
    "max_policy_lag": _MAX_LAG,
    "vtrace_rho": {"impala": "impala.rho_bar", "appo": "appo.rho_bar"},
    "vtrace_c": {"impala": "impala.c_bar", "appo": "appo.c_bar"},
    "n_epochs": _EPOCHS,
    "update_epochs": _EPOCHS,
    "num_epochs": _EPOCHS,
    "num_sgd_iter": _EPOCHS,
    "epochs": _EPOCHS,
    "gae_lambda": _LAMBDA,
    "lambda": _LAMBDA,
    "norm_adv": {"appo": "appo.normalize_advantages", "*": "ppo.normalize_advantages"},
    "normalize_advantage": {"appo": "appo.normalize_advantages", "*": "ppo.normalize_advantages"},
    "max_grad_norm": _GRAD_CLIP,
    "grad_clip": _GRAD_CLIP,
    "grad_norm_clipping": _GRAD_CLIP,
    "max_grad_norm_clip": _GRAD_CLIP,
    "target_update_interval": {"*": "learner.target_update_interval"},
    "target_network_frequency": {"*": "learner.target_update_interval"},
    "target_network_update_freq": {"*": "learner.target_update_interval"},
    "tau": _TAU,
    "polyak": _TAU,
    "buffer_size": {"*": "replay.capacity"},
    "replay_size": {"*": "replay.capacity"},
    "replay_buffer_size": {"*": "replay.capacity"},
    "learning_starts": {"*": "replay.min_size"},
    "exploration_final_eps": _EPSILON,
    "exploration_initial_eps": _EPSILON,
    "exploration_fraction": _EPSILON,
    "start_e": _EPSILON,
    "end_e": _EPSILON,
    "epsilon": _EPSILON,
    "exploration_noise": {"*": "ddpg.noise_sigma"},
    "action_noise": {"*": "ddpg.noise_sigma"},
    "policy_delay": {"*": "ddpg.policy_delay"},
    "policy_frequency": {"*": "ddpg.policy_delay"},
    "target_policy_noise": {"*": "ddpg.target_noise"},
    "policy_noise": {"*": "ddpg.target_noise"},
    "target_noise_clip": {"*": "ddpg.target_noise_clip"},
    "noise_clip": {"*": "ddpg.target_noise_clip"},
    "q_lr": {"apex_ddpg": "ddpg.critic_lr", "*": "sac.critic_lr"},
    "policy_lr": {"apex_ddpg": "ddpg.actor_lr", "*": "sac.actor_lr"},
    "autotune": {"*": "sac.fixed_alpha"},
    "target_entropy": {"*": "sac.target_entropy"},
    "n_envs": {"*": "env.num_envs"},
    "num_envs": {"*": "env.num_envs"},
    "num_envs_per_worker": {"*": "env.num_envs"},
    "num_envs_per_env_runner": {"*": "env.num_envs"},
    "num_workers": {"*": "roles.actors"},
    "num_env_runners": {"*": "roles.actors"},
    "total_timesteps": {"*": "stop.env_steps"},
    "train_for_env_steps": {"*": "stop.env_steps"},
    "train_for_seconds": {"*": "stop.wall_time"},
    "time_limit": {"*": "stop.wall_time"},
    "env_id": {"*": "env.id"},
    "env_name": {"*": "env.id"},
    "env_kwargs": {"*": "env.kwargs"},
    "env_config": {"*": "env.kwargs"},
    "max_episode_steps": {"*": "env.kwargs.max_episode_steps"},
    "net_arch": {"*": "model.hidden"},
    "hidden_sizes": {"*": "model.hidden"},
    "fcnet_hiddens": {"*": "model.hidden"},
    "activation_fn": {"*": "model.activation"},
    "fcnet_activation": {"*": "model.activation"},
    "double_q": {"*": "learner.double"},
    "double_dqn": {"*": "learner.double"},
    "train_freq": {"*": "replay.samples_per_insert"},
    "gradient_steps": {"*": "replay.samples_per_insert"},
    "replay_ratio": {"*": "replay.samples_per_insert"},
    "prioritized_replay_alpha": {"*": "replay.alpha"},
    "prioritized_replay_beta": {"*": "replay.beta"},
    "eval_freq": {"*": "evaluator.interval"},
    "n_eval_episodes": {"*": "evaluator.episodes"},
    "reward_threshold": {"*": "stop.eval_return"},
    "target_return": {"*": "stop.eval_return"},
}


Schema = Mapping[str, Any]
"""A config's top-level keys and their types (a section's pydantic model, or a plain type)."""


def fields_at(schema: Schema, loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys of the section of ``schema`` at ``loc`` (list indices skipped), or None where
    ``loc`` is no section (a free-form mapping such as env.kwargs)."""
    fields: Schema = schema
    for part in loc:
        if isinstance(part, int):
            continue
        if part not in fields:
            return None
        annotation = fields[part]
        if get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        fields = {k: f.annotation for k, f in annotation.model_fields.items()}
    return list(fields)


def _close(word: str, candidates: list[str], cutoff: float) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return found[0] if found else None


def suggest_key(
    loc: tuple[int | str, ...],
    schema: Schema,
    algo: str = "apex_dqn",
    used: Collection[str] = (),
) -> str | None:
    """The key path an unknown key at ``loc`` of ``schema`` was most likely meant to be, or
    None.

    A near miss in the same section wins (a typo); then a name other libraries use for a zrl
    key (``learning_rate`` -> ``learner.lr``), or a typo of one (``lerning_rate``); then a
    looser match in the same section; then a close name in another section, the sections
    ``algo`` uses (``used``) first."""
    *parent, last = loc
    key = str(last).lower().replace("-", "_")
    here = [str(p) for p in parent]
    fields = fields_at(schema, tuple(parent)) or []
    near = _close(key, fields, 0.8)
    if near is not None:
        return ".".join([*here, near])
    alias = KEY_ALIASES.get(key) or KEY_ALIASES.get(_close(key, list(KEY_ALIASES), 0.85) or "")
    if alias is not None:
        target = alias.get(algo) or alias.get("*")
        if target is not None:
            return target
    near = _close(key, fields, 0.6)
    if near is not None:
        return ".".join([*here, near])
    ranked = []
    for section in schema:
        for name in fields_at(schema, (section,)) or []:
            score = difflib.SequenceMatcher(None, key, name).ratio()
            if score >= 0.8 and f"{section}.{name}" != ".".join(map(str, loc)):
                ranked.append((section not in used, -score, f"{section}.{name}"))
    return min(ranked)[2] if ranked else None


def format_validation_error(
    err: ValidationError,
    schema: Schema,
    algo: str = "apex_dqn",
    used: Collection[str] = (),
) -> str:
    """``err`` as one line, ``path: message`` per error; an unknown key with the key it was
    most likely meant to be (see :func:`suggest_key`), else, in a section, the section's
    keys."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            suggestion = suggest_key(tuple(e["loc"]), schema, algo, used)
            section = e["loc"][:-1]
            keys = fields_at(schema, tuple(section)) if section else None
            if suggestion is not None:
                msg += f" (did you mean {suggestion}?)"
            elif keys:
                msg += f" ({'.'.join(map(str, section))} has {', '.join(keys)})"
        elif "input" in e and e["type"] != "missing":
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{path}: {msg}")
    return "; ".join(lines)


__all__ = ["KEY_ALIASES", "Schema", "fields_at", "format_validation_error", "suggest_key"]
