"""``AgentObservationSpace``: its three sizes, equality and pickling (actors ship it to the
learner inside configs and probes), ``split`` into own observation and boolean mask; and
``agent_space`` / ``encode``, the slot layout ``features | mask | state``."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

from zrl.envs.multiagent.spaces import AgentObservationSpace, agent_space, encode


def test_sizes_shape_and_dtype():
    space = AgentObservationSpace((3, 3, 2), mask=9, state=4)
    assert (space.features, space.mask, space.state) == (18, 9, 4)
    assert space.feature_shape == (3, 3, 2)
    assert space.shape == (31,)
    assert space.dtype == np.float32
    assert repr(space) == "AgentObservationSpace(features=(3, 3, 2), mask=9, state=4)"


def test_pickle_round_trip_keeps_the_sizes():
    space = AgentObservationSpace((3, 3, 2), mask=9, state=4)
    for back in (pickle.loads(pickle.dumps(space)), copy.deepcopy(space)):
        assert isinstance(back, AgentObservationSpace)
        assert back == space
        assert hash(back) == hash(space)
        assert (back.feature_shape, back.mask, back.state) == ((3, 3, 2), 9, 4)
        assert back.shape == space.shape


def test_equality_compares_all_three_sizes():
    space = AgentObservationSpace((18,), 9, 0)
    assert space == AgentObservationSpace((18,), 9, 0)
    assert space != AgentObservationSpace((3, 3, 2), 9, 0)  # same flat size, other shape
    assert space != AgentObservationSpace((18,), 0, 9)  # same total, mask vs state
    assert space != AgentObservationSpace((18,), 9, 1)
    assert space != gym.spaces.Box(-np.inf, np.inf, (27,), np.float32)


def test_split_own_observation_and_boolean_mask():
    space = AgentObservationSpace((3, 3, 2), mask=9, state=2)
    rng = np.random.default_rng(0)
    own = rng.integers(0, 2, (5, 3, 3, 2)).astype(np.float32)
    mask = rng.integers(0, 2, (5, 9)).astype(np.float32)
    state = rng.normal(size=(5, 2)).astype(np.float32)
    obs = np.concatenate([own.reshape(5, -1), mask, state], axis=1)
    got_own, got_mask = space.split(obs)
    assert got_own.shape == (5, 3, 3, 2)
    np.testing.assert_array_equal(got_own, own)
    assert got_mask is not None and got_mask.dtype == bool and got_mask.shape == (5, 9)
    np.testing.assert_array_equal(got_mask, mask > 0.5)


def test_split_without_mask_gives_none():
    space = AgentObservationSpace((4,), mask=0, state=3)
    obs = np.arange(14, dtype=np.float32).reshape(2, 7)
    own, mask = space.split(obs)
    assert mask is None
    np.testing.assert_array_equal(own, obs[:, :4])


def test_agent_space_of_a_masked_dict_and_of_a_box():
    board = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(0, 1, (6, 7, 2), np.int8),
            "action_mask": gym.spaces.Box(0, 1, (7,), np.int8),
        }
    )
    assert agent_space(board, None) == AgentObservationSpace((6, 7, 2), 7, 0)
    box = gym.spaces.Box(-1, 1, (18,), np.float32)
    state = gym.spaces.Box(-1, 1, (54,), np.float32)
    assert agent_space(box, state) == AgentObservationSpace((18,), 0, 54)
    with pytest.raises(ValueError, match="not a Box"):
        agent_space(gym.spaces.Discrete(3), None)


def test_encode_lays_out_features_mask_state():
    space = AgentObservationSpace((2, 2), mask=3, state=2)
    raw = {"observation": np.array([[1, 0], [0, 1]], np.int8), "action_mask": np.array([0, 1, 1])}
    out = encode(raw, space, np.array([0.5, -0.5]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1, 0, 0, 1, 0, 1, 1, 0.5, -0.5])
    own, mask = space.split(out[None])
    np.testing.assert_array_equal(own[0], raw["observation"])
    np.testing.assert_array_equal(mask[0], [False, True, True])
    plain = AgentObservationSpace((3,), 0, 0)
    np.testing.assert_array_equal(encode(np.array([1.0, 2.0, 3.0]), plain), [1, 2, 3])
