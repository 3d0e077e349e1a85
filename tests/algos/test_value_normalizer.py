"""ValueNormalizer: running statistics against numpy over everything seen, and the maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zrl.algos.value_normalizer import ValueNormalizer


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
