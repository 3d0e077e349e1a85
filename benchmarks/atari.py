"""Atari Pong: zrl APPO against Sample Factory 2.1.1 APPO on the same machine, in one run.

Sections (``--sections a,b,c,d``; default a,b,c):

  (a) env steps/s with learning on: ``zrl run --zrl-config`` (APPO, Nature CNN) against Sample
      Factory APPO (``--async_rl=True``, CPU learner, Nature CNN ``convnet_atari``) with the same
      envs per core, rollout length, batch, minibatch and epochs, each for ``--seconds``.
      Target: zrl >= 1.5x.
  (b) samples trained per learner CPU-second, from the same runs: CPU seconds (user + system)
      of the learner process(es) (zrl: ``zrl start learner``; Sample Factory: ``learner_proc0``,
      its batcher is a thread in it); each sample counts once whatever the epochs.
      Target: zrl >= 1.5x.
  (c) pipeline overhead: zrl actors -> broker -> replay with a random policy against a bare
      ``ale_py.vector_env.AtariVectorEnv`` loop with random actions, same env count.
      Target: zrl >= 80 % of the bare loop.
  (d) learning curve at equal wall time (``--curve-minutes`` each, default 30): training
      episode returns against minutes since launch, to docs/atari_pong_curve.png and .csv
      (``--curve-out``).
      Target: zrl's final score (mean over the last 10 % of the time) >= Sample Factory's.

Rates of (a) and (b) are taken over the steady state: from ``--warmup`` seconds after each
system trained its first batch to the end, so start-up (imports, process starts, the first
forward passes) counts for neither. ``--repeats`` runs interleave zrl and Sample Factory
(alternating which goes first); the median and the spread are printed. Steps are agent steps
(frameskip 4: one step = 4 frames); Sample Factory's own "frames" are divided by 4. Policy lag
is printed in each system's own unit: Sample Factory's ``version_diff_avg`` (SGD steps between
acting and training), zrl's ``max_version_lag`` of progress.csv (published weight versions).

Sample Factory needs gymnasium < 1.0 and runs in its own virtual environment, built once
(``--build-sf-venv``, reused after; see ``build_sf_venv``) in ~/.cache/zrl-bench/sf-venv or
$ZRL_SF_VENV; ``benchmarks/sf_pong.py`` is its launcher. Run from the repo root::

    python benchmarks/atari.py --build-sf-venv --sections a,b --seconds 120 --repeats 3
    python benchmarks/atari.py --sections d --curve-minutes 30
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SF_LAUNCHER = REPO / "benchmarks" / "sf_pong.py"
SF_VENV = Path(os.environ.get("ZRL_SF_VENV", Path.home() / ".cache" / "zrl-bench" / "sf-venv"))
SF_WHEELS = os.environ.get("ZRL_SF_WHEELS")  # a folder of wheels: build the venv offline
SF_PACKAGES = ["sample-factory==2.1.1", "gymnasium<1.0", "ale-py==0.12.1"]
CURVE_OUT = REPO / "docs" / "atari_pong_curve"  # .png and .csv
TARGET_THROUGHPUT = 1.5  # (a) zrl / SF
TARGET_CPU = 1.5  # (b) zrl / SF
TARGET_PIPELINE = 0.8  # (c) zrl / bare loop
FINAL_FRACTION = 0.1  # (d) the final score: episodes of the last 10 % of the wall time
MONITOR_EVERY_S = 1.0
STOP_CHECK_S = 5.0  # how often a run's stop_when is asked
ZRL = "zrl APPO"
SF = "Sample Factory"


# --- Sample Factory's virtual environment ----------------------------------------------


def sf_python(venv: Path = SF_VENV) -> Path:
    return venv / "bin" / "python"


def sf_venv_ok(venv: Path = SF_VENV) -> bool:
    check = "import sample_factory, gymnasium, ale_py; assert gymnasium.__version__ < '1'"
    py = sf_python(venv)
    return py.is_file() and subprocess.run([py, "-c", check], capture_output=True).returncode == 0


def build_sf_venv(venv: Path = SF_VENV, wheels: Path | None = None) -> Path:
    """Sample Factory 2.1.1's own venv (it pins gymnasium < 1.0; zrl needs >= 1.0), reused
    if it imports. With ``wheels`` (or ``$ZRL_SF_WHEELS``), a folder holding the wheels of
    ``SF_PACKAGES`` and their dependencies (``pip download -d DIR`` them on a machine that
    reaches PyPI), pip installs from it alone (``--no-index --find-links``): offline.

    It sees the machine's site-packages, so it reuses the installed torch; a constraint pins
    torch to that very version so pip never pulls another (a CUDA) build. The
    commands (22 s here, 68 s under load; everything from PyPI)::

        python -m venv --system-site-packages VENV
        VENV/bin/python -m pip install --upgrade pip
        echo "torch==$(python -c 'import torch; print(torch.__version__)')" > VENV/constraints.txt
        VENV/bin/python -m pip install -c VENV/constraints.txt \\
            sample-factory==2.1.1 "gymnasium<1.0" ale-py==0.12.1

    pip then warns that zrl (in the base site-packages) wants gymnasium >= 1.0: harmless, zrl
    never runs in this venv; numpy is 1.26 there (Sample Factory pins < 2), with its own
    opencv-python 4.11 shadowing the base's numpy-2 build."""
    if sf_venv_ok(venv):
        return sf_python(venv)
    try:
        import torch
    except ImportError:
        sys.exit("install the CPU build of torch first: the SF venv reuses it")
    wheels = wheels or (Path(SF_WHEELS) if SF_WHEELS else None)
    where = f" from the wheels in {wheels}" if wheels else ""
    print(f"building Sample Factory's venv in {venv}{where} ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(sf_python(venv))
    offline = ["--no-index", "--find-links", str(wheels)] if wheels else []
    if not wheels:
        subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    subprocess.run(
        [py, "-m", "pip", "install", "-q", *offline, "-c", str(constraints), *SF_PACKAGES],
        check=True,
    )
    if not sf_venv_ok(venv):
        sys.exit(f"{venv}: Sample Factory does not import after the install")
    return sf_python(venv)


# --- the shared settings ---------------------------------------------------------------


def cores() -> int:
    return len(os.sched_getaffinity(0))


@dataclass
class Settings:
    """What both systems get, from the zrl config and ``--envs-per-core``."""

    envs_per_core: int
    cores: int
    actors: int  # zrl actors; Sample Factory gets one rollout worker per core
    rollout: int  # steps per unroll
    batch: int  # samples per learner batch
    minibatch: int  # samples per SGD step
    epochs: int
    atari: dict[str, Any] = field(default_factory=dict)  # the config's env.atari

    @property
    def envs(self) -> int:
        return self.envs_per_core * self.cores

    def describe(self) -> str:
        return (
            f"{self.cores} cores x {self.envs_per_core} envs, rollout {self.rollout}, batch "
            f"{self.batch}, minibatch {self.minibatch}, {self.epochs} epoch(s)"
        )


def settings_from_config(config: Path, envs_per_core: int) -> Settings:
    """The shared settings, read from the zrl config's YAML (not validated: zrl is not
    imported here). Batch: ``appo.batch_size`` (samples) if set, else ``replay.batch_size``
    unrolls x the rollout length; minibatch: the batch over ``appo.minibatches``; epochs
    ``appo.epochs``."""
    import yaml

    raw = yaml.safe_load(config.read_text()) or {}

    def get(path: str, default: Any) -> Any:
        node: Any = raw
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    algo = get("algo", "appo")
    rollout = int(get("actor.trajectory_length", 32))
    batch = int(get(f"{algo}.batch_size", 0)) or int(get("replay.batch_size", 16)) * rollout
    n = cores()
    actors = int(get("roles.actors", n)) or n
    if (envs_per_core * n) % actors:
        raise SystemExit(f"{envs_per_core * n} envs do not split over {actors} zrl actors")
    return Settings(
        envs_per_core=envs_per_core,
        cores=n,
        actors=actors,
        rollout=rollout,
        batch=batch,
        minibatch=batch // int(get(f"{algo}.minibatches", 1)),
        epochs=int(get(f"{algo}.epochs", 1)),
        atari=dict(get("env.atari", {}) or {}),
    )


# --- one run of either system ----------------------------------------------------------


@dataclass
class Sample:
    time: float  # time.time()
    env_steps: int  # collected by the actors / rollout workers
    trained: int  # samples the learner trained on (once each)
    learner_cpu: float  # CPU seconds of the learner process(es)
    total_cpu: float  # CPU seconds of the whole system
    lag: float | None = None


@dataclass
class Run:
    system: str
    launched: float
    samples: list[Sample] = field(default_factory=list)
    episodes: list[tuple[float, float, float]] = field(default_factory=list)  # time, return, n
    notes: list[str] = field(default_factory=list)
    failed: str | None = None
    command: list[str] = field(default_factory=list)

    def steady(self, warmup: float) -> dict[str, float] | None:
        """Rates from ``warmup`` s after the first trained batch to the last sample."""
        first = next((s for s in self.samples if s.trained > 0), None)
        if first is None:
            return None
        window = [s for s in self.samples if s.time >= first.time + warmup]
        # Up to the last sample that moved: the stop and shutdown count for neither system.
        while len(window) > 1 and (window[-1].trained, window[-1].env_steps) == (
            window[-2].trained,
            window[-2].env_steps,
        ):
            window.pop()
        if len(window) < 2 or window[-1].time - window[0].time < 5:
            return None
        a, b = window[0], window[-1]
        dt = b.time - a.time
        cpu = b.learner_cpu - a.learner_cpu
        lags = [s.lag for s in window if s.lag is not None]
        return {
            "startup_s": first.time - self.launched,
            "window_s": dt,
            "env_steps_per_s": (b.env_steps - a.env_steps) / dt,
            "trained_per_s": (b.trained - a.trained) / dt,
            "trained_per_learner_cpu_s": (b.trained - a.trained) / cpu if cpu > 0 else math.nan,
            "learner_cores": cpu / dt,
            "total_cores": (b.total_cpu - a.total_cpu) / dt,
            "lag": statistics.mean(lags) if lags else math.nan,
        }


def time_to_return(
    episodes: Sequence[tuple[float, float, float]],
    target: float,
    window: int = 100,
) -> float | None:
    """The first time at which the mean return of the last ``window`` episodes reaches
    ``target``; None if it never does. ``episodes`` are (time, mean return, count) reports in
    time order: Sample Factory reports each episode (count 1), zrl the mean of the episodes
    that ended since its last report. The mean is taken over whole reports, newest first,
    until they hold ``window`` episodes (the oldest report in it is taken whole), and only
    once ``window`` episodes have ended at all: both systems are counted the same way."""
    for end in range(len(episodes)):
        total = weight = 0.0
        for _, ret, n in reversed(episodes[: end + 1]):
            total += ret * n
            weight += n
            if weight >= window:
                break
        if weight >= window and total / weight >= target:
            return episodes[end][0]
    return None


def _cpu(p: Any) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _stop_group(proc: subprocess.Popen) -> None:
    """End a run we started in its own session: SIGTERM to its group, then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_sf(
    s: Settings,
    seconds: float,
    seed: int,
    tmp: Path,
    python: Path,
    device: str = "cpu",
    stop_when: Callable[[Run], bool] | None = None,
    launcher: Path = SF_LAUNCHER,
) -> Run:
    """One Sample Factory run through ``launcher`` (benchmarks/sf_pong.py, or another launcher
    of ``sf_runner.py``) in its venv, its learner and inference on ``device`` (``cpu`` or
    ``gpu``). ``stop_when``, if given, is asked about the run so far every ``STOP_CHECK_S``
    seconds; the run stops when it says so."""
    out, log = tmp / "sf.jsonl", tmp / "sf.log"
    if s.batch % s.minibatch:
        raise SystemExit(f"batch {s.batch} is not a multiple of the minibatch {s.minibatch}")
    cmd = [
        str(python),
        str(launcher),
        "--out",
        str(out),
        "--train-dir",
        str(tmp / "sf"),
        "--workers",
        str(s.cores),
        "--envs-per-worker",
        str(s.envs_per_core),
        "--rollout",
        str(s.rollout),
        "--batch-size",
        str(s.minibatch),
        "--num-batches-per-epoch",
        str(s.batch // s.minibatch),
        "--epochs",
        str(s.epochs),
        "--seconds",
        str(seconds),
        "--seed",
        str(seed),
        "--device",
        device,
    ]
    run = Run(SF, time.time())
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + seconds + 180
            while proc.poll() is None and time.time() < deadline:
                time.sleep(STOP_CHECK_S if stop_when else MONITOR_EVERY_S)
                if stop_when is not None and stop_when(_sf_events(out, Run(SF, run.launched))):
                    run.notes.append("stopped: stop_when met")
                    break
            else:
                if proc.poll() is None:
                    run.notes.append("did not stop by itself: killed")
        finally:
            _stop_group(proc)
    _sf_events(out, run)
    if not run.samples:
        run.failed = f"no figures (log: {log})\n" + log.read_text()[-2000:]
    return run


def _sf_events(out: Path, run: Run) -> Run:
    """``run`` with the stats and episodes of sf_pong.py's JSON-lines file ``out`` added (a
    line still being written is skipped)."""
    events = []
    for line in out.read_text().splitlines() if out.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    for e in events:
        if e["event"] == "stats":
            lag = e.get("lag_avg")
            run.samples.append(
                Sample(
                    e["time"],
                    e["samples_collected"],
                    e["samples_trained"],
                    e["learner_cpu_s"],
                    e["total_cpu_s"],
                    lag,
                )
            )
        elif e["event"] == "episode":
            run.episodes.append((e["time"], e["reward"], 1.0))
    return run


def _last_csv_row(path: Path) -> dict[str, str] | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 2:
        return None
    return next(csv.DictReader([lines[0], lines[-1]]), None)


def run_zrl(
    s: Settings,
    config: Path,
    seconds: float,
    seed: int,
    tmp: Path,
    extra: list[str],
    stop_when: Callable[[Run], bool] | None = None,
) -> Run:
    """One ``zrl run``, watched once a second: progress.csv's counters and the CPU time of its
    processes (the learner is the one whose title is ``... zrl start learner ...``). Its run
    directory is ``tmp/zrl`` (summary.json there after the stop). ``stop_when``, if given, is
    asked about the run so far (its episodes read afresh) every ``STOP_CHECK_S`` seconds; the
    run is stopped (SIGTERM: a clean stop) when it says so."""
    import psutil

    run_dir = tmp / "zrl"
    overrides = [
        f"seed={seed}",
        f"stop.wall_time={seconds}",
        "stop.eval_return=null",
        "roles.evaluator=0",  # Sample Factory evaluates nothing while it trains
        f"env.num_envs={s.envs // s.actors}",
        *extra,
    ]
    cmd = [sys.executable, "-m", "zrl", "run", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x),
    }
    run = Run(ZRL, time.time(), command=cmd)
    log = tmp / "zrl.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        root = psutil.Process(proc.pid)
        procs: dict[int, Any] = {}
        cpu: dict[int, float] = {}  # the last CPU time seen per process: it stays counted
        learners: set[int] = set()  # after the process has gone
        try:
            deadline = time.time() + seconds + 180
            next_check = time.time() + STOP_CHECK_S
            while proc.poll() is None and time.time() < deadline:
                time.sleep(MONITOR_EVERY_S)
                if stop_when is not None and time.time() >= next_check:
                    next_check = time.time() + STOP_CHECK_S
                    run.episodes = _zrl_episodes(run_dir, run.launched)
                    if stop_when(run):
                        run.notes.append("stopped: stop_when met")
                        break
                try:
                    for p in [root, *root.children(recursive=True)]:
                        procs.setdefault(p.pid, p)
                except psutil.Error:
                    break
                for pid, p in procs.items():
                    with contextlib.suppress(psutil.Error):
                        cpu[pid] = _cpu(p)
                        # The title is set after the zygote forks: look until it says learner.
                        if pid not in learners and " start learner" in " ".join(p.cmdline()):
                            learners.add(pid)
                learner, total = sum(cpu[p] for p in learners), sum(cpu.values())
                row = _last_csv_row(run_dir / "progress.csv")
                if row is None:
                    continue
                trained = int(float(row.get("samples_trained") or 0))
                lag = row.get("max_version_lag")
                run.samples.append(
                    Sample(
                        time.time(),
                        int(float(row.get("env_steps") or 0)),
                        trained,
                        learner,
                        total,
                        float(lag) if lag else None,
                    )
                )
            if proc.poll() is None and not run.notes:
                run.notes.append("did not stop by itself: killed")
        finally:  # Ctrl-C or an error too: the run stops
            _stop_group(proc)
    run.episodes = _zrl_episodes(run_dir, run.launched)
    if not run.samples:
        run.failed = f"no figures (log: {log})\n" + log.read_text()[-2000:]
    return run


def _zrl_episodes(run_dir: Path, launched: float) -> list[tuple[float, float, float]]:
    """Training episode returns from train_metrics.csv: one (time, mean, weight) per report.
    The time is the supervisor's elapsed time plus the launch: a second or so early."""
    path = run_dir / "train_metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    counts = {
        (r["time"], r["env_steps"]): float(r["value"]) for r in rows if r["tag"] == "actor/episodes"
    }
    return [
        (
            launched + float(r["time"]),
            float(r["value"]),
            counts.get((r["time"], r["env_steps"]), 1.0),
        )
        for r in rows
        if r["tag"] == "actor/episode_return"
    ]


# --- (c): the bare env loop, and zrl with a random policy ------------------------------


def bare_atari_loop(num_envs: int, seconds: float, atari: dict[str, Any]) -> float:
    """Env steps/s of ``AtariVectorEnv`` (C++ threads, one per core) with random actions."""
    return bare_atari_rate(num_envs, seconds, atari)[0]


def bare_atari_rate(
    num_envs: int, seconds: float, atari: dict[str, Any], num_threads: int | None = None
) -> tuple[float, float]:
    """Env steps/s of ``AtariVectorEnv`` with random actions, ``num_threads`` C++ threads
    (None: one per core), and the cores this process used meanwhile (CPU-s per second of
    the timed loop: the emulator's threads and the Python loop)."""
    import inspect

    import numpy as np
    from ale_py.vector_env import AtariVectorEnv

    accepted = inspect.signature(AtariVectorEnv.__init__).parameters
    kwargs = {k: v for k, v in atari.items() if k in accepted and k != "num_threads"}
    threads = num_threads or cores()
    env = AtariVectorEnv("pong", num_envs=num_envs, num_threads=threads, **kwargs)
    rng = np.random.default_rng(0)
    n_actions = int(env.single_action_space.n)
    try:
        env.reset(seed=0)
        for _ in range(20):  # warm-up
            env.step(rng.integers(0, n_actions, num_envs))
        steps, t0, cpu0 = 0, time.perf_counter(), time.process_time()
        while (elapsed := time.perf_counter() - t0) < seconds:
            env.step(rng.integers(0, n_actions, num_envs))
            steps += num_envs
        return steps / elapsed, (time.process_time() - cpu0) / elapsed
    finally:
        env.close()


def _batch_sink(broker_file: Path, stop: threading.Event) -> None:
    """A learner that takes every batch and acknowledges it without training: the replay
    shard's FIFO drains as it would into a learner that keeps up, so (c) measures the actors,
    the broker and the replay shard, not the CNN."""
    from zrl.roles.base import Role
    from zrl.roles.learner import Learner

    class BatchSink(Role):
        role = "learner"

        def setup(self) -> None:
            self.batches = self.open_pull("batches", hwm=2)
            self.acks = self.open_publisher("batch-acks")

        def step(self) -> None:
            got = self.batches.recv()  # waits up to the socket's timeout
            if got is not None:
                Learner.ack_batch(self.acks, got[1])

    deadline = time.time() + 120
    while not broker_file.is_file() and time.time() < deadline and not stop.is_set():
        time.sleep(0.2)
    if not broker_file.is_file():
        return
    sink = BatchSink(
        broker_file.read_text().strip(),
        index=0,
        connect_timeout=60,
        checkpoint_root=broker_file.parent,  # the run directory: its checkpoints go there
    )
    threading.Thread(target=lambda: (stop.wait(), sink.request_stop()), daemon=True).start()
    sink.run()


def run_zrl_random(s: Settings, config: Path, seconds: float, tmp: Path, warmup: float) -> float:
    """Env steps/s through zrl's actors -> broker -> replay shard with ``actor.random_policy``
    (uniform actions, no model) and a learner that only takes the batches (``_batch_sink``):
    the steady rate of progress.csv's env_steps, ``warmup`` s after the first step."""
    stop = threading.Event()
    sink = threading.Thread(target=_batch_sink, args=(tmp / "zrl" / "broker_address", stop))
    sink.start()
    try:
        extra = ["actor.random_policy=true", "roles.learners=0"]
        run = run_zrl(s, config, seconds, 0, tmp, extra)
    finally:
        stop.set()
        sink.join(30)
    moving = [x for x in run.samples if x.env_steps > 0]
    if not moving:
        raise RuntimeError(run.failed or "zrl collected nothing")
    window = [x for x in moving if x.time >= moving[0].time + warmup]
    while len(window) > 1 and window[-1].env_steps == window[-2].env_steps:
        window.pop()  # the stop
    if len(window) < 2:
        raise RuntimeError(f"zrl ran too briefly after the warm-up: use more than {seconds} s")
    return (window[-1].env_steps - window[0].env_steps) / (window[-1].time - window[0].time)


# --- (d): curves -----------------------------------------------------------------------


def final_score(run: Run, seconds: float) -> float | None:
    """Weighted mean return of the episodes of the last FINAL_FRACTION of the wall time,
    counted from each system's launch (what either ran past ``seconds`` is left out)."""
    start, end = run.launched + (1 - FINAL_FRACTION) * seconds, run.launched + seconds
    got = [(r, w) for t, r, w in run.episodes if start <= t <= end]
    weight = sum(w for _, w in got)
    return sum(r * w for r, w in got) / weight if weight else None


def write_curves(runs: list[Run], png: Path, csv_path: Path) -> str:
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "minutes", "episode_return", "weight"])
        for run in runs:
            for t, r, n in run.episodes:
                w.writerow([run.system, round((t - run.launched) / 60, 4), r, n])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"{csv_path} (matplotlib not installed: no PNG)"
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        bins: dict[int, list[float]] = {}
        for t, r, n in run.episodes:
            b = int((t - run.launched) // 60)
            acc = bins.setdefault(b, [0.0, 0.0])
            acc[0] += r * n
            acc[1] += n
        xs = sorted(bins)
        ax.plot(
            [x + 0.5 for x in xs],
            [bins[x][0] / bins[x][1] for x in xs],
            label=run.system,
            marker="o",
            ms=3,
        )
    ax.set_xlabel("minutes since launch")
    ax.set_ylabel("training episode return (mean per minute)")
    ax.set_title("Pong, 2-core CPU machine")
    ax.legend()
    ax.grid(alpha=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return f"{png}, {csv_path}"


# --- printing --------------------------------------------------------------------------


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return "      n/a"
    med = statistics.median(ok)
    return f"{med:9.1f}" + (
        f"  ({min(ok):.1f}-{max(ok):.1f} over {len(ok)})" if len(ok) > 1 else ""
    )


def verdict(name: str, zrl: list[float], peer: list[float], target: float, report: dict) -> None:
    z = [v for v in zrl if not math.isnan(v)]
    p = [v for v in peer if not math.isnan(v)]
    if not z or not p:
        print(f"  ratio zrl/peer: n/a  target >= {target:g}: NOT MEASURED")
        report[name] = {"ratio": None, "met": False}
        return
    ratio = statistics.median(z) / statistics.median(p)
    met = ratio >= target
    print(f"  ratio zrl/peer: {ratio:.2f}  target >= {target:g}: {'MET' if met else 'NOT MET'}")
    report[name] = {"ratio": ratio, "met": met, "zrl": z, "peer": p}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="a,b,c", help="any of a,b,c,d")
    parser.add_argument("--seconds", type=float, default=120.0, help="per throughput run")
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="seconds after the first trained batch before rates count",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--envs-per-core", type=int, default=8)
    parser.add_argument("--curve-minutes", type=float, default=30.0)
    parser.add_argument(
        "--curve-out", type=Path, default=CURVE_OUT, help="(d) writes this .png and .csv"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zrl-config", type=Path, default=REPO / "configs" / "pong_appo.yaml")
    parser.add_argument(
        "--zrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more zrl overrides (repeatable)",
    )
    parser.add_argument("--sf-venv", type=Path, default=SF_VENV)
    parser.add_argument("--build-sf-venv", action="store_true", help="build it if missing")
    parser.add_argument("--skip-zrl", action="store_true")
    parser.add_argument("--skip-sf", action="store_true")
    args = parser.parse_args()
    sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    if sections - set("abcd"):
        parser.error(f"unknown sections {sorted(sections - set('abcd'))}")

    need_sf = not args.skip_sf and sections & set("abd")
    sf_py = sf_python(args.sf_venv)
    if need_sf:
        if args.build_sf_venv:
            sf_py = build_sf_venv(args.sf_venv)
        elif not sf_venv_ok(args.sf_venv):
            sys.exit(f"no Sample Factory venv at {args.sf_venv}: pass --build-sf-venv")
    if not args.skip_zrl and sections & set("abd") and not args.zrl_config.is_file():
        sys.exit(f"{args.zrl_config} not found (--zrl-config)")
    s = (
        settings_from_config(args.zrl_config, args.envs_per_core)
        if args.zrl_config.is_file()
        else Settings(args.envs_per_core, cores(), cores(), 32, 512, 512, 1)
    )
    print(f"Pong, {s.describe()}; load average {load()}", flush=True)
    report: dict[str, Any] = {"settings": s.describe(), "load_before": load()}

    def one(system: str, seconds: float, seed: int) -> Run:
        with tempfile.TemporaryDirectory(prefix="zrl-atari-") as tmp:
            if system == ZRL:
                return run_zrl(s, args.zrl_config, seconds, seed, Path(tmp), args.zrl_set)
            return run_sf(s, seconds, seed, Path(tmp), sf_py)

    systems = ([] if args.skip_zrl else [ZRL]) + ([] if args.skip_sf else [SF])
    if sections & {"a", "b"}:
        rates: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
        for r in range(args.repeats):
            for name in systems if r % 2 == 0 else systems[::-1]:
                run = one(name, args.seconds, args.seed + r)
                st = run.steady(args.warmup) if not run.failed else None
                if st is None:
                    print(
                        f"repeat {r}: {name}: no steady-state figures {run.failed or ''}",
                        file=sys.stderr,
                    )
                    st = {
                        k: math.nan
                        for k in (
                            "env_steps_per_s",
                            "trained_per_s",
                            "trained_per_learner_cpu_s",
                            "lag",
                            "startup_s",
                            "learner_cores",
                            "total_cores",
                            "window_s",
                        )
                    }
                rates[name].append(st)
                print(
                    f"repeat {r}: {name:<15} "
                    + ", ".join(f"{k} {v:.1f}" for k, v in st.items())
                    + (f"  [{'; '.join(run.notes)}]" if run.notes else "")
                    + f"  load {load()}",
                    flush=True,
                )
        report["rates"] = rates

        def col(name: str, key: str) -> list[float]:
            return [x[key] for x in rates.get(name, [])]

        if "a" in sections:
            print(f"\n(a) env steps/s with learning on (frameskip 4), median of {args.repeats}")
            for name in systems:
                print(
                    f"  {name:<16}{spread(col(name, 'env_steps_per_s'))}   trained/s "
                    f"{spread(col(name, 'trained_per_s')).strip()}, policy lag "
                    f"{spread(col(name, 'lag')).strip()}"
                )
            if len(systems) == 2:
                verdict(
                    "a_env_steps_per_s",
                    col(ZRL, "env_steps_per_s"),
                    col(SF, "env_steps_per_s"),
                    TARGET_THROUGHPUT,
                    report,
                )
        if "b" in sections:
            print("\n(b) samples trained per learner CPU-second")
            for name in systems:
                print(
                    f"  {name:<16}{spread(col(name, 'trained_per_learner_cpu_s'))}   learner "
                    f"cores {spread(col(name, 'learner_cores')).strip()}, all cores "
                    f"{spread(col(name, 'total_cores')).strip()}"
                )
            if len(systems) == 2:
                verdict(
                    "b_trained_per_learner_cpu_s",
                    col(ZRL, "trained_per_learner_cpu_s"),
                    col(SF, "trained_per_learner_cpu_s"),
                    TARGET_CPU,
                    report,
                )

    if "c" in sections:
        bare: list[float] = []
        zrl_random: list[float] = []
        for _ in range(args.repeats):
            bare.append(bare_atari_loop(s.envs, min(args.seconds, 60.0), s.atari))
            if not args.skip_zrl:
                with tempfile.TemporaryDirectory(prefix="zrl-atari-") as tmp:
                    zrl_random.append(
                        run_zrl_random(s, args.zrl_config, args.seconds, Path(tmp), args.warmup)
                    )
        print(f"\n(c) env steps/s, random actions, {s.envs} envs, batches taken untrained")
        print(f"  {'bare AtariVectorEnv':<20}{spread(bare)}")
        if zrl_random:
            print(f"  {'zrl actors->replay':<20}{spread(zrl_random)}")
        verdict("c_pipeline_over_bare", zrl_random, bare, TARGET_PIPELINE, report)
        report["c_bare"] = bare

    if "d" in sections:
        seconds = args.curve_minutes * 60
        curves = [one(name, seconds, args.seed) for name in systems]
        print(
            f"\n(d) training episode return after {args.curve_minutes:g} min each "
            f"(mean over the last {FINAL_FRACTION:.0%} of the time)"
        )
        finals = {}
        for run in curves:
            finals[run.system] = final_score(run, seconds)
            shown = "n/a" if finals[run.system] is None else f"{finals[run.system]:.2f}"
            print(f"  {run.system:<16}{shown:>9}   ({len(run.episodes)} reports/episodes)")
        out = args.curve_out
        print(
            f"  written: {write_curves(curves, out.with_suffix('.png'), out.with_suffix('.csv'))}"
        )
        z, p = finals.get(ZRL), finals.get(SF)
        met = z is not None and p is not None and z >= p
        if len(systems) == 2:
            diff = "n/a" if z is None or p is None else f"{z - p:+.2f}"
            print(f"  zrl - SF: {diff}  target zrl >= SF: {'MET' if met else 'NOT MET'}")
        report["d_final_scores"] = finals
        report["d_met"] = met
    report["load_after"] = load()
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
