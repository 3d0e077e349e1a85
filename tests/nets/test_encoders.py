"""Image encoders (Nature CNN, IMPALA ResNet) and the MLP encoder: shapes, uint8 scaling,
``auto`` selection, errors, parameter counts, and the CNN Q-network and actor-critic built
from an image observation space (weights round trip, a gradient step reaches the convs)."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.algos.models import build_model
from zrl.config.sections import ModelConfig
from zrl.nets.discrete import (
    ActorCritic,
    QNetwork,
    actor_critic_for,
    build_actor_critic,
    build_q_network,
    q_network_for,
)
from zrl.nets.encoders import (
    ImpalaResNet,
    InputNormalizer,
    MLPEncoder,
    NatureCNN,
    add_input_normalizers,
    build_encoder,
    observe_inputs,
    scale_obs,
    use_channels_last,
)
from zrl.nets.wire import load_arrays, model_to_arrays

torch.set_num_threads(1)

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
VECTOR = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)


def frames(batch: int, seed: int = 0, shape: tuple[int, ...] = (4, 84, 84)) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (batch, *shape), dtype=np.uint8))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("encoder", "features"),
    [(NatureCNN((4, 84, 84)), 512), (ImpalaResNet((4, 84, 84)), 256)],
    ids=["nature_cnn", "impala_resnet"],
)
def test_cnn_output_shapes_and_uint8_scaling(encoder: torch.nn.Module, features: int) -> None:
    torch.manual_seed(0)
    pixels = frames(3)
    with torch.no_grad():
        from_uint8 = encoder(pixels)
        from_float = encoder(pixels.float() / 255)
        flat = encoder(pixels.reshape(3, -1))  # the flat O-wide arrays messages carry
    assert encoder.out_features == features
    assert from_uint8.shape == (3, features) and from_uint8.dtype == torch.float32
    assert torch.equal(from_uint8, from_float)
    assert torch.equal(from_uint8, flat)
    # Float input is used as it is: unscaled pixels give other features.
    with torch.no_grad():
        assert not torch.allclose(encoder(pixels.float()), from_uint8)


def test_scale_obs():
    pixels = torch.tensor([[0, 51, 255]], dtype=torch.uint8)
    torch.testing.assert_close(scale_obs(pixels), torch.tensor([[0.0, 0.2, 1.0]]))
    floats = torch.tensor([[3.0, -2.0]])
    assert scale_obs(floats) is floats
    assert scale_obs(floats.double()).dtype == torch.float32
    assert scale_obs(torch.tensor([[3, 4]])).tolist() == [[3.0, 4.0]]  # int64: not pixels


def test_mlp_encoder_flattens_and_scales_uint8():
    enc = MLPEncoder((2, 3), hidden=(8,), activation="tanh")
    assert enc.out_features == 8 and enc.obs_shape == (2, 3)
    x = torch.randint(0, 256, (4, 2, 3), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(enc(x), enc(x.reshape(4, 6).float() / 255))
    assert MLPEncoder((5,), hidden=()).out_features == 5
    assert list(enc.state_dict()) == ["0.weight", "0.bias"]  # the plain torso's keys


def test_auto_picks_cnn_for_images_and_mlp_for_vectors():
    assert isinstance(build_encoder("auto", ATARI), NatureCNN)
    assert isinstance(build_encoder("auto", VECTOR), MLPEncoder)
    assert isinstance(build_encoder("impala_resnet", ATARI), ImpalaResNet)
    assert isinstance(build_encoder("mlp", ATARI), MLPEncoder)
    assert isinstance(build_q_network(ATARI, gym.spaces.Discrete(6)).torso, NatureCNN)
    assert isinstance(build_q_network(VECTOR, gym.spaces.Discrete(2)).torso, MLPEncoder)
    ac = build_actor_critic(VECTOR, gym.spaces.Discrete(2))
    assert not ac.shared and isinstance(ac.policy_torso, MLPEncoder)
    assert build_actor_critic(ATARI, gym.spaces.Discrete(6)).shared


def test_errors_name_the_shape():
    with pytest.raises(ValueError, match=r"nature_cnn .*\[C, H, W\].*\(5,\)"):
        build_encoder("nature_cnn", VECTOR)
    with pytest.raises(ValueError, match=r"impala_resnet .*\(84, 84\)"):
        build_encoder("impala_resnet", gym.spaces.Box(0, 255, (84, 84), np.uint8))
    small = gym.spaces.Box(0, 255, (4, 35, 84), np.uint8)
    with pytest.raises(ValueError, match=r"at least 36x36, got shape \(4, 35, 84\)"):
        build_encoder("auto", small)
    with pytest.raises(ValueError, match=r"\(4, 35, 84\)"):
        build_q_network(small, gym.spaces.Discrete(6))
    with pytest.raises(ValueError, match="encoder must be one of"):
        build_encoder("resnet", ATARI)
    # The smallest image the Nature CNN takes, and any image size for the ResNet.
    assert NatureCNN((1, 36, 36))(torch.zeros(2, 1, 36, 36)).shape == (2, 512)
    assert ImpalaResNet((3, 5, 7))(torch.zeros(2, 3, 5, 7)).shape == (2, 256)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_resnet"])
def test_image_q_network_shapes(encoder: str, dueling: bool) -> None:
    net = build_q_network(ATARI, gym.spaces.Discrete(6), (64, 64), dueling, encoder)
    assert net.obs_shape == (4, 84, 84) and net.obs_dim == 4 * 84 * 84
    assert (net.value_head is not None) == dueling
    with torch.no_grad():
        q = net(frames(5))
    assert q.shape == (5, 6) and q.dtype == torch.float32


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_resnet"])
def test_image_actor_critic_shares_one_encoder(encoder: str) -> None:
    torch.manual_seed(0)
    ac = build_actor_critic(ATARI, gym.spaces.Discrete(6), encoder=encoder)
    assert ac.shared and ac.obs_dim == 4 * 84 * 84
    assert {name.split(".")[0] for name in ac.state_dict()} == {
        "torso",
        "policy_head",
        "value_head",
    }
    obs = frames(4)
    with torch.no_grad():
        logits, value = ac(obs)
        assert logits.shape == (4, 6) and value.shape == (4,)
        torch.testing.assert_close(ac.policy_logits(obs), logits)
        torch.testing.assert_close(ac.value(obs), value)
        assert ac.act(obs).shape == (4,)
        torch.testing.assert_close(ac.act(obs, deterministic=True), logits.argmax(dim=1))
    # The 0.01-gain policy head starts near uniform.
    assert logits.std(dim=1).max() < 0.1


def test_parameter_counts():
    # Nature DQN with a dueling head for 6 actions (Pong): 1,687,719 parameters.
    q = build_q_network(ATARI, gym.spaces.Discrete(6))
    assert n_params(q) == 1_687_719
    assert n_params(build_q_network(ATARI, gym.spaces.Discrete(6), dueling=False)) == 1_687_206
    assert n_params(NatureCNN((4, 84, 84))) == 1_684_128  # 3136 x 512 of it is the linear
    assert n_params(ImpalaResNet((4, 84, 84))) == 1_089_232  # 3872 x 256 of it is the linear
    # The shared-torso actor-critic: one encoder, 6 logits and a value.
    assert n_params(build_actor_critic(ATARI, gym.spaces.Discrete(6))) == 1_687_719


def test_builders_follow_the_model_config():
    impala = ModelConfig(encoder="impala_resnet")
    assert isinstance(q_network_for(ATARI, gym.spaces.Discrete(6), impala).torso, ImpalaResNet)
    assert isinstance(actor_critic_for(ATARI, gym.spaces.Discrete(6), impala).torso, ImpalaResNet)
    flat = build_model(ATARI, gym.spaces.Discrete(6), ModelConfig(encoder="mlp", hidden=[8]))
    assert isinstance(flat, QNetwork) and isinstance(flat.torso, MLPEncoder)
    ppo = build_model(ATARI, gym.spaces.Discrete(6), ModelConfig(), algo="ppo")
    assert isinstance(ppo, ActorCritic) and isinstance(ppo.torso, NatureCNN)
    assert ModelConfig().encoder == "auto"


def test_cnn_weights_round_trip():
    torch.manual_seed(0)
    src = build_actor_critic(ATARI, gym.spaces.Discrete(6))
    dst = build_actor_critic(ATARI, gym.spaces.Discrete(6))
    arrays = model_to_arrays(src)
    assert list(arrays) == list(src.state_dict())
    assert arrays["torso.convs.0.weight"].shape == (32, 4, 8, 8)
    obs = frames(3)
    with torch.no_grad():
        assert not torch.equal(src(obs)[0], dst(obs)[0])
        load_arrays(dst, arrays)
        assert torch.equal(src(obs)[0], dst(obs)[0]) and torch.equal(src(obs)[1], dst(obs)[1])
    with pytest.raises(ValueError, match="missing keys"):
        load_arrays(build_q_network(ATARI, gym.spaces.Discrete(6), encoder="impala_resnet"), arrays)


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_resnet"])
def test_a_gradient_step_changes_the_conv_weights(encoder: str) -> None:
    torch.manual_seed(0)
    net = build_q_network(ATARI, gym.spaces.Discrete(6), encoder=encoder)
    first_conv = next(m for m in net.torso.modules() if isinstance(m, torch.nn.Conv2d))
    before = first_conv.weight.detach().clone()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = net(frames(4)).pow(2).mean()
    loss.backward()
    assert first_conv.weight.grad is not None and first_conv.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(first_conv.weight.detach(), before)


def test_models_reject_a_mismatched_or_bare_encoder():
    with pytest.raises(ValueError, match=r"obs_dim=10 does not match .*\(4, 84, 84\)"):
        QNetwork(10, 6, encoder=NatureCNN((4, 84, 84)))
    with pytest.raises(ValueError, match="num_actions=0"):
        ActorCritic(None, 0, encoder=NatureCNN((4, 84, 84)))
    with pytest.raises(ValueError, match="obs_shape and out_features"):
        QNetwork(None, 6, encoder=torch.nn.Linear(3, 4))


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_resnet"])
def test_channels_last_computes_the_same_outputs_gradients_and_weights(encoder: str) -> None:
    torch.manual_seed(0)
    plain = build_actor_critic(ATARI, gym.spaces.Discrete(6), encoder=encoder)
    fast = copy.deepcopy(plain)
    assert use_channels_last(fast)
    conv = next(m for m in fast.torso.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    obs = frames(5)
    outputs = []
    for net in (plain, fast):
        logits, values = net(obs)
        (logits.square().mean() + values.square().mean()).backward()
        outputs.append(
            (logits.detach(), values.detach(), {n: p.grad for n, p in net.named_parameters()})
        )
    (l0, v0, g0), (l1, v1, g1) = outputs
    torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(v1, v0, rtol=1e-4, atol=1e-5)
    for name, grad in g0.items():
        torch.testing.assert_close(g1[name], grad, rtol=1e-3, atol=1e-5, msg=name)
    # What the learner publishes is laid out as the actors' contiguous models expect.
    arrays = model_to_arrays(fast)
    for name, tensor in plain.state_dict().items():
        assert arrays[name].flags.c_contiguous
        np.testing.assert_array_equal(arrays[name], tensor.numpy(), err_msg=name)


def test_channels_last_leaves_an_mlp_alone() -> None:
    assert not use_channels_last(build_actor_critic(VECTOR, gym.spaces.Discrete(3)))


def test_input_normalizer_statistics_are_those_of_everything_it_observed() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.uniform(0, 1, (n, 2, 3, 3)).astype(np.float32) for n in (5, 1, 12)]
    norm = InputNormalizer((2, 3, 3))
    for b in batches:
        norm.observe(torch.from_numpy(b))
    norm.observe(torch.zeros((0, 2, 3, 3)))  # an empty batch changes nothing
    seen = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), seen.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), seen.var(axis=0), rtol=1e-4, atol=1e-6)
    assert float(norm.count) == 18
    x = torch.from_numpy(seen[:4])
    expected = (seen[:4] - seen.mean(axis=0)) / np.sqrt(seen.var(axis=0) + 1e-5)
    np.testing.assert_allclose(norm(x).numpy(), np.clip(expected, -5, 5), rtol=1e-4, atol=1e-4)


def test_a_constant_pixel_is_clipped_not_divided_by_zero() -> None:
    norm = InputNormalizer((1, 1, 2))
    norm.observe(torch.tensor([[[[0.5, 0.0]]], [[[0.5, 1.0]]]]))
    out = norm(torch.tensor([[[[0.9, 1.0]]]]))
    assert out[0, 0, 0, 0] == 5.0  # (0.9 - 0.5) / sqrt(1e-5) clipped
    assert out[0, 0, 0, 1] == pytest.approx(1.0, abs=1e-4)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(
    ("channels_last", "device"),
    [(False, "cpu"), (True, "cpu"), pytest.param(False, "cuda", marks=CUDA)],
)
def test_an_encoder_normalizes_uint8_frames_as_the_definition_says(
    channels_last: bool, device: str
) -> None:
    # The encoder folds the /255 into the normalizer's factors; the result must be that of
    # scaling first: clip((x / 255 - mean) / sqrt(var + eps), -5, 5).
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    add_input_normalizers(cnn)
    cnn.to(device)
    if channels_last:
        use_channels_last(cnn)
    seen = frames(8).to(device)
    observe_inputs(cnn, seen)
    scaled = seen.double() / 255
    mean, var = scaled.mean(dim=0), scaled.var(dim=0, unbiased=False)
    assert cnn.normalizer is not None
    torch.testing.assert_close(cnn.normalizer.mean.double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cnn.normalizer.var.double(), var, rtol=1e-4, atol=1e-6)
    obs = frames(3, seed=1).to(device)
    expected = (obs.double() / 255 - cnn.normalizer.mean) / torch.sqrt(cnn.normalizer.var + 1e-5)
    got = cnn.images(obs)
    assert got.dtype == torch.float32 and got.device.type == device
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
    torch.testing.assert_close(got.double(), expected.clamp(-5, 5), rtol=1e-4, atol=1e-4)
    assert torch.equal(seen.cpu(), frames(8))  # observe worked on a copy


def test_input_normalizers_travel_with_the_weights_and_only_observe_updates_them() -> None:
    torch.manual_seed(0)
    learner = build_actor_critic(ATARI, gym.spaces.Discrete(6))
    actor = build_actor_critic(ATARI, gym.spaces.Discrete(6))
    assert add_input_normalizers(learner) and add_input_normalizers(actor)
    assert not add_input_normalizers(build_actor_critic(VECTOR, gym.spaces.Discrete(3)))
    unrolls = frames(6).reshape(2, 3, 4, 84, 84)  # [B, T, C, H, W], as a batch of unrolls
    before = model_to_arrays(learner)
    learner(frames(2))  # a forward pass does not touch the statistics
    assert all(np.array_equal(a, model_to_arrays(learner)[k]) for k, a in before.items())
    observe_inputs(learner, unrolls)
    normalizer = learner.torso.normalizer
    assert normalizer is not None and float(normalizer.count) == 6
    expected_mean = unrolls.reshape(6, 4, 84, 84).float().div(255).mean(dim=0)
    torch.testing.assert_close(normalizer.mean, expected_mean)
    load_arrays(actor, model_to_arrays(learner))
    obs = frames(3, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(actor(obs)[0], learner(obs)[0])


@pytest.mark.parametrize("algo", ["apex_dqn", "r2d2"])
def test_normalize_input_is_refused_where_no_learner_updates_the_statistics(algo: str) -> None:
    from zrl.config.experiment import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=f"model.normalize_input: {algo}'s learner does not"):
        config_from_dict({"algo": algo, "model": {"normalize_input": True}})
    config_from_dict(
        {"algo": "appo", "model": {"normalize_input": True}, "replay": {"table": "fifo"}}
    )
    config_from_dict({"algo": "ppo", "model": {"normalize_input": True}, "roles": {"replay": 0}})
