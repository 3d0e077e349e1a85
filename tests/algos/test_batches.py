"""``zrl.algos.batches``: the learner's device, batches moved there in order, uint8 kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.algos.batches import (
    DeviceError,
    PendingBatches,
    learner_device,
    policy_lags,
    resolve_device,
    to_device,
    wants_channels_last,
)
from zrl.transport import protocol as P


def batch(i: int, shard: str = "replay-0") -> P.Message:
    arrays = {
        "obs": np.full((3, 4, 8, 8), i, np.uint8),
        "reward": np.full(3, i, np.float32),
        "key": np.arange(3, dtype=np.int64) + 10 * i,
        "weights_version": np.array([i, i, -1], np.int64),
    }
    for a in arrays.values():
        a.flags.writeable = False  # as decoded from a message
    return P.Message(P.BATCH, meta={"shard": shard}, arrays=arrays)


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused_naming_the_value():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match=r"learner.device='cuda:1', but torch sees no GPU"):
        resolve_device("cuda:1")


def test_rollout_learners_stay_on_the_cpu():
    assert learner_device("auto", "rollouts") == torch.device("cpu")
    with pytest.raises(DeviceError, match="learners of rollouts train on the CPU"):
        learner_device("cuda", "rollouts")


def test_cnns_go_channels_last_on_the_cpu_unless_the_config_says_otherwise():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert wants_channels_last("auto", cpu) and not wants_channels_last("auto", cuda)
    assert wants_channels_last("channels_last", cuda)
    assert not wants_channels_last("contiguous", cpu)


def test_to_device_keeps_dtypes_and_copies_only_read_only_arrays():
    writable = np.arange(6, dtype=np.uint8).reshape(2, 3)
    frozen = writable.copy()
    frozen.flags.writeable = False
    out = to_device({"a": writable, "b": frozen}, torch.device("cpu"))
    assert out["a"].dtype == torch.uint8 and out["b"].dtype == torch.uint8
    assert out["a"].data_ptr() == writable.ctypes.data  # wrapped, no copy
    assert out["b"].data_ptr() != frozen.ctypes.data
    assert torch.equal(out["b"], torch.from_numpy(writable))


@pytest.mark.parametrize("background", [False, True])
def test_pending_batches_come_out_in_order_on_the_device(background):
    pending = PendingBatches("cpu", background=background)
    try:
        for i in range(5):
            pending.add(batch(i, shard=f"replay-{i % 2}"))
        assert len(pending) == 5
        for i in range(5):
            got = pending.pop()
            assert got is not None
            assert got.shard == f"replay-{i % 2}"
            np.testing.assert_array_equal(got.keys, np.arange(3) + 10 * i)
            np.testing.assert_array_equal(got.versions, [i, i, -1])  # host-side, for the lag
            assert set(got.tensors) == {"obs", "reward"}
            assert got.tensors["obs"].dtype == torch.uint8  # frames stay uint8 until the model
            assert int(got.tensors["obs"][0, 0, 0, 0]) == i
            got.tensors["reward"] += 1  # writable
        assert pending.pop() is None
    finally:
        pending.close()


def test_a_batch_without_a_shard_is_a_protocol_error():
    msg = batch(0)
    msg.meta.pop("shard")
    with pytest.raises(P.ProtocolError, match="without a shard id"):
        PendingBatches().add(msg)


def test_policy_lags_leave_out_unknown_versions():
    lags = policy_lags(np.array([7, 5, -1, 7, 0], np.int64), 7)
    assert lags.dtype == np.float64 and lags.tolist() == [0.0, 2.0, 0.0, 7.0]
    assert policy_lags(np.full(3, -1, np.int64), 7).size == 0
    assert policy_lags(np.zeros(0, np.int64), 7).size == 0
