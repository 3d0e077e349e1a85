"""Learner-group throughput: samples trained per second by 1, 2 and 4 DD-PPO learners (gloo on
the CPU), APPO / IMPALA learners (``--config configs/cartpole_appo.yaml``) or off-policy
learners (``--config configs/cartpole_apex_dqn.yaml``, ``pendulum_sac.yaml``,
``pendulum_apex_ddpg.yaml``), each its own process, against the single learner of the same
invocation.

Each learner is the real ``PPOUpdate`` (``zrl.algos.ppo.update``) of the config, with
``roles.learners`` set to the group's size: learner 0 opens the group's store, the others
find its address (through a file here, where a run asks the broker) and the group forms as in
a run (``zrl.distributed.learner_group``). Every learner gets the same synthetic rounds (one rollout
per actor, observations of the env's shape, random actions) and trains them; the group splits
every minibatch and all-reduces the gradients. No actors, broker or parameter server: this is
the learners' compute and their all-reduce only. The first round is a warm-up, not timed.

"samples/s" counts the env steps a round trains (each once, however many epochs use it, as
``samples_trained`` in progress.csv): the group trains each round once, together. With
``ppo.minibatch_size`` fixed, more learners each compute a smaller share of every minibatch
and add an all-reduce per minibatch. Run from the repo root (``torch_threads`` 1 per learner;
more learners than cores measures the contention, not the scaling)::

    python benchmarks/learner_groups.py --rounds 6
    python benchmarks/learner_groups.py --learners 1 2 3 --set ppo.minibatch_size=384
    python benchmarks/learner_groups.py --set ppo.minibatch_size=2048 --set model.hidden=[256,256]
    python benchmarks/learner_groups.py --config configs/cartpole_appo.yaml --rounds 21
    python benchmarks/learner_groups.py --config configs/pendulum_sac.yaml --rounds 101
    python benchmarks/learner_groups.py --learners 1 2 4 --set learner.device=cuda  # 4 GPUs

``learner.device`` (``auto``: a GPU where there is one) puts each learner on a GPU of its own
(learner i on ``cuda:i``; the group on nccl); more learners than GPUs is refused.

APPO / IMPALA (``zrl.algos.kernel.unrolls``): each learner is the real ``AppoUpdate`` /
``ImpalaUpdate`` and trains batches of its own (``replay.batch_size`` synthetic unrolls each,
as a FIFO shard deals them out), a "round" being one batch per learner; the group averages
every step's gradients, so its samples/s counts every learner's batches (learner 0's time).
The off-policy learners (``zrl.algos.kernel.batch_update``) likewise: each trains its own batches of
``replay.batch_size`` synthetic transitions, one update each.
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent


class _NoWeights:
    """A follower's weights SUB that never holds a message: the benchmark's followers keep
    their own weights, identical to the leader's (the drift the tests check is 0)."""

    def recv(self, *, block: bool = True) -> None:
        return None


class _Services:
    """What the learner role lends an update: learner 0's heartbeat info comes from a
    file in ``folder`` instead of the broker's STATUS."""

    def __init__(self, folder: Path, index: int) -> None:
        self.id = f"learner-{index}"
        self.advertise = "127.0.0.1"
        self.stop_event = threading.Event()
        self.folder = folder

    def open_publisher(self, name: str = "topics", *, hwm: int = 1000) -> Any:
        raise RuntimeError("PPO opens no publisher")

    def open_subscriber(self, topics: list[str], name: str, *, hwm: int = 1000) -> Any:
        raise RuntimeError("PPO opens no subscriber")

    def tick(self) -> None:
        pass

    def take_input(self) -> bool:
        return False  # APPO / IMPALA: the benchmark hands each learner its batches

    def follow_weights(self, model: Any) -> Any:
        return argparse.Namespace(sub=_NoWeights(), version=0)

    def role_info(self, role_id: str) -> dict[str, Any] | None:
        path = self.folder / "group_store"
        return {"group_store": path.read_text()} if path.exists() else None


def rollout(cfg: Any, space: gym.Space, actor: int, version: int, rng: np.random.Generator) -> Any:
    """One ``unroll`` TRAJECTORY of the config's shape: random observations and actions."""
    from zrl.transport import protocol as P

    E, T = cfg.env.num_envs, cfg.actor.trajectory_length
    obs_shape = space.shape
    term = rng.random((E, T)) < 0.02
    arrays = {
        "obs": rng.normal(size=(E, T, *obs_shape)).astype(np.float32),
        "action": rng.integers(2, size=(E, T)).astype(np.int64),
        "logp": np.full((E, T), math.log(0.5), np.float32),
        "reward": np.ones((E, T), np.float32),
        "terminated": term,
        "truncated": np.zeros((E, T), bool),
        "valid": np.ones((E, T), bool),
        "bootstrap_obs": rng.normal(size=(E, *obs_shape)).astype(np.float32),
    }
    meta = {"weights_version": version, "actor": actor, "env_steps": E * T}
    return P.Message(P.TRAJECTORY, meta=meta, arrays=arrays, sender=f"actor-{actor}")


def unroll_batch(cfg: Any, space: gym.Space, version: int, rng: np.random.Generator) -> Any:
    """One replay BATCH of ``replay.batch_size`` synthetic unrolls (IMPALA's and APPO's
    input): random observations and actions, collected with weights ``version``."""
    from zrl.transport import protocol as P

    B, T = cfg.replay.batch_size, cfg.actor.trajectory_length
    arrays = {
        "obs": rng.normal(size=(B, T, *space.shape)).astype(np.float32),
        "action": rng.integers(2, size=(B, T)).astype(np.int64),
        "logp": np.full((B, T), math.log(0.5), np.float32),
        "reward": np.ones((B, T), np.float32),
        "terminated": rng.random((B, T)) < 0.02,
        "truncated": np.zeros((B, T), bool),
        "valid": np.ones((B, T), bool),
        "bootstrap_obs": rng.normal(size=(B, *space.shape)).astype(np.float32),
        "weights_version": np.full(B, version, np.int64),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)


def transition_batch(
    cfg: Any, obs_space: gym.Space, act_space: gym.Space, rng: np.random.Generator
) -> Any:
    """One replay BATCH of ``replay.batch_size`` synthetic n-step transitions (the off-policy
    learners' input): random observations, and actions inside the env's action space."""
    from zrl.transport import protocol as P

    B = cfg.replay.batch_size
    if isinstance(act_space, gym.spaces.Box):
        low, high = act_space.low, act_space.high
        action = rng.uniform(low, high, size=(B, *act_space.shape)).astype(np.float32)
    else:
        action = rng.integers(int(act_space.n), size=B).astype(np.int64)
    arrays = {
        "obs": rng.normal(size=(B, *obs_space.shape)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=B).astype(np.float32),
        "discount": np.full(B, 0.97, np.float32),
        "next_obs": rng.normal(size=(B, *obs_space.shape)).astype(np.float32),
        "weights_version": np.zeros(B, np.int64),
        "weight": np.ones(B, np.float32),
        "key": np.arange(B, dtype=np.int64),
    }
    return P.Message(P.BATCH, meta={"shard": "replay-0"}, arrays=arrays)


def learner_main(
    index: int, learners: int, config: str, overrides: list[str], rounds: int, folder: str
) -> dict[str, float]:
    """One learner process: form the group, train ``rounds`` rounds (the first untimed)."""
    from zrl.algos.apex_ddpg.update import ApexDDPGUpdate
    from zrl.algos.apex_dqn.update import ApexDQNUpdate
    from zrl.algos.api.learner import LearnerSetup
    from zrl.algos.api.train_stats import TrainStats
    from zrl.algos.appo.update import AppoUpdate
    from zrl.algos.impala.update import ImpalaUpdate
    from zrl.algos.kernel.batches import resolve_device
    from zrl.algos.models import experiment_model
    from zrl.algos.ppo.update import PPOUpdate
    from zrl.algos.sac.update import SACLearnerUpdate
    from zrl.config.experiment import load_config

    torch.set_num_threads(1)
    cfg = load_config(config, [*overrides, f"roles.learners={learners}"])
    env = gym.make(cfg.env.id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.learner.device)  # learner.device (auto: a GPU where there is one)
    if device.type == "cuda" and learners > 1:  # nccl: a GPU of its own for each learner
        if learners > torch.cuda.device_count():
            raise SystemExit(
                f"{learners} learners on {torch.cuda.device_count()} GPU(s): nccl needs a GPU per "
                "learner; --set learner.device=cpu, or fewer --learners"
            )
        device = torch.device("cuda", index)
    model = experiment_model(cfg, obs_space, act_space).to(device)
    services = _Services(Path(folder), index)
    kinds: dict[str, Any] = {
        "ppo": PPOUpdate,
        "appo": AppoUpdate,
        "impala": ImpalaUpdate,
        "apex_dqn": ApexDQNUpdate,
        "apex_ddpg": ApexDDPGUpdate,
        "sac": SACLearnerUpdate,
    }
    if cfg.algo not in kinds:
        raise SystemExit(f"--config: algo {cfg.algo!r} is not measured here ({sorted(kinds)})")
    up = kinds[cfg.algo](
        LearnerSetup(
            config=cfg,
            model=model,
            observation_space=obs_space,
            action_space=act_space,
            index=index,
            log=logging.getLogger(f"bench.learner-{index}"),
            train_stats=TrainStats(),
            services=services,
            device=device,
        )
    )
    if up.group is not None and up.group.address is not None:
        tmp = Path(folder) / "group_store.tmp"
        tmp.write_text(up.group.address)
        tmp.rename(Path(folder) / "group_store")
    while not up.members.ready:
        up.train(0)
        time.sleep(0.01)
    # PPO: the same rounds on every learner; the others: batches of each learner's own.
    rng = np.random.default_rng(cfg.seed + (0 if cfg.algo == "ppo" else index))
    samples, seconds = 0, 0.0
    for r in range(rounds):
        if cfg.algo == "ppo":
            for actor in range(cfg.roles.count("actors")):
                up.receive(rollout(cfg, obs_space, actor, r + 1, rng), r + 1)
        elif cfg.algo in ("appo", "impala"):
            up.receive(unroll_batch(cfg, obs_space, r + 1, rng), r + 1)
        else:
            up.receive(transition_batch(cfg, obs_space, act_space, rng), r + 1)
        started = time.perf_counter()
        result = up.train(r + 1)
        took = time.perf_counter() - started
        assert result is not None, "a round did not train"
        if r > 0:
            samples += result.samples
            seconds += took
    weights = torch.cat([p.detach().reshape(-1) for p in up.model.parameters()]).cpu()
    up.close()
    return {
        "samples": samples,
        "seconds": seconds,
        "checksum": float(weights.double().sum()),
        "own_batches": float(cfg.algo != "ppo"),
    }


def _run(args: tuple[int, int, str, list[str], int, str], out: Any) -> None:
    out.put((args[0], learner_main(*args)))


def measure(learners: int, config: str, overrides: list[str], rounds: int) -> dict[str, float]:
    """Samples trained per second by a group of ``learners`` processes (learner 0's time)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [
            ctx.Process(target=_run, args=((i, learners, config, overrides, rounds, folder), out))
            for i in range(learners)
        ]
        try:
            for p in procs:
                p.start()
            results: dict[int, dict[str, float]] = {}
            while len(results) < learners:
                try:
                    index, result = out.get(timeout=1.0)
                except queue.Empty:
                    failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if failed:
                        raise SystemExit(
                            f"a learner of {learners} failed (exit {failed})"
                        ) from None
                    continue
                results[index] = result
            for p in procs:
                p.join(timeout=60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    sums = {r["checksum"] for r in results.values()}
    if len(sums) != 1:
        raise SystemExit(f"{learners} learners ended with different weights: {sorted(sums)}")
    lead = results[0]
    # PPO's learners train the same rounds; the others each their own batches.
    samples = (
        sum(r["samples"] for r in results.values()) if lead["own_batches"] else lead["samples"]
    )
    return {**lead, "samples": samples, "per_s": samples / lead["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "cartpole_ppo.yaml"))
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per learner (1 warm-up)")
    parser.add_argument("--set", action="append", default=[], help="config override a.b=v")
    args = parser.parse_args()
    rows = {n: measure(n, args.config, args.set, args.rounds) for n in args.learners}
    base = rows[args.learners[0]]["per_s"]
    print(f"config {args.config} {' '.join(args.set)}; {args.rounds - 1} timed rounds each")
    print(f"{'learners':>8} {'samples/s':>10} {'x 1st':>6} {'s/round':>8}")
    for n, row in rows.items():
        per_round = row["seconds"] / max(1, args.rounds - 1)
        print(f"{n:>8} {row['per_s']:>10.0f} {row['per_s'] / base:>6.2f} {per_round:>8.3f}")


if __name__ == "__main__":
    main()
