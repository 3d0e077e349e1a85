"""What a replay shard accepts on its experience stream, fixed at setup from the config and the
env's spaces, never from a message.

:func:`experience_layout` turns the experiment (algorithm wiring, ``actor.trajectory_length``,
``env.num_envs``, the R2D2 sequence length) and what the env and model say (observation and
action spaces, envs per game, the recurrent state's width) into an :class:`ExperienceLayout`:
the one TRAJECTORY schema the shard's actors send, every dim's size, the observation dtype
and the action range. :meth:`ExperienceLayout.check` refuses anything else with a
ProtocolError (the shard counts and drops it), so the first message cannot choose what the
shard stores: a frame table on a CartPole shard, or a table sized from a forged shape.
:meth:`ExperienceLayout.example` is a message that passes, from which the shard learns the
columns (and bytes) of one stored item before any message comes. On uint8 frame stacks
``[k, H, W]`` (Atari) the schema is its item's frame variant, each frame once:
``frame_transitions``, ``frame_unroll`` (``recurrent_frame_unroll`` with ``model.core``) or
``frame_sequences``. On Box actions an unroll is a ``continuous_unroll`` (float32 actions).

Sockets: none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from zrl.codecs.frames import is_frame_space
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.schema import Schema, Size, validate

ReplayItem = Literal["transitions", "unroll", "sequences"]


@dataclass(frozen=True)
class ExperienceLayout:
    """One TRAJECTORY schema and the sizes of its dims (all but ``E`` for R2D2's sequences,
    any number of which a trajectory may complete), the observations' dtype and the actions'
    range."""

    item: ReplayItem
    schema: Schema
    sizes: dict[str, Size]
    obs_dtype: np.dtype
    num_actions: int | None = None  # discrete: actions in [0, num_actions)
    action_low: np.ndarray | None = field(default=None, compare=False)  # box bounds, [A]
    action_high: np.ndarray | None = field(default=None, compare=False)

    @property
    def frame_table(self) -> bool:
        """Frame transitions, which a :class:`~zrl.replay.frames.FrameTable` stores (a FIFO
        keeps each frame unroll as it came)."""
        return self.schema is M.FRAME_TRANSITIONS

    def dim(self, name: str) -> int:
        """The size of dim ``name`` (not the observation dim)."""
        size = self.sizes[name]
        assert isinstance(size, int), f"dim {name} is a shape"
        return size

    @property
    def stack(self) -> int:
        """Frames per stacked observation (frame layouts)."""
        return self.dim("S") - self.dim("T")

    @property
    def frame_shape(self) -> tuple[int, int]:
        """A single frame's (H, W) (frame layouts)."""
        h, w = self.sizes["O"]  # type: ignore[misc]
        return int(h), int(w)

    def describe(self) -> str:
        dims = ", ".join(f"{d}={v}" for d, v in self.sizes.items())
        return f"{self.schema.name} ({dims}, observations {self.obs_dtype})"

    def check(self, msg: P.Message) -> dict[str, Any]:
        """``msg``'s dim sizes if it is exactly this layout; ProtocolError naming what differs."""
        sizes = validate(msg, self.schema, **self.sizes)
        what = f"{msg.kind} ({self.schema.name}) from {msg.sender or '?'}"
        for name, spec in self.schema.arrays.items():
            if spec.dims[-1:] == (M.OBS,) and msg.arrays[name].dtype != self.obs_dtype:
                raise P.ProtocolError(
                    f"{what} array {name!r} has dtype {msg.arrays[name].dtype}, this shard's "
                    f"env observes {self.obs_dtype}"
                )
        action = msg.arrays["action"]
        if action.size and self.num_actions is not None:
            if action.min() < 0 or action.max() >= self.num_actions:
                raise P.ProtocolError(f"{what} has actions outside [0, {self.num_actions})")
        if action.size and self.action_low is not None and self.action_high is not None:
            if np.any(action < self.action_low) or np.any(action > self.action_high):
                raise P.ProtocolError(f"{what} has actions outside the env's bounds")
        return sizes

    def example(self) -> P.Message:
        """A message of this layout (one item where ``E`` is free): zeros (actions: the value
        in the env's bounds nearest 0), every step valid."""
        sizes = {"E": 1, **self.sizes}
        arrays = {}
        for name, spec in self.schema.arrays.items():
            shape: list[int] = []
            for dim in spec.dims:
                size = sizes[dim]
                shape.extend(size if isinstance(size, tuple) else (size,))
            dtype = self.obs_dtype if spec.dims[-1:] == (M.OBS,) else np.dtype(spec.dtypes[0])
            arrays[name] = np.zeros(shape, dtype)
        if "valid" in arrays:
            arrays["valid"][:] = True
        if "mask" in arrays:
            arrays["mask"][:] = True
        if self.action_low is not None and self.action_high is not None:
            arrays["action"][:] = np.clip(0.0, self.action_low, self.action_high)
        return P.Message(P.TRAJECTORY, meta={"weights_version": 0}, arrays=arrays, sender="example")


def carries_state(item: ReplayItem, recurrent_model: bool) -> bool:
    """Whether items of ``item`` keep the recurrent state their actor started from (so the
    layout needs the model's ``state_size``): R2D2's sequences always, unrolls when the model
    is recurrent (``model.core``), transitions never."""
    return item == "sequences" or (item == "unroll" and recurrent_model)


def envs_per_actor(num_envs: int, env_groups: int, envs_per_game: int) -> int:
    """Rows of an actor's trajectories: ``env.num_envs`` split into ``actor.env_groups``
    vector envs of ``num_envs // env_groups`` games, each game ``envs_per_game`` env slots (a
    multi-agent game: one per agent the actor plays; else 1)."""
    return env_groups * (num_envs // env_groups) * envs_per_game


def experience_layout(
    item: ReplayItem,
    *,
    actions: Literal["discrete", "box", "any"],
    observation_space: Any,
    action_space: Any,
    num_envs: int,
    trajectory_length: int,
    sequence_length: int | None = None,
    state_size: int | None = None,
    team: int = 0,
) -> ExperienceLayout:
    """The TRAJECTORY layout a shard storing ``item`` takes from its actors.

    ``num_envs``: rows per trajectory (:func:`envs_per_actor`); ``trajectory_length``: steps
    per trajectory; ``sequence_length``: steps per R2D2 sequence; ``state_size``: the width of
    the recurrent state the model carries (recurrent unrolls and sequences), else None.
    ``actions``: the algorithm's (``Wiring.actions``); ``any`` follows the env's action space.
    Box unrolls (``continuous_unroll``) carry the Gaussian policy's samples before the actor
    clipped them, so their actions are checked finite, not inside the bounds.

    ``team``: the agents per game of a multi-agent env whose actors send one transition per
    game (``Wiring.team``, QMIX): ``E`` is the games (``num_envs // team``), an observation
    the ``team`` slot observations side by side (``O = team * slot``), an action the joint
    index in ``[0, n ** team)``; 0 for one transition per slot. Team ``sequences`` (QMIX with
    ``model.core``) carry the ``team`` agents' recurrent states side by side
    (``R = team * state_size``)."""
    obs_dtype = M.obs_dtype(observation_space)
    obs_shape = M.obs_shape(observation_space)
    E, T = num_envs, trajectory_length
    num_actions: int | None = None
    low = high = None
    if team:
        if item == "unroll" or actions != "discrete" or obs_dtype != np.float32:
            raise ValueError(
                "team layouts are transitions or sequences of discrete actions over flat slots"
            )
        if num_envs % team:
            raise ValueError(f"{num_envs} slots are not whole games of {team} agents")
        E, obs_shape = num_envs // team, (team * obs_shape[0],)
        if state_size is not None:
            state_size *= team
    sizes: dict[str, Size] = {"O": obs_shape}
    if actions == "any":
        actions = "discrete" if hasattr(action_space, "n") else "box"
    if actions == "discrete":
        num_actions = int(action_space.n) ** max(team, 1)
    else:
        sizes["A"] = math.prod(action_space.shape)
        low = np.asarray(action_space.low, np.float32).reshape(-1)
        high = np.asarray(action_space.high, np.float32).reshape(-1)
    frame_stacks = is_frame_space(observation_space)  # stacks of k frames [k, H, W]
    continuous = actions == "box"
    if item == "transitions":
        frame_stacks &= not continuous  # Box-action transitions carry whole observations
        if frame_stacks:
            sizes.update(S=T + obs_shape[0], O=obs_shape[1:])
        sizes.update(E=E, T=T)
    elif item == "unroll":
        if continuous:
            if state_size is not None or frame_stacks:
                raise ValueError(
                    "Box-action unrolls are feed-forward over flat observations: no recurrent "
                    "state, no frame stacks"
                )
            low = high = None  # unclipped samples: any finite value
        elif state_size is not None:
            sizes["R"] = state_size
        if frame_stacks:
            sizes.update(S=T + obs_shape[0], O=obs_shape[1:])
        sizes.update(E=E, T=T)
    elif item == "sequences":
        if sequence_length is None or state_size is None:
            raise ValueError("a layout of sequences needs sequence_length and state_size")
        continuous = False  # sequences are of discrete actions: Box ones fail the int64 check
        sizes.update(T=sequence_length, P=sequence_length + 1, R=state_size)
        if frame_stacks:  # each sequence's frames once
            sizes.update(S=sequence_length + obs_shape[0], O=obs_shape[1:])
    else:
        raise ValueError(f"no replay layout for items {item!r}")
    recurrent = item == "unroll" and state_size is not None
    schema = M.experience_schema(
        item, frames=frame_stacks, recurrent=recurrent, continuous=continuous
    )
    return ExperienceLayout(item, schema, sizes, obs_dtype, num_actions, low, high)
