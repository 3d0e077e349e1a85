"""A model's weights as arrays (``zrl.nets.wire``): the copy a learner publishes is the weights
as they were when it started, whatever the updates after it do, on the CPU and on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zrl.nets.wire import WeightsCopy, model_to_arrays


def test_a_copy_on_the_cpu_is_ready_at_once_and_owns_its_memory() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    copy = WeightsCopy()
    assert copy.take() is None and not copy.busy
    copy.start(net, {"updates": 7})
    want = model_to_arrays(net)
    assert copy.busy
    with torch.no_grad():
        net.weight.add_(1.0)  # an update after the copy started
    taken = copy.take()
    assert taken is not None and not copy.busy
    arrays, meta = taken
    assert meta == {"updates": 7}
    assert sorted(arrays) == sorted(want)
    for name, array in want.items():
        np.testing.assert_array_equal(arrays[name], array)
        assert arrays[name].flags.c_contiguous and arrays[name].flags.owndata
    assert copy.take() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_copy_on_a_gpu_is_the_weights_when_it_started_while_updates_go_on() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4)).cuda()
    want = model_to_arrays(net)
    copy = WeightsCopy()
    copy.start(net, {"updates": 1})
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(2.0)  # queued after the copy: it must not see this
    taken = copy.take(wait=True)
    assert taken is not None
    for name, array in want.items():
        np.testing.assert_array_equal(taken[0][name], array)
    # Buffers are reused: a second copy sees the doubled weights, the first one unchanged.
    copy.start(net, {"updates": 2})
    second = copy.take(wait=True)
    assert second is not None
    for name, array in want.items():
        np.testing.assert_array_equal(second[0][name], 2 * array)
        np.testing.assert_array_equal(taken[0][name], array)
