"""Sample Factory 2.1.1 APPO on PongNoFrameskip-v4, for ``benchmarks/atari.py`` and gpu_host.py.

Runs in Sample Factory's own virtual environment (gymnasium 0.29), never in zrl's: build it
with ``python benchmarks/atari.py --build-sf-venv`` (``atari.py`` calls this file with that
venv's Python). Its Atari defaults (``sf_examples.atari``: Nature CNN ``convnet_atari``, the
SB3/CleanRL wrappers, PPO loss with GAE) with ``--async_rl=True``, learner and inference on
``--device`` (``cpu``, the default, or ``gpu``), plus the settings given here. Writes one JSON
object a line to ``--out``:

  {"event": "start", "time": ..., "learner_pid": ..., "cfg": {...}}
  {"event": "stats", "time": ..., "env_frames": ..., "samples_trained": ...,
   "samples_collected": ..., "learner_cpu_s": ..., "total_cpu_s": ..., "lag_min": ...}
  {"event": "episode", "time": ..., "reward": ..., "length": ...}
  {"event": "end", "time": ..., "status": ...}

``time`` is ``time.time()``. ``env_frames`` is Sample Factory's own count: samples the learner
trained on times the frameskip (4), i.e. ``samples_trained * 4``; ``samples_collected`` is what
the inference worker acted on. Each sample is counted once whatever the number of epochs.
``learner_cpu_s`` is the user + system CPU time of the learner process (its batcher is a thread
in it); ``total_cpu_s`` that of this process and all its children.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# ale-py 0.12 registers its envs through gymnasium >= 1.0's plugin hook only; Sample Factory
# needs gymnasium < 1.0. Register them here, at import: Sample Factory's processes are started
# with "spawn" and import this (main) module again, and its env-info probe makes an env in one.
from ale_py.registration import register_v0_v4_envs

register_v0_v4_envs()

STATS_EVERY_S = 1.0
LAUNCHED = time.time()


def sf_argv(args: argparse.Namespace) -> list[str]:
    splits = 2 if args.envs_per_worker % 2 == 0 else 1  # double-buffered sampling when it can
    argv = [
        "--env=atari_pong",
        f"--experiment={args.experiment}",
        f"--train_dir={args.train_dir}",
        f"--device={args.device}",
        "--async_rl=True",
        "--encoder_conv_architecture=convnet_atari",  # the Nature CNN (also its Atari default)
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
    return argv + list(args.sf_args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON-lines file to write")
    parser.add_argument("--train-dir", required=True)
    parser.add_argument("--experiment", default="pong_appo")
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
    args = parser.parse_args()

    import psutil
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import EPISODIC, ExperimentStatus
    from sample_factory.train import make_runner
    from sf_examples.atari.train_atari import parse_atari_args, register_atari_components

    out = open(args.out, "w", buffering=1)  # noqa: SIM115 - one line per event, flushed

    def emit(event: str, **fields: object) -> None:
        out.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    register_atari_components()
    cfg = parse_atari_args(sf_argv(args))
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
            keys = (
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
            emit(
                "start", learner_pid=pid, cfg={k: getattr(cfg, k) for k in keys}, argv=sf_argv(args)
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
        # The full-game score (RecordEpisodeStatistics sits outside the reward clipping).
        rewards = stats.get("RecordEpisodeStatistics_reward", stats.get("reward"))
        lengths = stats.get("RecordEpisodeStatistics_len", stats.get("len"))
        for r, n in zip(_flat(rewards), _flat(lengths), strict=False):
            emit("episode", reward=float(r), length=int(n))

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


if __name__ == "__main__":
    sys.exit(main())
