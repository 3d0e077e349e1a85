"""Help for a user whose config does not validate: one line per error, and for an unknown
key the key it was most likely meant to be (``did you mean learner.lr?``).

It reads the schema it is given (``zrl.config.experiment.config_schema()``: each top-level key of a
config and its type) and the algorithms' names for their keys (``zrl.config.catalog``); it
imports nothing else from zrl, so ``zrl.config.experiment`` can use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from zrl.config.catalog import catalog

OTHER_NAMES: dict[str, tuple[str, ...]] = {
    "lr": ("learning_rate", "lr"),
    "gamma": ("gamma", "discount"),
    "grad_clip": ("max_grad_norm", "grad_clip", "grad_norm_clipping", "max_grad_norm_clip"),
    "epsilon": ("exploration_final_eps", "exploration_initial_eps", "exploration_fraction")
    + ("start_e", "end_e", "epsilon"),
    "rollout": ("n_steps", "num_steps", "rollout_length", "rollout", "unroll_length"),
    "n_step": ("n_steps", "n_step"),
    "batch_size": ("batch_size",),
    "minibatches": ("num_minibatches", "num_batches_per_epoch"),
    "epochs": ("n_epochs", "update_epochs", "num_epochs", "num_sgd_iter", "epochs"),
    "entropy_coef": ("ent_coef", "entropy_coef", "ent_coeff", "entropy_coeff")
    + ("exploration_loss_coeff",),
    "value_coef": ("vf_coef", "value_coef", "vf_loss_coeff", "value_loss_coeff"),
    "clip": ("clip_range", "clip_coef", "clip_param", "ppo_clip_ratio"),
    "value_clip": ("clip_range_vf", "vf_clip_param", "ppo_clip_value"),
    "gae_lambda": ("gae_lambda", "lambda"),
    "normalize_advantages": ("norm_adv", "normalize_advantage"),
    "max_lag": ("max_policy_lag",),
    "rho_bar": ("vtrace_rho",),
    "c_bar": ("vtrace_c",),
    "tau": ("tau", "polyak"),
}
"""What SB3, CleanRL, RLlib and Sample Factory call a setting zrl has a key for, by the
setting: an algorithm's section key named as a setting here (``ppo.clip``) is suggested for
these names when that algorithm runs (:func:`key_aliases`), others by :func:`other_names`."""


def other_names(**keys: str) -> dict[str, str]:
    """Other libraries' names -> the zrl key, for each setting of :data:`OTHER_NAMES` given as
    ``setting="section.key"`` (``other_names(lr="learner.lr", gamma="ppo.gamma")``)."""
    return {name: key for setting, key in keys.items() for name in OTHER_NAMES[setting]}


# What users of SB3, CleanRL, RLlib and Sample Factory call zrl's keys: an unknown key with
# one of these names is suggested the zrl key. Spelling mistakes of zrl's own names need no
# entry: they are found by closeness to the schema. The names of an algorithm's keys are its
# record's (``Algorithm.key_aliases``, ``shared_key_aliases``); these are the common keys'.
COMMON_KEY_ALIASES: dict[str, str] = {
    **other_names(gamma="replay.gamma", grad_clip="learner.grad_clip", epsilon="actor.epsilon"),
    "target_update_interval": "learner.target_update_interval",
    "target_network_frequency": "learner.target_update_interval",
    "target_network_update_freq": "learner.target_update_interval",
    "buffer_size": "replay.capacity",
    "replay_size": "replay.capacity",
    "replay_buffer_size": "replay.capacity",
    "learning_starts": "replay.min_size",
    "n_envs": "env.num_envs",
    "num_envs": "env.num_envs",
    "num_envs_per_worker": "env.num_envs",
    "num_envs_per_env_runner": "env.num_envs",
    "num_workers": "roles.actors",
    "num_env_runners": "roles.actors",
    "total_timesteps": "stop.env_steps",
    "train_for_env_steps": "stop.env_steps",
    "train_for_seconds": "stop.wall_time",
    "time_limit": "stop.wall_time",
    "env_id": "env.id",
    "env_name": "env.id",
    "env_kwargs": "env.kwargs",
    "env_config": "env.kwargs",
    "max_episode_steps": "env.kwargs.max_episode_steps",
    "net_arch": "model.hidden",
    "hidden_sizes": "model.hidden",
    "fcnet_hiddens": "model.hidden",
    "activation_fn": "model.activation",
    "fcnet_activation": "model.activation",
    "double_q": "learner.double",
    "double_dqn": "learner.double",
    "train_freq": "replay.samples_per_insert",
    "gradient_steps": "replay.samples_per_insert",
    "replay_ratio": "replay.samples_per_insert",
    "prioritized_replay_alpha": "replay.alpha",
    "prioritized_replay_beta": "replay.beta",
    "eval_freq": "evaluator.interval",
    "n_eval_episodes": "evaluator.episodes",
    "reward_threshold": "stop.eval_return",
    "target_return": "stop.eval_return",
}


def key_aliases() -> dict[str, dict[str, str]]:
    """Other libraries' name -> ``{algo: the zrl key meant when algo runs, "*": for any other
    algo}``: the keys of the registered algorithms' sections named as a setting of
    :data:`OTHER_NAMES`, their ``key_aliases`` (which win) and ``shared_key_aliases``, and
    :data:`COMMON_KEY_ALIASES`."""
    algorithms = catalog()
    aliases: dict[str, dict[str, str]] = {}
    for algo in algorithms.names():
        record = algorithms.get(algo)
        for section, model in record.config.items():
            for key in model.model_fields:
                for name in OTHER_NAMES.get(key, ()):
                    aliases.setdefault(name, {})[algo] = f"{section}.{key}"
        for name, key in record.key_aliases.items():
            aliases.setdefault(name, {})[algo] = key
        for name, key in record.shared_key_aliases.items():
            aliases.setdefault(name, {})["*"] = key
    for name, key in COMMON_KEY_ALIASES.items():
        aliases.setdefault(name, {})["*"] = key
    return aliases


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
    algo: str | None = None,
    used: Collection[str] = (),
) -> str | None:
    """The key path an unknown key at ``loc`` of ``schema`` was most likely meant to be, or
    None.

    A near miss in the same section wins (a typo); then a name other libraries use for a zrl
    key (``learning_rate`` -> ``learner.lr``), or a typo of one (``lerning_rate``); then a
    looser match in the same section; then a close name in another section, the sections
    ``algo`` uses (``used``) first. ``algo``: the registry's default if None."""
    *parent, last = loc
    key = str(last).lower().replace("-", "_")
    here = [str(p) for p in parent]
    fields = fields_at(schema, tuple(parent)) or []
    near = _close(key, fields, 0.8)
    if near is not None:
        return ".".join([*here, near])
    aliases = key_aliases()
    alias = aliases.get(key) or aliases.get(_close(key, list(aliases), 0.85) or "")
    if alias is not None:
        target = alias.get(algo or catalog().default()) or alias.get("*")
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
    algo: str | None = None,
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


__all__ = [
    "COMMON_KEY_ALIASES",
    "OTHER_NAMES",
    "Schema",
    "fields_at",
    "format_validation_error",
    "key_aliases",
    "other_names",
    "suggest_key",
]
