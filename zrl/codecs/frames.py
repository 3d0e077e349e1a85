"""The frame-stack codec: stacks out as single frames on the actor, back to stacks on the learner.

An Atari observation is a uint8 stack ``[k, H, W]`` of the last ``k`` frames, newest last, and
consecutive stacks share ``k - 1`` frames, so they travel as single frames. **Wire format** of
one trajectory, E envs x T steps (:func:`frames_of` builds it): ``frames [E, T + k, H, W]``;
``frames[e, :k-1]`` are the k - 1 older frames of obs_0 and ``frames[e, k-1+i]`` is the newest
frame of obs_i for i = 0..T (obs_T: the final or bootstrap obs), beside the trajectory's
``[E, T]`` arrays (``zrl.transport.messages``: ``frame_transitions``, ``frame_unroll``,
``recurrent_frame_unroll``). obs_i is step i's observation and the observation step i returned
is obs_{i+1}. An R2D2 frame sequence carries the ``T + 1`` positions of one sequence the same
way (``frame_sequences``).

**Episode starts** (gymnasium NEXT_STEP autoreset, as ``Actor.collect`` records it): after a
step t with terminated|truncated, obs_{t+1} is still the old episode's terminal obs; step t+1
only resets the env, is invalid, and returns the new episode's reset obs as obs_{t+2}. Hence::

    obs_{i+1} is the first obs of a new episode  <=>  valid[e, i] is False

so the episode of obs_i begins at obs m = 1 + max{j < i : not valid[e, j]} (its first frame at
row position k-1+m, :func:`episode_first_frames`) and obs_i == frames[e, i:i+k] with the
positions before k-1+m padded. Without such j the episode began at or before obs_0, whose
frames already carry its padding. Padding is zeros (``padding="zero"``, as zrl's Atari envs
stack) or copies of the episode's first frame (``"reset"``, gymnasium's
``FrameStackObservation`` default).

The actor side (:func:`is_frame_space`, :func:`frames_of`) and the replay shard's
(:func:`episode_first_frames`, for ``zrl.replay.frames.FrameTable``) are numpy; the learner's
(:func:`stacks_from_frames`, :func:`sequence_stacks_from_frames`) rebuild every stack of a batch
with one gather on the learner's device and import torch when called, so a replay shard never
loads it.

Sockets: none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from zrl.envs.base import is_single_image

if TYPE_CHECKING:
    from torch import Tensor

Padding = Literal["zero", "reset"]


def is_frame_stack(obs: np.ndarray) -> bool:
    """``[E, T, k, H, W]`` uint8 observations: frame stacks that travel as single frames.
    The shape alone cannot tell RGB ``[3, H, W]`` images from stacks of 3 frames: actors
    check :func:`is_frame_space` of their env's observation space first."""
    return obs.dtype == np.uint8 and obs.ndim == 5


def is_frame_space(space: Any) -> bool:
    """An observation space of uint8 frame stacks ``[k, H, W]``, whose observations travel as
    single frames (``frame_transitions``, ``frame_unroll``). The env decides: a space it
    marked with ``zrl.envs.base.mark_single_image`` (VizDoom's RGB ``[3, H, W]``) is one
    image, not a stack, and its observations travel whole."""
    shape = getattr(space, "shape", None) or ()
    uint8_chw = getattr(space, "dtype", None) == np.uint8 and len(shape) == 3
    return uint8_chw and not is_single_image(space)


def frames_of(obs_t: np.ndarray, final_obs: np.ndarray) -> np.ndarray:
    """Stacked observations ``[E, T, k, H, W]`` and the final one ``[E, k, H, W]`` -> the
    trajectory's ``frames [E, T + k, H, W]``: obs_0's k frames, then the newest frame of
    obs_1..obs_{T-1} and of ``final_obs``."""
    obs_t, final_obs = np.asarray(obs_t), np.asarray(final_obs)
    if obs_t.ndim != 5 or final_obs.shape != (obs_t.shape[0], *obs_t.shape[2:]):
        raise ValueError(
            f"need obs_t [E, T, k, H, W] and final_obs [E, k, H, W], got "
            f"{obs_t.shape} and {final_obs.shape}"
        )
    return np.concatenate([obs_t[:, 0], obs_t[:, 1:, -1], final_obs[:, -1:]], axis=1)


def episode_first_frames(valid: np.ndarray, k: int) -> np.ndarray:
    """``valid [E, T]`` -> ``[E, T + 1]``: the row position of the first frame of obs_i's
    episode where that episode began inside the row (after obs_0), else 0."""
    E, T = valid.shape
    episode = np.zeros((E, T + 1), np.int64)  # the first obs of obs_i's episode, or 0
    episode[:, 1:] = np.maximum.accumulate(np.where(valid, 0, np.arange(1, T + 1)), axis=1)
    return np.where(episode > 0, k - 1 + episode, 0)


def stacks_from_frames(
    frames: Tensor, valid: Tensor, padding: Padding = "zero"
) -> tuple[Tensor, Tensor]:
    """``frames [B, T + k, H, W]`` and ``valid [B, T]`` -> ``(obs [B, T, k, H, W],
    bootstrap_obs [B, k, H, W])`` on ``frames``' device, in its dtype."""
    stacks = all_stacks(frames, valid, padding)
    T = valid.shape[1]
    return stacks[:, :T], stacks[:, T]


def sequence_stacks_from_frames(
    frames: Tensor, first: Tensor, mask: Tensor, padding: Padding = "zero"
) -> Tensor:
    """An R2D2 frame sequence's ``frames [B, T + k, H, W]``, ``first [B, T + 1]`` and
    ``mask [B, T]`` -> its observations ``obs [B, T + 1, k, H, W]`` on ``frames``' device.

    A sequence (``zrl.algos.kernel.sequences``) holds one episode's steps, the real ones
    (``mask``) contiguous, with zero observations before the episode's first position
    (``first``, the front padding of its burn-in) and after the position that follows its last
    real step (the bootstrap observation). A position starts a new stack where ``first`` says
    so or where it lies past that one: the front padding's zero frames then rebuild as zero
    stacks, the episode's first stack is padded (``padding``) and the end padding rebuilds as
    zero stacks, as the actor sent them."""
    import torch

    if first.ndim != 2 or mask.ndim != 2 or first.shape[1] != mask.shape[1] + 1:
        raise ValueError(
            f"need first [B, T + 1] and mask [B, T], got {tuple(first.shape)} and "
            f"{tuple(mask.shape)}"
        )
    real = mask.to(frames.device).bool()
    after_end = ~real & (torch.cumsum(real.int(), dim=1) > 0)  # the steps past the last real
    valid = ~(first[:, 1:].to(frames.device).bool() | after_end)
    return all_stacks(frames, valid, padding)


def all_stacks(frames: Tensor, valid: Tensor, padding: Padding = "zero") -> Tensor:
    """``frames [B, T + k, H, W]`` and ``valid [B, T]`` -> the stacks of all ``T + 1``
    observations ``[B, T + 1, k, H, W]`` (:func:`stacks_from_frames` without the split)."""
    import torch

    if frames.ndim != 4 or valid.ndim != 2 or valid.shape[0] != frames.shape[0]:
        raise ValueError(
            f"need frames [B, T + k, H, W] and valid [B, T], got {tuple(frames.shape)} and "
            f"{tuple(valid.shape)}"
        )
    if padding not in ("zero", "reset"):
        raise ValueError(f"padding must be 'zero' or 'reset', got {padding!r}")
    B, T = valid.shape
    k = frames.shape[1] - T
    if k < 1:
        raise ValueError(f"frames have {frames.shape[1]} per row for {T} steps: need T + k")
    device = frames.device
    steps = torch.arange(1, T + 1, device=device)
    # episode[b, i]: the first obs of obs_i's episode if it began inside the row, else 0
    # (episode_first_frames on the device).
    starts = torch.where(valid.to(device).bool(), torch.zeros_like(steps), steps)
    episode = torch.zeros(B, T + 1, dtype=torch.long, device=device)
    episode[:, 1:] = torch.cummax(starts, dim=1).values
    lowest = torch.where(episode > 0, k - 1 + episode, 0)[:, :, None]  # its first frame's row pos
    index = torch.arange(T + 1, device=device)[:, None] + torch.arange(k, device=device)
    index = index.expand(B, T + 1, k)  # [B, T + 1, k] row positions of obs_i's frames
    rows = torch.arange(B, device=device)[:, None, None]
    stacks = frames[rows, torch.maximum(index, lowest)]  # [B, T + 1, k, H, W]
    if padding == "zero":
        stacks.masked_fill_((index < lowest)[..., None, None], 0)
    return stacks
