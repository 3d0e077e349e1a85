"""What a replay shard stores of a TRAJECTORY message: its items, checked, with the initial
priorities the actor computed (:func:`assemble_items`, by the shard's layout). Each
algorithm's ``wiring.replay_item`` names one:
``transitions`` (n-step transitions of Ape-X DQN, DDPG, SAC), ``unroll`` (one whole env
unroll per item, IMPALA/APPO), ``sequences`` (the fixed-length sequences an R2D2 actor cut).
Frame stacks are ``zrl.replay.frames``'s. A malformed message raises ProtocolError (the shard
counts and drops it); every item keeps the weights version that collected it.

Sockets: none.
"""

from __future__ import annotations

import numpy as np

from zrl.codecs.nstep import nstep_transitions
from zrl.replay.layout import ExperienceLayout
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import Schema, validate


def assemble_transitions(
    msg: P.Message, n_step: int, gamma: float, continuous: bool = False
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A TRAJECTORY message -> (n-step transition items, their initial priorities). Each item
    keeps the trajectory's weights version (``M.UNKNOWN_VERSION`` if it carried none).

    ``continuous``: actions are float32 ``[E, T, act_dim]`` (and must be finite) instead of
    int64 ``[E, T]`` indices."""
    sizes = validate(msg, M.experience_schema("transitions", continuous=continuous))
    if continuous and sizes["A"] < 1:
        raise P.ProtocolError("trajectory actions have no dimensions")
    a = msg.arrays
    ns = nstep_transitions(a["reward"], a["terminated"], a["truncated"], a["valid"], n_step, gamma)
    items = {
        "obs": a["obs"][ns.env, ns.start],
        "action": a["action"][ns.env, ns.start],
        "reward": ns.returns.astype(np.float32),
        "discount": ns.discounts.astype(np.float32),
        "next_obs": a["next_obs"][ns.env, ns.end],
        "weights_version": np.full(len(ns.env), M.trajectory_version(msg.meta), np.int64),
    }
    priorities = a["priority"][ns.env, ns.start]
    if not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
        raise P.ProtocolError("trajectory carries non-finite or negative priorities")
    return items, priorities


def assemble_unrolls(msg: P.Message, schema: Schema = M.UNROLL) -> dict[str, np.ndarray]:
    """An IMPALA/APPO TRAJECTORY message -> one queue item per env: its whole ``[T, ...]``
    unroll with the behaviour log-probs and the weights version it was collected with.

    ``schema``: the shard's unroll layout. ``recurrent_unroll`` (the experiment's
    ``model.core`` is set): each item keeps its ``state [R]`` and ``first [T]`` too;
    ``frame_unroll`` (frame stacks): its ``frames [T + k, H, W]`` in place of ``obs`` and
    ``bootstrap_obs``; ``recurrent_frame_unroll``: both; ``continuous_unroll`` (Box actions):
    float32 actions ``[T, A]``. Another kind raises ProtocolError
    (lacks / unexpected array)."""
    unrolls = (
        M.UNROLL,
        M.RECURRENT_UNROLL,
        M.FRAME_UNROLL,
        M.RECURRENT_FRAME_UNROLL,
        M.CONTINUOUS_UNROLL,
    )
    if schema not in unrolls:
        raise ValueError(f"{schema.name} is not an unroll layout")
    E = validate(msg, schema)["E"]
    a = msg.arrays
    try:
        version = M.trajectory_version(msg.meta, required=True)
    except P.ProtocolError as exc:  # a FIFO learner drops unrolls by their lag: it needs one
        raise P.ProtocolError(f"unroll without a valid weights version: {exc}") from None
    items = {name: a[name] for name in schema.arrays}  # and its weights version:
    items["weights_version"] = np.full(E, version, np.int64)
    return items


def assemble_sequences(
    msg: P.Message, schema: Schema = M.SEQUENCES
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """An R2D2 TRAJECTORY of sequences -> (one item per sequence, with its weights version,
    and their initial priorities). ``schema``: the shard's layout, ``sequences`` or
    ``frame_sequences`` (frame stacks: each item keeps its ``frames [T + k, H, W]`` in place
    of ``obs``); a message of the other raises ProtocolError."""
    if schema not in (M.SEQUENCES, M.FRAME_SEQUENCES):
        raise ValueError(f"{schema.name} is not a sequences layout")
    sizes = validate(msg, schema)
    if sizes["P"] != sizes["T"] + 1:
        raise P.ProtocolError(
            f"sequences of {sizes['T']} steps carry {sizes['P']} observations, not {sizes['T'] + 1}"
        )
    if schema is M.FRAME_SEQUENCES and sizes["S"] <= sizes["T"]:
        raise P.ProtocolError(f"sequences of {sizes['T']} steps carry {sizes['S']} frames")
    priorities = msg.arrays["priority"]
    if np.any(priorities < 0):
        raise P.ProtocolError("sequences carry negative priorities")
    versions = msg.arrays["weights_version"]
    if np.any((versions < 0) | (versions > M.MAX_VERSION)):
        raise P.ProtocolError(f"sequence weights versions outside [0, {M.MAX_VERSION}]")
    return {k: v for k, v in msg.arrays.items() if k != "priority"}, priorities


def assemble_items(
    layout: ExperienceLayout, msg: P.Message, n_step: int, gamma: float
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """A TRAJECTORY of ``layout`` (checked against it) -> (the items a shard of that layout
    stores, their initial priorities; None for unrolls, which a FIFO queue keeps without).
    ``n_step`` and ``gamma`` are ``replay.n_step`` and ``replay.gamma`` (transitions only).
    Frame transitions (``layout.frame_table``) go through ``zrl.replay.frames`` instead."""
    if layout.item == "unroll":
        return assemble_unrolls(msg, layout.schema), None
    if layout.item == "sequences":
        return assemble_sequences(msg, layout.schema)
    continuous = layout.schema is M.CONTINUOUS_TRANSITIONS
    return assemble_transitions(msg, n_step, gamma, continuous=continuous)
