"""QNetwork shapes and dueling identity; weight (de)serialization round trip and errors;
actor-critic sampling (Gumbel-max) against the softmax probabilities."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from zrl.nets.discrete import (
    ActorCritic,
    QNetwork,
    build_q_network,
    policy_logits,
    sample_categorical,
)
from zrl.nets.wire import load_arrays, model_to_arrays, non_finite_array

torch.set_num_threads(1)


def test_qnetwork_shapes():
    for dueling in (True, False):
        net = QNetwork(5, 3, hidden=(8, 8), dueling=dueling)
        assert net(torch.randn(7, 5)).shape == (7, 3)
    assert QNetwork(5, 3, hidden=()).forward(torch.randn(2, 5)).shape == (2, 3)
    assert (net.value_head is None) and QNetwork(5, 3).value_head is not None


def test_dueling_head_centres_advantages():
    torch.manual_seed(0)
    net = QNetwork(4, 5, hidden=(16,), dueling=True)
    obs = torch.randn(10, 4)
    assert net.value_head is not None
    with torch.no_grad():
        q = net(obs)
        features = net.torso(obs)
        value = net.value_head(features).squeeze(1)
        adv = net.advantage_head(features)
    # mean_a Q(s, a) = V(s), and Q - V are the mean-centred advantages.
    torch.testing.assert_close(q.mean(dim=1), value)
    torch.testing.assert_close(q - value[:, None], adv - adv.mean(dim=1, keepdim=True))


def test_build_q_network_flattens_box():
    obs_space = gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32)
    net = build_q_network(obs_space, gym.spaces.Discrete(4), hidden=(8,), dueling=False)
    assert net.obs_dim == 6 and net.num_actions == 4 and not net.dueling
    batch = torch.as_tensor(np.stack([obs_space.sample() for _ in range(3)]))
    assert net(batch).shape == (3, 4)
    torch.testing.assert_close(net(batch), net(batch.reshape(3, 6)))


def test_build_q_network_rejects_unsupported_spaces():
    box = gym.spaces.Box(-1.0, 1.0, shape=(3,))
    with pytest.raises(ValueError, match="observation space Discrete\\(3\\)"):
        build_q_network(gym.spaces.Discrete(3), gym.spaces.Discrete(2), (8,), True)
    with pytest.raises(ValueError, match="action space Box"):
        build_q_network(box, box, (8,), True)
    with pytest.raises(ValueError, match="start must be 0"):
        build_q_network(box, gym.spaces.Discrete(3, start=1), (8,), True)


def test_qnetwork_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_actions=0"):
        QNetwork(3, 0)
    with pytest.raises(ValueError, match="hidden"):
        QNetwork(3, 2, hidden=(8, 0))


def test_model_to_arrays_round_trip():
    torch.manual_seed(0)
    src, dst = QNetwork(4, 2, hidden=(8,)), QNetwork(4, 2, hidden=(8,))
    arrays = model_to_arrays(src)
    assert list(arrays) == list(src.state_dict())
    for name, array in arrays.items():
        assert isinstance(array, np.ndarray) and array.flags.c_contiguous
        np.testing.assert_array_equal(array, src.state_dict()[name].numpy())
    obs = torch.randn(5, 4)
    assert not torch.equal(src(obs), dst(obs))
    load_arrays(dst, arrays)
    assert torch.equal(src(obs), dst(obs))


def test_model_to_arrays_is_a_snapshot():
    net = QNetwork(4, 2, hidden=(8,))
    arrays = model_to_arrays(net)
    snapshot = {k: v.copy() for k, v in arrays.items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    for name in arrays:
        np.testing.assert_array_equal(arrays[name], snapshot[name])
    # ... and the loaded model does not alias the arrays either.
    load_arrays(net, arrays)
    arrays["advantage_head.bias"][:] = 123.0
    assert not torch.any(net.advantage_head.bias == 123.0)


def test_load_arrays_accepts_read_only_buffers():
    src, dst = QNetwork(3, 2, hidden=(4,)), QNetwork(3, 2, hidden=(4,))
    arrays = model_to_arrays(src)
    frozen = {}
    for name, array in arrays.items():
        view = np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)
        assert not view.flags.writeable
        frozen[name] = view
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_arrays(dst, frozen)
    for name, tensor in dst.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), arrays[name])


def test_load_arrays_errors_name_the_problem_and_leave_model_untouched():
    net = QNetwork(4, 2, hidden=(8,))
    before = model_to_arrays(net)
    good = model_to_arrays(QNetwork(4, 2, hidden=(8,)))

    missing = dict(good)
    del missing["value_head.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['value_head.weight'\]"):
        load_arrays(net, missing)

    extra = {**good, "bogus.weight": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match=r"unexpected keys \['bogus.weight'\]"):
        load_arrays(net, extra)

    # value_head.bias is the last state_dict entry: a partial load would have written the rest.
    wrong = dict(good)
    wrong["value_head.bias"] = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match=r"'value_head.bias'.*\(2,\).*\(1,\)"):
        load_arrays(net, wrong)

    for name, tensor in net.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), before[name])


def test_non_finite_array_names_the_first_array_with_a_nan_or_inf():
    """One min and max per array: NaN and either inf anywhere are found, and finite values
    whose sum would overflow to inf are not taken for one."""
    big = np.full(1000, np.finfo(np.float32).max, np.float32)
    arrays = {"steps": np.arange(5), "empty": np.zeros(0, np.float32), "big": big}
    assert non_finite_array(arrays) is None
    with np.errstate(over="ignore"):
        assert not np.isfinite(big.sum())
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, 517, 999):
            poisoned = big.copy()
            poisoned[where] = bad
            assert non_finite_array({**arrays, "w": np.ones(3, np.float64), "x": poisoned}) == "x"


def test_sample_categorical_draws_the_softmax_probabilities():
    """Gumbel-max over log-probabilities samples each action with its probability: 200k
    draws per row land within 4 standard errors of p, and logp is that of the drawn action."""
    probs = np.array([[0.7, 0.2, 0.1], [0.05, 0.05, 0.9], [1 / 3, 1 / 3, 1 / 3]])
    logp = np.log(probs)
    rng = np.random.default_rng(0)
    n = 200_000
    rows = np.tile(logp, (n, 1))  # row i is distribution i % 3
    actions, chosen = sample_categorical(rows, rng.gumbel(size=rows.shape))
    np.testing.assert_array_equal(chosen, rows[np.arange(len(rows)), actions])
    counts = np.stack([np.bincount(actions[k::3], minlength=3) for k in range(3)])
    stderr = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(counts / n - probs) < 4 * stderr), counts / n


def test_sample_categorical_never_draws_impossible_actions():
    logp = np.array([[-np.inf, 0.0], [np.log(0.5), np.log(0.5)]])  # -inf: a masked action
    rows = np.tile(logp, (5000, 1))
    actions, chosen = sample_categorical(rows, np.random.default_rng(1).gumbel(size=rows.shape))
    assert np.all(actions[0::2] == 1) and np.all(chosen[0::2] == 0.0)
    assert np.isfinite(chosen).all()


def test_policy_logits_of_zrl_and_user_models_agree_with_forward():
    torch.manual_seed(0)
    ac = ActorCritic(4, 3, hidden=(8,))
    obs = torch.randn(5, 4)

    class UserModel(torch.nn.Module):  # only forward -> (logits, values), as a user writes it
        def __init__(self) -> None:
            super().__init__()
            self.inner = ac

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.inner(x)

    with torch.no_grad():
        want = ac(obs)[0]
        torch.testing.assert_close(policy_logits(ac, obs), want)
        torch.testing.assert_close(policy_logits(UserModel(), obs), want)


def test_load_arrays_refuses_non_finite_values_and_leaves_model_untouched():
    net = QNetwork(4, 2, hidden=(8,))
    before = model_to_arrays(net)
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = model_to_arrays(QNetwork(4, 2, hidden=(8,)))
        poisoned["value_head.bias"][0] = bad  # the last entry: a partial load would show
        with pytest.raises(ValueError, match=r"'value_head.bias' holds NaN or inf"):
            load_arrays(net, poisoned)
    for name, tensor in net.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), before[name])
