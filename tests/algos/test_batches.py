"""``zrl.algos.kernel.batches``: the learner's device, batches moved there in order, uint8
kept, host buffers reused (on the CPU unpinned; on a GPU, when there is one, pinned and copied
on a stream of their own)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.algos.kernel.batches import (
    DeviceError,
    HostStaging,
    PendingBatches,
    policy_lags,
    resolve_device,
    to_device,
    wants_channels_last,
)
from zrl.transport import protocol as P

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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


def frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False  # as decoded from a message
    return arr


def unroll_arrays(i: int, envs: int = 4) -> dict[str, np.ndarray]:
    """A small frame-unroll batch whose values depend on ``i`` (``[E, T + k, H, W]`` frames)."""
    rng = np.random.default_rng(i)
    return {
        "frames": frozen(rng.integers(0, 256, (envs, 7, 6, 5), dtype=np.uint8)),
        "reward": frozen(rng.standard_normal((envs, 3)).astype(np.float32)),
        "action": frozen(rng.integers(0, 6, (envs, 3), dtype=np.int64)),
        "valid": frozen(rng.integers(0, 2, (envs, 3)).astype(bool)),
    }


def test_staging_copies_read_only_arrays_exactly_into_host_buffers():
    staging = HostStaging(torch.device("cpu"), pin=False)
    arrays = unroll_arrays(0)
    staged = staging.stage(arrays)
    assert set(staged) == set(arrays)
    for name, arr in arrays.items():
        assert staged[name].dtype == torch.from_numpy(arr.copy()).dtype  # uint8 stays uint8
        assert staged[name].data_ptr() != arr.ctypes.data
        np.testing.assert_array_equal(staged[name].numpy(), arr, strict=True)
    rows = np.array([3, 1])
    picked = staging.stage(arrays, rows)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(picked[name].numpy(), arr[rows], strict=True)


def test_staging_reuses_a_buffer_per_key_in_turn_and_gives_a_new_shape_its_own():
    staging = HostStaging(torch.device("cpu"), pin=False, slots=2)
    ptrs = [
        staging.stage({"frames": unroll_arrays(i)["frames"]})["frames"].data_ptr() for i in range(4)
    ]
    assert ptrs[0] == ptrs[2] and ptrs[1] == ptrs[3] and ptrs[0] != ptrs[1]
    assert staging.buffers == 2
    wider = staging.stage({"frames": unroll_arrays(9, envs=5)["frames"]})["frames"]
    assert tuple(wider.shape) == (5, 7, 6, 5) and wider.data_ptr() not in ptrs
    assert staging.buffers == 3
    as_float = staging.stage({"frames": unroll_arrays(0)["frames"].astype(np.float32)})
    assert as_float["frames"].dtype == torch.float32 and staging.buffers == 4


def test_staging_keeps_a_bounded_number_of_buffers_dropping_the_least_recently_used():
    staging = HostStaging(torch.device("cpu"), pin=False, slots=2, max_keys=3)
    kept = staging.stage({"x": np.zeros(1, np.float32)})["x"].data_ptr()
    for rows in range(2, 12):
        for _ in "ab":  # both slots of a new shape
            staging.stage({"y": np.zeros(rows, np.float32)})
        staging.stage({"x": np.zeros(1, np.float32)})  # used again: the most recent
        assert staging.buffers <= 3 * 2
    assert staging.buffers == 3 * 2
    assert kept in {staging.stage({"x": np.ones(1, np.float32)})["x"].data_ptr() for _ in "ab"}


def test_staging_refuses_no_slots_naming_the_value():
    with pytest.raises(ValueError, match="slots=0"):
        HostStaging(torch.device("cpu"), slots=0)


def test_moving_to_the_cpu_stages_nothing_and_wraps_what_it_can():
    staging = HostStaging(torch.device("cpu"))
    assert staging.stream is None and not staging.pin
    writable = np.arange(6, dtype=np.uint8).reshape(3, 2)
    out = staging.move({"a": writable, "b": frozen(writable.copy())}).wait()
    assert out["a"].data_ptr() == writable.ctypes.data  # wrapped, as to_device does
    assert torch.equal(out["b"], torch.from_numpy(writable))
    picked = staging.move({"a": frozen(writable.copy())}, np.array([2, 0])).wait()
    assert picked["a"].tolist() == [[4, 5], [0, 1]]
    picked["a"] += 1  # writable
    assert staging.buffers == 0


@needs_cuda
def test_moving_to_a_gpu_is_exact_through_reused_pinned_buffers():
    device = torch.device("cuda")
    staging = HostStaging(device, slots=2)
    assert staging.pin and staging.stream is not None
    batches = [unroll_arrays(i) for i in range(6)]
    moved = []
    for i, arrays in enumerate(batches):  # more batches than slots: buffers reused meanwhile
        rows = None if i % 2 else np.array([3, 0, 2])
        moved.append((rows, staging.move(arrays, rows).wait()))
    assert staging.buffers == 2 * 4 * 2  # two shapes (all rows, 3 rows) of 4 arrays, 2 slots
    assert all(b.is_pinned() for b in staging.stage(batches[0]).values())
    for arrays, (rows, tensors) in zip(batches, moved, strict=True):
        for name, arr in arrays.items():
            assert tensors[name].device.type == "cuda"
            want = arr if rows is None else arr[rows]
            np.testing.assert_array_equal(tensors[name].cpu().numpy(), want, strict=True)


@needs_cuda
def test_the_update_stream_sees_the_copy_it_waited_for():
    staging = HostStaging(torch.device("cuda"), slots=1)  # every batch reuses one buffer
    sums = []
    for i in range(8):
        arrays = {"frames": frozen(np.full((32, 8, 84, 84), i, np.uint8))}
        tensors = staging.move(arrays).wait()
        sums.append(tensors["frames"].sum(dtype=torch.int64))  # current stream, no sync
    assert [int(s) for s in sums] == [i * 32 * 8 * 84 * 84 for i in range(8)]
    assert staging.buffers == 1


@needs_cuda
@pytest.mark.parametrize("background", [False, True])
def test_pending_batches_come_out_exactly_on_a_gpu(background):
    pending = PendingBatches("cuda", background=background)
    try:
        for i in range(5):
            pending.add(batch(i))
        for i in range(5):
            got = pending.pop()
            assert got is not None and got.tensors["obs"].device.type == "cuda"
            assert got.tensors["obs"].dtype == torch.uint8
            assert torch.equal(
                got.tensors["obs"].cpu(), torch.full((3, 4, 8, 8), i, dtype=torch.uint8)
            )
            assert torch.equal(got.tensors["reward"].cpu(), torch.full((3,), float(i)))
        assert pending.staging.buffers == 2 * 2
    finally:
        pending.close()
