"""``deferred_step`` against ``checked_step``: the same weights on finite losses, and on a NaN/inf
loss a step the optimizer skips (weights, moments and step count untouched) without raising."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zrl.algos.kernel.optim import checked_step, deferred_step, defers_checks, make_adam


def net_and_adam(device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = nn.Linear(3, 2).to(device)
    return net, make_adam(net.parameters(), 0.1)


def loss_of(net: nn.Module, scale: float = 1.0) -> torch.Tensor:
    x = torch.arange(12.0, device=next(net.parameters()).device).reshape(4, 3)
    return (net(x) * scale).square().mean()


def state_of(net: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    moments = [t for s in opt.state.values() for t in s.values()]
    return [p.detach().clone() for p in net.parameters()] + [t.clone() for t in moments]


def test_deferred_step_matches_checked_step_on_finite_losses() -> None:
    checked, checked_adam = net_and_adam()
    deferred, deferred_adam = net_and_adam()
    finite = torch.ones((), dtype=torch.bool)
    for _ in range(3):
        norm = checked_step(checked_adam, loss_of(checked), list(checked.parameters()), 0.5)
        d_norm, finite = deferred_step(
            deferred_adam, loss_of(deferred), list(deferred.parameters()), 0.5, finite
        )
        assert isinstance(d_norm, torch.Tensor) and float(d_norm) == norm
    assert bool(finite)
    for a, b in zip(
        state_of(checked, checked_adam), state_of(deferred, deferred_adam), strict=True
    ):
        assert torch.equal(a, b)


def test_deferred_step_skips_a_non_finite_step_and_the_rest_of_its_batch() -> None:
    net, adam = net_and_adam()
    finite = torch.ones((), dtype=torch.bool)
    _, finite = deferred_step(adam, loss_of(net), list(net.parameters()), 0.5, finite)
    before = state_of(net, adam)
    _, finite = deferred_step(adam, loss_of(net, 3e38), list(net.parameters()), 0.5, finite)
    assert not bool(finite)
    _, finite = deferred_step(adam, loss_of(net), list(net.parameters()), 0.5, finite)
    assert not bool(finite)  # a finite step after it in the same batch: skipped too
    assert all(torch.equal(a, b) for a, b in zip(before, state_of(net, adam), strict=True))
    assert all(int(s["step"]) == 1 for s in adam.state.values())


def test_deferred_step_needs_a_fused_optimizer() -> None:
    net = nn.Linear(3, 2)
    adam = torch.optim.Adam(net.parameters(), lr=0.1)
    assert not defers_checks(adam, torch.device("cuda"))
    with pytest.raises(ValueError, match="fused optimizer, got Adam"):
        deferred_step(adam, loss_of(net), list(net.parameters()), 0.5, torch.tensor(True))


def test_only_a_gpu_learner_defers_its_checks() -> None:
    _, adam = net_and_adam()
    assert not defers_checks(adam, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_deferred_step_reads_nothing_back_on_the_gpu() -> None:
    net, adam = net_and_adam("cuda")
    assert defers_checks(adam, torch.device("cuda"))
    finite = torch.ones((), dtype=torch.bool, device="cuda")
    loss = loss_of(net)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync raises
    try:
        norm, finite = deferred_step(adam, loss, list(net.parameters()), 0.5, finite)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert norm.is_cuda and bool(finite)
    before = state_of(net, adam)
    _, finite = deferred_step(adam, loss_of(net, 3e38), list(net.parameters()), 0.5, finite)
    assert not bool(finite)
    assert all(torch.equal(a, b) for a, b in zip(before, state_of(net, adam), strict=True))
