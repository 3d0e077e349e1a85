"""Frame stacks rebuilt from single frames on the learner's device: one gather.

A frame unroll (``zrl.transport.messages.FRAME_UNROLL``, the wire format of
``zrl.replay.frames``) carries ``frames [B, T + k, H, W]``: the k frames of obs_0, then the
newest frame of obs_1..obs_T (obs_T: the bootstrap observation). :func:`stacks_from_frames`
rebuilds obs_0..obs_T with the episode-start rule of ``zrl.replay.frames``: obs_{i+1} is the
first obs of a new episode iff ``valid[b, i]`` is False, and the positions of a stack before
its episode's first frame are padding (zeros, or copies of that first frame).
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
    return stacks[:, :T], stacks[:, T]
