"""``stacks_from_frames``: the stacks a frame unroll's learner rebuilds are the env's, bit for
bit, across episode ends (both paddings), with the scripted envs of the FrameTable's tests, and
the replay shard's half of the rule (``episode_first_frames``) rebuilds the same ones.
``sequence_stacks_from_frames`` (R2D2's frame sequences) is checked against the sequences the
actor cuts in ``tests/algos/test_r2d2.py``; here its refusals and its GPU variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.frames import Collector, scripted_actions
from zrl.codecs.frames import (
    all_stacks,
    episode_first_frames,
    frames_of,
    sequence_stacks_from_frames,
    stacks_from_frames,
)

REPO = Path(__file__).resolve().parents[2]


def rebuilt(traj: dict[str, np.ndarray], padding: str) -> tuple[np.ndarray, np.ndarray]:
    frames = torch.from_numpy(frames_of(traj["obs"], traj["final_obs"]))
    obs, bootstrap = stacks_from_frames(frames, torch.from_numpy(traj["valid"]), padding)
    assert obs.dtype == bootstrap.dtype == torch.uint8
    return obs.numpy(), bootstrap.numpy()


@pytest.mark.parametrize("padding", ["zero", "reset"])
def test_scripted_episode_ends_rebuild_exact_stacks(padding):
    T, E, k = 8, 5, 4
    collector = Collector(E, k, padding)
    for actions in scripted_actions(T, E):
        traj = collector.collect(actions)
        obs, bootstrap = rebuilt(traj, padding)
        np.testing.assert_array_equal(obs, traj["obs"])
        np.testing.assert_array_equal(bootstrap, traj["final_obs"])


@pytest.mark.parametrize("k,padding", [(1, "zero"), (2, "reset"), (4, "zero"), (4, "reset")])
def test_random_episode_ends_rebuild_exact_stacks(k, padding):
    E, T = 3, 7
    rng = np.random.default_rng(k)
    collector = Collector(E, k, padding, seed=k)
    ends = 0
    for _ in range(6):
        traj = collector.collect(rng.choice(3, size=(T, E), p=[0.6, 0.25, 0.15]))
        ends += int((~traj["valid"]).sum())
        obs, bootstrap = rebuilt(traj, padding)
        np.testing.assert_array_equal(obs, traj["obs"])
        np.testing.assert_array_equal(bootstrap, traj["final_obs"])
    assert ends > 5


@pytest.mark.parametrize("padding", ["zero", "reset"])
def test_the_replay_rule_and_the_learner_gather_agree(padding):
    """A numpy gather from ``episode_first_frames`` (what the FrameTable stores of each
    transition) gives the stacks the learner's torch gather rebuilds."""
    rng = np.random.default_rng(3)
    E, T, k = 5, 11, 4
    frames = rng.integers(1, 256, (E, T + k, 2, 3), dtype=np.uint8)
    valid = rng.random((E, T)) > 0.3
    lowest = episode_first_frames(valid, k)[:, :, None]  # [E, T + 1, 1]
    index = np.arange(T + 1)[:, None] + np.arange(k)  # [T + 1, k] row positions of obs_i
    expected = frames[np.arange(E)[:, None, None], np.maximum(index, lowest)]
    if padding == "zero":
        expected[index < lowest] = 0
    got = all_stacks(torch.from_numpy(frames), torch.from_numpy(valid), padding)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_rejects_frames_that_do_not_fit():
    frames, valid = torch.zeros(2, 5, 3, 3, dtype=torch.uint8), torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="T \\+ k"):
        stacks_from_frames(frames, valid)
    with pytest.raises(ValueError, match="valid"):
        stacks_from_frames(frames, valid[0])
    with pytest.raises(ValueError, match="padding"):
        stacks_from_frames(torch.zeros(2, 8, 3, 3), valid, "edge")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_rebuilds_on_the_gpu():
    traj = Collector(2, 4, seed=2).collect(np.random.default_rng(0).choice(3, size=(9, 2)))
    frames = torch.from_numpy(frames_of(traj["obs"], traj["final_obs"])).cuda()
    obs, bootstrap = stacks_from_frames(frames, torch.from_numpy(traj["valid"]).cuda())
    assert obs.is_cuda
    np.testing.assert_array_equal(obs.cpu().numpy(), traj["obs"])
    np.testing.assert_array_equal(bootstrap.cpu().numpy(), traj["final_obs"])


def test_sequence_stacks_reject_flags_that_do_not_fit():
    frames = torch.zeros(2, 9, 3, 3, dtype=torch.uint8)
    first, mask = torch.zeros(2, 6, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    assert sequence_stacks_from_frames(frames, first, mask).shape == (2, 6, 4, 3, 3)
    with pytest.raises(ValueError, match="first \\[B, T \\+ 1\\]"):
        sequence_stacks_from_frames(frames, first[:, :5], mask)
    with pytest.raises(ValueError, match="T \\+ k"):
        sequence_stacks_from_frames(frames[:, :5], first, mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_rebuilds_sequences_on_the_gpu():
    """A sequence padded in front (its episode starts at position 2) and after its end (the
    bootstrap observation at position 4): rebuilt on the GPU as on the CPU."""
    rng = np.random.default_rng(0)
    frames = torch.from_numpy(rng.integers(1, 256, (1, 9, 3, 3), dtype=np.uint8))
    frames[0, :5] = 0  # positions 0 and 1 are padding: their frames are zeros
    frames[0, 8] = 0  # position 5 lies past the bootstrap observation
    first = torch.tensor([[False, False, True, False, False, False]])
    mask = torch.tensor([[False, False, True, True, False]])
    cpu = sequence_stacks_from_frames(frames, first, mask)
    gpu = sequence_stacks_from_frames(frames.cuda(), first.cuda(), mask.cuda())
    assert gpu.is_cuda
    np.testing.assert_array_equal(gpu.cpu().numpy(), cpu.numpy())
    np.testing.assert_array_equal(cpu[0, 2, 3].numpy(), frames[0, 5].numpy())
    assert not cpu[0, 2, :3].any() and not cpu[0, :2].any() and not cpu[0, 5].any()


def test_the_codec_loads_torch_only_when_the_learner_half_runs():
    """A replay shard reads the episode-start rule without paying torch's import."""
    code = (
        "import sys; import zrl.codecs.frames as f, zrl.replay.frames; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "import numpy as np; f.episode_first_frames(np.ones((1, 2), bool), 4)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
