"""ValueNormalizer: running statistics against numpy over everything seen, and the maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.algos.kernel.value_normalizer import ValueNormalizer


def test_it_is_the_identity_before_any_target() -> None:
    norm = ValueNormalizer()
    x = torch.tensor([-3.0, 0.5, 7.0])
    assert torch.equal(norm.normalize(x), x) and torch.equal(norm.denormalize(x), x)
    norm.update(torch.zeros(0))
    norm.update(torch.ones(3), torch.zeros(3, dtype=torch.bool))  # nothing valid
    assert norm.count == 0 and norm.std == 1.0


def test_statistics_are_those_of_every_valid_target_seen() -> None:
    rng = np.random.default_rng(0)
    norm, seen = ValueNormalizer(eps=1e-5), []
    for n in (1, 7, 64, 3, 200):
        x = rng.normal(loc=5.0, scale=3.0, size=(n, 2)).astype(np.float32)
        valid = rng.random((n, 2)) < 0.7
        norm.update(torch.from_numpy(x), torch.from_numpy(valid))
        seen.append(x[valid].astype(np.float64))
        everything = np.concatenate(seen)
        assert norm.count == len(everything)
        assert norm.mean == pytest.approx(everything.mean(), rel=1e-9, abs=1e-9)
        assert norm.var == pytest.approx(everything.var(), rel=1e-9, abs=1e-9)
        assert norm.std == pytest.approx(np.sqrt(everything.var() + 1e-5), rel=1e-9)
    v = torch.tensor([0.0, 5.0, 11.0], dtype=torch.float64)
    expected = (v.numpy() - everything.mean()) / np.sqrt(everything.var() + 1e-5)
    assert np.allclose(norm.normalize(v).numpy(), expected)
    assert torch.allclose(norm.denormalize(norm.normalize(v)), v)


def test_state_round_trips_and_bad_input_is_refused() -> None:
    norm = ValueNormalizer()
    norm.update(torch.tensor([1.0, 2.0, 4.0]))
    again = ValueNormalizer()
    again.load_state_dict(norm.state_dict())
    assert (again.count, again.mean, again.m2) == (norm.count, norm.mean, norm.m2)
    with pytest.raises(ValueError, match="not finite"):
        norm.update(torch.tensor([1.0, float("inf")]))
    assert again.count == norm.count == 3  # a refused batch leaves the statistics alone
    with pytest.raises(ValueError, match="valid"):
        norm.update(torch.ones(3), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="eps"):
        ValueNormalizer(eps=0.0)


def test_folding_on_the_device_keeps_the_statistics_of_update() -> None:
    """``fold`` (a GPU learner's, nothing read back; here on the CPU) gives the statistics and
    the maps ``update`` gives, and skips a batch with a NaN/inf target instead of raising."""
    rng = np.random.default_rng(1)
    exact, folded = ValueNormalizer(), ValueNormalizer()
    folded.fold(torch.zeros(0))
    for n in (1, 7, 64, 3):
        x = torch.from_numpy(rng.normal(loc=5.0, scale=3.0, size=(n, 2)).astype(np.float32))
        valid = torch.from_numpy(rng.random((n, 2)) < 0.7)
        exact.update(x, valid)
        folded.fold(x.masked_fill(~valid, float("nan")), valid)  # what is invalid is not read
        assert folded.count == exact.count
        assert folded.mean == pytest.approx(exact.mean, rel=1e-12)
        assert folded.var == pytest.approx(exact.var, rel=1e-12)
    folded.fold(torch.tensor([1.0, float("inf")]))
    assert folded.count == exact.count and folded.mean == pytest.approx(exact.mean, rel=1e-12)
    v = torch.tensor([0.0, 5.0, 11.0])
    assert torch.allclose(folded.normalize(v), exact.normalize(v))
    assert torch.allclose(folded.denormalize(v), exact.denormalize(v))
    again = ValueNormalizer()
    again.load_state_dict(folded.state_dict())
    assert again.count == exact.count and again.m2 == pytest.approx(exact.m2, rel=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_targets_on_the_gpu_are_folded_in_without_reading_them_back() -> None:
    norm, exact = ValueNormalizer(), ValueNormalizer()
    x = torch.arange(12.0).reshape(3, 4)
    valid = x.remainder(3) != 0
    norm.update(x[:1].cuda(), valid[:1].cuda())  # the statistics move to the device
    exact.update(x[:1], valid[:1])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync raises
    try:
        norm.update(x[1:].cuda(), valid[1:].cuda())
        out = norm.normalize(x.cuda())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    exact.update(x[1:], valid[1:])
    assert norm.count == exact.count and norm.mean == pytest.approx(exact.mean)
    assert torch.allclose(out.cpu(), exact.normalize(x), atol=1e-6)
