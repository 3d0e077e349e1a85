"""What Sample Factory's launchers in ``benchmarks/`` share (``sf_pong.py``, ``sf_vizdoom.py``):
their common arguments, and a Sample Factory run that writes one JSON object a line to
``--out``:

  {"event": "start", "time": ..., "learner_pid": ..., "cfg": {...}}
  {"event": "stats", "time": ..., "env_frames": ..., "samples_trained": ...,
   "samples_collected": ..., "learner_cpu_s": ..., "total_cpu_s": ..., "lag_min": ...}
  {"event": "episode", "time": ..., "reward": ..., "length": ...}
  {"event": "end", "time": ..., "status": ...}

``time`` is ``time.time()``. ``env_frames`` is Sample Factory's own count (frameskip included
where ``summaries_use_frameskip``); ``samples_trained`` is it divided by the frameskip;
``samples_collected`` is what the inference worker acted on. Each sample is counted once
whatever the number of epochs. ``learner_cpu_s`` is the user + system CPU time of the learner
process (its batcher is a thread in it); ``total_cpu_s`` that of this process and all its
children. Runs only in Sample Factory's own venv (``benchmarks/atari.py --build-sf-venv``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

STATS_EVERY_S = 1.0
LAUNCHED = time.time()
CFG_KEYS = (
    "num_workers",
    "num_envs_per_worker",
    "worker_num_splits",
    "rollout",
    "batch_size",
    "num_batches_per_epoch",
    "num_epochs",
    "async_rl",
    "device",
    "encoder_conv_architecture",
    "learning_rate",
    "with_vtrace",
    "normalize_input",
    "env_frameskip",
    "env_framestack",
)


def common_parser(description: str, experiment: str) -> argparse.ArgumentParser:
    """The launchers' arguments (each may add its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="JSON-lines file to write")
    parser.add_argument("--train-dir", required=True)
    parser.add_argument("--experiment", default=experiment)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=8)
    parser.add_argument("--rollout", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256, help="SGD minibatch, samples")
    parser.add_argument("--num-batches-per-epoch", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("sf_args", nargs="*", help="more Sample Factory arguments (after --)")
    return parser


def common_argv(args: argparse.Namespace, env: str) -> list[str]:
    """Sample Factory's arguments for ``env`` from the common ones: asynchronous APPO, no
    checkpoint mid-measurement, no wandb, double-buffered sampling where it can."""
    splits = 2 if args.envs_per_worker % 2 == 0 else 1
    return [
        f"--env={env}",
        f"--experiment={args.experiment}",
        f"--train_dir={args.train_dir}",
        f"--device={args.device}",
        "--async_rl=True",
        f"--num_workers={args.workers}",
        f"--num_envs_per_worker={args.envs_per_worker}",
        f"--worker_num_splits={splits}",
        f"--rollout={args.rollout}",
        f"--batch_size={args.batch_size}",
        f"--num_batches_per_epoch={args.num_batches_per_epoch}",
        f"--num_epochs={args.epochs}",
        f"--train_for_seconds={int(args.seconds)}",
        f"--seed={args.seed}",
        "--save_every_sec=100000",  # no checkpoint mid-measurement (it saves one at the end)
        "--save_best_every_sec=100000",
        "--with_wandb=False",
        "--restart_behavior=overwrite",
    ]


def run_sample_factory(
    out_path: str,
    argv: list[str],
    parse_cfg: Callable[[list[str]], Any],
    reward_keys: tuple[str, ...] = ("reward",),
    length_keys: tuple[str, ...] = ("len",),
    reward_scale: float = 1.0,
) -> int:
    """One Sample Factory run of ``argv`` (parsed by ``parse_cfg``, the env's components
    registered by the caller) with its events written to ``out_path``; its exit status. An
    episode's reward and length are the first of ``reward_keys`` / ``length_keys`` its episodic
    stats carry; the reward is divided by ``reward_scale`` (an env's own scaling of its
    rewards, undone: the scenario's return)."""
    import psutil
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import EPISODIC, ExperimentStatus
    from sample_factory.train import make_runner

    out = open(out_path, "w", buffering=1)  # noqa: SIM115 - one line per event, flushed

    def emit(event: str, **fields: object) -> None:
        out.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    cfg = parse_cfg(argv)
    cfg, runner = make_runner(cfg)
    me = psutil.Process()

    def cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    class Recorder(AlgoObserver):
        def __init__(self) -> None:
            self.learner: psutil.Process | None = None
            self.last = 0.0

        def on_start(self, runner) -> None:  # noqa: ANN001 - Sample Factory's Runner
            pid = runner.processes[0]._process.pid  # ParallelRunner: learner_proc0
            self.learner = psutil.Process(pid)
            emit(
                "start",
                learner_pid=pid,
                cfg={k: getattr(cfg, k) for k in CFG_KEYS if hasattr(cfg, k)},
                argv=argv,
            )

        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:  # noqa: ANN001
            # --train_for_seconds: Sample Factory 2.1.1 never advances the clock it checks
            # (runner.total_train_seconds stays 0), so keep it here, counted from launch.
            runner.total_train_seconds = time.time() - LAUNCHED
            now = time.monotonic()
            if now - self.last < STATS_EVERY_S or self.learner is None:
                return
            self.last = now
            total = cpu(me)
            for child in me.children(recursive=True):
                try:
                    total += cpu(child)
                except psutil.Error:
                    pass
            frames = sum(runner.env_steps.values())
            lag = runner.policy_lag[0]
            try:
                learner_cpu = cpu(self.learner)
            except psutil.Error:
                return
            emit(
                "stats",
                env_frames=frames,
                samples_trained=frames // cfg.env_frameskip
                if cfg.summaries_use_frameskip
                else frames,
                samples_collected=sum(runner.samples_collected),
                learner_cpu_s=learner_cpu,
                total_cpu_s=total,
                lag_min=lag.get("version_diff_min"),
                lag_avg=lag.get("version_diff_avg"),
                lag_max=lag.get("version_diff_max"),
            )

    def on_episodes(runner, msg: dict, policy_id: int) -> None:  # noqa: ANN001
        stats = msg[EPISODIC]
        rewards = next((stats[k] for k in reward_keys if k in stats), None)
        lengths = next((stats[k] for k in length_keys if k in stats), None)
        for r, n in zip(_flat(rewards), _flat(lengths), strict=False):
            emit("episode", reward=float(r) / reward_scale, length=int(n))

    runner.register_observer(Recorder())
    runner.policy_msg_handlers[EPISODIC].append(on_episodes)
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    emit("end", status=int(status))
    out.close()
    return int(status)


def _flat(value: object) -> list[float]:
    import numpy as np

    return [] if value is None else np.asarray(value, dtype=float).reshape(-1).tolist()
