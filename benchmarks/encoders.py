"""Forward and backward time of the Atari actor-critics (Nature CNN, IMPALA ResNet).

Times ``model(obs)`` (no grad) on uint8 ``[B, 4, 84, 84]`` frames at an actor's batch and a
learner's, and forward + backward of a scalar loss at the learner's batch, on one torch thread
of the CPU (``--device cuda`` for a GPU), in both memory layouts: contiguous (the actors')
and channels-last (a CPU learner's, ``learner.memory_format``), with the ratio of the two.
Reports the best and the median of ``--reps`` repetitions, in ms. Run from the repo root::

    python benchmarks/encoders.py --reps 10
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from zrl.nets.discrete import build_actor_critic
from zrl.nets.encoders import use_channels_last

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def timed(fn: Callable[[], object], reps: int, device: str) -> tuple[float, float]:
    """(best, median) ms of ``fn`` over ``reps`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--small", type=int, default=8, help="actor batch")
    parser.add_argument("--large", type=int, default=256, help="learner batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.device}, ms best/median")
    for encoder in ("nature_cnn", "impala_resnet"):
        plain = build_actor_critic(ATARI, gym.spaces.Discrete(6), encoder=encoder)
        fast = copy.deepcopy(plain)
        use_channels_last(fast)
        best_step = {}
        for layout, model in (("contiguous", plain), ("channels_last", fast)):
            model.to(args.device)
            params = sum(p.numel() for p in model.parameters())
            name = f"{encoder} {layout}"
            for batch in (args.small, args.large):
                obs = torch.from_numpy(rng.integers(0, 256, (batch, 4, 84, 84), dtype=np.uint8))
                obs = obs.to(args.device)

                def forward(model: torch.nn.Module = model, obs: torch.Tensor = obs) -> object:
                    with torch.no_grad():
                        return model(obs)

                best, median = timed(forward, args.reps, args.device)
                print(
                    f"{name:28s} {params:>9,} params  forward  B={batch:<4d} "
                    f"{best:8.1f} {median:8.1f}"
                )

            def step(model: torch.nn.Module = model, obs: torch.Tensor = obs) -> object:
                model.zero_grad(set_to_none=True)
                logits, value = model(obs)
                loss = logits.logsumexp(dim=1).mean() + value.pow(2).mean()
                loss.backward()
                return loss

            best, median = timed(step, args.reps, args.device)
            best_step[layout] = best
            print(
                f"{name:28s} {params:>9,} params  fwd+bwd  B={args.large:<4d} "
                f"{best:8.1f} {median:8.1f}"
            )
        ratio = best_step["contiguous"] / best_step["channels_last"]
        print(f"{encoder}: channels_last fwd+bwd is {ratio:.2f}x as fast as contiguous (best)")


if __name__ == "__main__":
    main()
