"""Frame stacks rebuilt from single frames on the learner's device: one gather.

A frame unroll (``zrl.transport.messages.FRAME_UNROLL``, the wire format of
``zrl.replay.frames``) carries ``frames [B, T + k, H, W]``: the k frames of obs_0, then the
newest frame of obs_1..obs_T (obs_T: the bootstrap observation). :func:`stacks_from_frames`
rebuilds obs_0..obs_T with the episode-start rule of ``zrl.replay.frames``: obs_{i+1} is the
first obs of a new episode iff ``valid[b, i]`` is False, and the positions of a stack before
its episode's first frame are padding (zeros, or copies of that first frame). A recurrent
frame unroll (``RECURRENT_FRAME_UNROLL``) carries its frames the same way.

An R2D2 frame sequence (``FRAME_SEQUENCES``) carries ``frames [B, T + k, H, W]`` of its
``T + 1`` positions, built the same way from the positions' stacks, padding included:
:func:`sequence_stacks_from_frames` rebuilds them from its ``first`` and ``mask``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Padding = Literal["zero", "reset"]


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
    # episode[b, i]: the first obs of obs_i's episode if it began inside the row, else 0.
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
