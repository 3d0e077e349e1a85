"""Exported policies (``zrl.nets.export``): the ONNX file under onnxruntime and the TorchScript
file give zrl's own forward within 1e-5, at another batch size than they were traced with, for
Q-networks, actor-critics, recurrent models (state in and out over several steps), CNNs on
uint8 frames with input normalization, masked multi-agent slots and continuous policies."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.config.sections import ModelConfig
from zrl.envs.multiagent.spaces import AgentObservationSpace
from zrl.nets.continuous import ddpg_model_for, sac_model_for
from zrl.nets.discrete import ILLEGAL_LOGIT, actor_critic_for, q_network_for
from zrl.nets.encoders import InputNormalizer, add_input_normalizers, observe_inputs
from zrl.nets.export import (
    EXPORT_INSTALL,
    FORMATS,
    FrozenNormalizer,
    export_policy,
    exportable_copy,
    format_of,
    load_exported,
    max_differences,
    reference_outputs,
)
from zrl.nets.recurrent import actor_critic_for as recurrent_actor_critic_for
from zrl.nets.recurrent import recurrent_q_network_for

TOL = 1e-5
CARTPOLE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TWO = gym.spaces.Discrete(2)
FRAMES = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)  # Atari-shaped, the Nature CNN's least
PENDULUM = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
TORQUE = gym.spaces.Box(np.array([-2.0, -0.5], np.float32), np.array([2.0, 1.5], np.float32))


def _obs(space: gym.spaces.Box, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8)
    return rng.standard_normal((batch, *space.shape)).astype(np.float32)


def _exported(model, obs_space, act_space, fmt, tmp_path):
    torch.manual_seed(0)
    path = tmp_path / f"policy.{'onnx' if fmt == 'onnx' else 'pt'}"
    written = export_policy(model, obs_space, act_space, path, fmt)
    run, signature = load_exported(path)
    assert signature == written
    return run, signature


def _compare(model, signature, act_space, run, inputs) -> dict[str, np.ndarray]:
    ref = reference_outputs(model, signature, act_space, inputs)
    got = run(inputs)
    assert set(got) == set(signature.outputs) == set(ref)
    diffs = max_differences(ref, got)
    assert max(diffs.values()) <= TOL, diffs
    return got


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "build, heads",
    [
        (q_network_for, ("q_values",)),  # apex_dqn's dueling Q-network on CartPole
        (actor_critic_for, ("logits", "value")),  # ppo's separate MLPs
    ],
)
def test_feed_forward_policies_match_zrls_forward(build, heads, fmt, tmp_path):
    model = build(CARTPOLE, TWO, ModelConfig(hidden=[16, 16])).eval()
    run, signature = _exported(model, CARTPOLE, TWO, fmt, tmp_path)
    assert signature.inputs == ("obs",) and signature.outputs == ("action", *heads)
    got = _compare(model, signature, TWO, run, {"obs": _obs(CARTPOLE, 7)})  # traced at 2
    assert got["action"].dtype == np.int64 and got["action"].shape == (7,)
    assert np.array_equal(got["action"], got[heads[0]].argmax(axis=1))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "build, core, heads",
    [
        (recurrent_actor_critic_for, "lstm", ("logits", "value")),
        (recurrent_q_network_for, "gru", ("q_values",)),  # r2d2's
    ],
)
def test_recurrent_policies_carry_their_state_in_and_out(build, core, heads, fmt, tmp_path):
    model = build(CARTPOLE, TWO, ModelConfig(hidden=[16], core=core, core_size=8)).eval()
    run, signature = _exported(model, CARTPOLE, TWO, fmt, tmp_path)
    assert signature.inputs == ("obs", "state")
    assert signature.outputs == ("action", *heads, "next_state")
    assert signature.state_size == model.state_size
    ours = theirs = np.zeros((3, signature.state_size), np.float32)
    for t in range(6):  # each side feeds its own next_state back
        obs = _obs(CARTPOLE, 3, seed=t)
        ref = reference_outputs(model, signature, TWO, {"obs": obs, "state": ours})
        got = run({"obs": obs, "state": theirs})
        assert max(max_differences(ref, got).values()) <= TOL
        ours, theirs = ref["next_state"], got["next_state"]
    assert np.abs(ours).max() > 0.01  # the state moved: the comparison covered it


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("build", [q_network_for, actor_critic_for])
def test_cnn_on_uint8_frames_keeps_the_scaling_and_the_input_normalizer(build, fmt, tmp_path):
    model = build(FRAMES, gym.spaces.Discrete(6), ModelConfig(encoder="nature_cnn")).eval()
    assert add_input_normalizers(model)
    frames = torch.from_numpy(_obs(FRAMES, 16, seed=1))
    observe_inputs(model, frames[:, :2] // 3)  # statistics far from the initial 0 and 1
    run, signature = _exported(model, FRAMES, gym.spaces.Discrete(6), fmt, tmp_path)
    assert signature.obs_dtype == "uint8" and signature.obs_shape == FRAMES.shape
    _compare(model, signature, gym.spaces.Discrete(6), run, {"obs": _obs(FRAMES, 3, seed=2)})
    # Without the statistics the outputs differ: the file holds them.
    normalizer = model.torso.normalizer
    assert isinstance(normalizer, InputNormalizer)
    normalizer.mean.zero_()
    ref = reference_outputs(model, signature, gym.spaces.Discrete(6), {"obs": frames.numpy()})
    assert max(max_differences(ref, run({"obs": frames.numpy()})).values()) > 1e-3


@pytest.mark.parametrize("fmt", FORMATS)
def test_masked_multiagent_slots_never_pick_an_illegal_action(fmt, tmp_path):
    space = AgentObservationSpace((5,), mask=3, state=2)
    model = actor_critic_for(space, gym.spaces.Discrete(3), ModelConfig(hidden=[8])).eval()
    run, signature = _exported(model, space, gym.spaces.Discrete(3), fmt, tmp_path)
    obs = _obs(space, 6)
    legal = np.zeros((6, 3), np.float32)
    legal[np.arange(6), np.arange(6) % 3] = 1.0  # one legal action per slot
    obs[:, 5:8] = legal
    got = _compare(model, signature, gym.spaces.Discrete(3), run, {"obs": obs})
    assert np.array_equal(got["action"], np.arange(6) % 3)
    assert np.all(got["logits"][legal == 0] == ILLEGAL_LOGIT)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("build", [ddpg_model_for, sac_model_for])
def test_continuous_policies_give_the_deterministic_action_in_bounds(build, fmt, tmp_path):
    model = build(PENDULUM, TORQUE, ModelConfig(hidden=[16])).eval()
    run, signature = _exported(model, PENDULUM, TORQUE, fmt, tmp_path)
    assert signature.outputs == ("action",)
    got = _compare(model, signature, TORQUE, run, {"obs": 3 * _obs(PENDULUM, 9)})
    assert got["action"].shape == (9, 2)
    assert np.all(got["action"] >= TORQUE.low) and np.all(got["action"] <= TORQUE.high)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gaussian_actor_critic_keeps_its_flat_normalizer(fmt, tmp_path):
    gaussian = pytest.importorskip("zrl.nets.gaussian")
    model = gaussian.gaussian_actor_critic_for(PENDULUM, TORQUE, ModelConfig(hidden=[16])).eval()
    add_input_normalizers(model)
    observe_inputs(model, torch.from_numpy(5 + 3 * _obs(PENDULUM, 64)))
    run, signature = _exported(model, PENDULUM, TORQUE, fmt, tmp_path)
    assert signature.outputs == ("action", "value")
    _compare(model, signature, TORQUE, run, {"obs": 5 + 3 * _obs(PENDULUM, 5, seed=3)})


def test_frozen_normalizer_is_the_running_one_out_of_place():
    normalizer = InputNormalizer((2, 3))
    normalizer.observe(torch.arange(24, dtype=torch.uint8).reshape(4, 2, 3), 1 / 255)
    x = torch.randint(0, 256, (5, 2, 3), dtype=torch.uint8)
    frozen = FrozenNormalizer(normalizer)
    assert torch.equal(frozen(x, 1 / 255), normalizer(x, 1 / 255))
    assert not torch.equal(frozen(x, 1 / 255), (x / 255).clamp(-5, 5))


def test_the_exported_copy_leaves_the_model_as_it_was():
    model = actor_critic_for(FRAMES, TWO, ModelConfig(encoder="nature_cnn"))
    add_input_normalizers(model)
    copied = exportable_copy(model)
    assert isinstance(copied.torso.normalizer, FrozenNormalizer)
    assert isinstance(model.torso.normalizer, InputNormalizer) and model.training


def test_missing_onnx_names_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    model = q_network_for(CARTPOLE, TWO, ModelConfig(hidden=[4]))
    with pytest.raises(ImportError, match=EXPORT_INSTALL.replace("[", r"\[").replace(".", r"\.")):
        export_policy(model, CARTPOLE, TWO, tmp_path / "p.onnx", "onnx")
    assert not (tmp_path / "p.onnx").exists()


@pytest.mark.parametrize("name", ["p.onnx", "p.pt"])
def test_a_foreign_file_is_named(name, tmp_path):
    (tmp_path / name).write_bytes(b"not a policy")
    with pytest.raises(ValueError, match=f"{name} is not a policy zrl exported"):
        load_exported(tmp_path / name)
    with pytest.raises(ValueError, match="ends in .onnx"):
        format_of(tmp_path / "p.bin")


def test_differences_are_absolute_within_one_and_relative_beyond():
    ref = {"value": np.array([0.5, 100.0, -300.0], np.float32), "action": np.array([3, 1])}
    got = {"value": np.array([0.5 + 2e-6, 100.0 + 8e-4, -300.0], np.float32)}
    diffs = max_differences(ref, {**got, "action": np.array([3, 2])})
    assert diffs["value"] == pytest.approx(8e-6, rel=0.01)  # 8e-4 of 100, not 2e-6 of 0.5
    assert diffs["action"] == 1.0
    with pytest.raises(ValueError, match=r"output value: shape \(2,\)"):
        max_differences(ref, {"value": got["value"][:2], "action": np.array([3, 1])})
