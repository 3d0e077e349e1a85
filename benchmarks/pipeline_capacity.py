"""The pipeline's capacity without the model, on this machine (issue 42, item 2).

Is the input path ever the limit? Pong APPO's real processes (``configs/pong_appo.yaml``:
``zrl run``'s actors acting uniformly at random, ``actor.random_policy``; the broker; a FIFO
replay shard; the parameter server) feed a real learner role (``zrl.roles.learner.Learner``,
in a process this script starts, joining as learner-0 with the run's keys as ``zrl start
learner --keys`` would) whose APPO update trains nothing: ``train_unrolls`` is a no-op of zero
cost (:func:`no_model`); receiving, decoding, checking, staging, acks, heartbeats run as in a
real learner, and its weights go to the parameter server by time
(``learner.publish_interval=1``, ``learner.publish_every_s=1``). The device work before the
model step (frame stacks, input statistics) is skipped as on a GPU, where it is no host work,
or run on the CPU with ``--device-work``. All in one run, because this machine is noisy:

  bare     the bare ``AtariVectorEnv`` loop with random actions, the same envs
           (``--actors`` x ``--envs``) and threads (``--actors`` x ``env.atari.num_threads``)
  e2e      env steps/s through to the learner (samples it received) over the steady window
           (``--warmup`` s after its first batch to its last), the actors' env steps/s, and
           each process's cores (psutil) and the whole machine's over it
  learner  host-side CPU-ms per 1024 samples, two ways: (process) the learner process's CPU
           over the window (every thread) less its device work, per-second costs in; (stages)
           in this process, the same update fed Pong batches recorded from a random actor
           through a FIFO shard (``gpu_host.record_batches``), each stage timed: decode,
           check, stage (the CPU path's copy into plain memory), the rest of ``train``;
           beside them the GPU path's copy into reused host buffers (as into pinned ones)
           and the device work as it costs on this CPU.

Targets: e2e >= 0.8 of the bare loop; learner host side <= 2 CPU-ms per 1024 samples (500
batches/s on one core). Where one is missed, "What limits" says which stage and by how much:
CPU-us per env step of each process against the emulator's own (the bare loop's), and the
learner's stages. Every process it starts is stopped by its pid, on Ctrl-C and errors too.
From the repo root (about two minutes with the defaults)::

    python benchmarks/pipeline_capacity.py
    python benchmarks/pipeline_capacity.py --seconds 30 --actors 2 --envs 8 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # atari.py, gpu_host.py beside it

import atari  # noqa: E402 - the path above first
import gpu_host  # noqa: E402

REPO = atari.REPO
CONFIG = REPO / "configs" / "pong_appo.yaml"
TARGET_VS_BARE = 0.8  # e2e env steps/s / the bare loop's
TARGET_HOST_MS = 2.0  # learner CPU-ms per 1024 samples, everything but the model
PER = 1024  # samples per figure: one Pong APPO batch (32 unrolls x 32 steps)
STATS_EVERY_S = 0.5  # the learner process writes its counters this often
RUN_SETS = (
    "actor.random_policy=true",  # uniform actions, the model never run
    "roles.learners=0",  # the learner is ours (--learner-process), joining as learner-0
    "learner.device=cpu",
    "learner.publish_interval=1",
    "learner.publish_every_s=1",  # params publishing by time
)
SATURATED = 0.9  # of the machine's cores used: the run was CPU-bound


# --- the learner: a real role, its update's model step a no-op -------------------------


def no_model(update: Any) -> Any:
    """``update`` (an ``UnrollUpdate``: APPO's) with its training step a no-op of zero cost:
    everything it does before ``train_unrolls`` (check, stage, frame stacks, input
    statistics, policy lag) stays; one "update" per batch, so the learner counts samples
    and publishes as it would."""
    from zrl.algos.api.learner import UpdateResult
    from zrl.algos.kernel.unrolls import UnrollUpdate

    if not isinstance(update, UnrollUpdate):
        raise TypeError(f"{type(update).__name__} is no UnrollUpdate")
    update.train_unrolls = lambda batch: UpdateResult(updates=1, loss=0.0)  # type: ignore[method-assign]
    return update


def learner_process(
    run_dir: Path, stats: Path, run_device_work: bool, connect_timeout: float = 120.0
) -> None:
    """``--learner-process``: a ``Learner`` role (index 0) with a :func:`no_model` update,
    joining the run in ``run_dir`` once its broker's address is there, its device work
    (:func:`device_work`) timed or, without ``run_device_work``, skipped as on a GPU; its
    counters written to ``stats`` (JSON lines: time, samples, batches, this process's CPU-s,
    the device work's CPU-s, weights sent) every ``STATS_EVERY_S`` and at the end. Stops on
    SIGTERM or when the run stops."""
    from zrl.roles.learner import Learner
    from zrl.transport.security import load_keys

    timers: dict[str, Timed] = {}

    class NoModelLearner(Learner):
        def make_update(self, spaces: Any, services: Any = None) -> Any:
            return no_model(super().make_update(spaces, services))

        def step(self) -> None:
            super().step()
            if time.monotonic() >= self.next_stats:
                self.write_stats()

        def write_stats(self) -> None:
            self.next_stats = time.monotonic() + STATS_EVERY_S
            row = {
                "time": time.time(),
                "samples": self.samples_trained,
                "batches": self.updates,
                "cpu_s": time.process_time(),
                "machine_busy_s": machine_busy_s(),
                "device_cpu_s": sum(t.cpu for t in timers.values()),
                "weights_sent": self.weights_sent,
                "publish_s": self.time_s["publish"],  # wall: building and sending weights
            }
            with open(stats, "a") as f:
                f.write(json.dumps(row) + "\n")

        def teardown(self) -> None:
            self.write_stats()
            super().teardown()

    address = run_dir / "broker_address"
    deadline = time.monotonic() + connect_timeout
    while not address.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not address.is_file():
        raise SystemExit(f"no broker address at {address} after {connect_timeout:g} s")
    keys = run_dir / "keys"  # zrl run's key directory, as `zrl start learner --keys` takes
    learner = NoModelLearner(
        address.read_text().strip(),
        index=0,
        connect_timeout=connect_timeout,
        keys=load_keys(keys, "client") if keys.is_dir() else None,
        checkpoint_root=run_dir,  # the run directory: its checkpoints go there
    )
    learner.next_stats = 0.0
    signal.signal(signal.SIGTERM, lambda *_: learner.request_stop())
    with device_work(run_device_work) as timed:
        timers.update(timed)
        learner.run()


# --- stopping what we started ----------------------------------------------------------


def stop_pid(proc: subprocess.Popen[Any] | None) -> None:
    """A process this script started in a session of its own: SIGTERM to its group, then
    SIGKILL; by its pid, never by name."""
    if proc is not None:
        atari._stop_group(proc)


def raise_on_sigterm() -> None:
    """SIGTERM (and SIGHUP) as Ctrl-C: the ``finally`` blocks stop what was started."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


# --- the run's figures -----------------------------------------------------------------


@dataclasses.dataclass
class Window:
    """The steady window of the run: from ``warmup`` s after the learner's first batch to
    its last."""

    t0: float
    t1: float
    samples: int
    learner_cpu_s: float
    """The learner process's CPU time (every thread)."""
    device_cpu_s: float
    """Of which its device work (``device_work``: 0 where skipped)."""
    machine_busy_s: float
    """CPU-seconds the whole machine was busy (every process, others' too)."""
    env_steps_per_s: float | None
    """The actors' (progress.csv's ``env_steps``) over the rows inside the window."""
    publish_s: float = math.nan
    """The learner's wall time building and sending weights (its ``time_s["publish"]``)."""

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else math.nan

    @property
    def machine_cores(self) -> float:
        return self.machine_busy_s / self.seconds if self.seconds > 0 else math.nan

    @property
    def learner_ms_per_1024(self) -> float | None:
        """The learner process's CPU-ms per 1024 samples, less its device work."""
        cpu = self.learner_cpu_s - self.device_cpu_s
        return 1e3 * PER * cpu / self.samples if self.samples else None

    @property
    def device_ms_per_1024(self) -> float | None:
        return 1e3 * PER * self.device_cpu_s / self.samples if self.samples else None


def read_stats(path: Path) -> list[dict[str, float]]:
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def steady_window(
    stats: Sequence[dict[str, float]], env: Sequence[tuple[float, int]], warmup: float
) -> Window | None:
    """The learner's counters (``read_stats``) over the steady window, and the actors' env
    steps/s over the (time, env_steps) rows ``env`` inside it, up to the last that moved;
    None when too little moved."""
    first = next((r for r in stats if r["samples"] > 0), None)
    if first is None:
        return None
    rows = [r for r in stats if r["time"] >= first["time"] + warmup]
    while len(rows) > 1 and rows[-1]["samples"] == rows[-2]["samples"]:
        rows.pop()  # the stop
    if len(rows) < 2 or rows[-1]["samples"] <= rows[0]["samples"]:
        return None
    a, b = rows[0], rows[-1]
    inside = [(t, v) for t, v in env if a["time"] <= t <= b["time"]]
    while len(inside) > 1 and inside[-1][1] == inside[-2][1]:
        inside.pop()  # the stop, or progress.csv not written again yet
    actors = None
    if len(inside) > 1 and inside[-1][0] > inside[0][0]:
        actors = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
    return Window(
        a["time"],
        b["time"],
        int(b["samples"] - a["samples"]),
        b["cpu_s"] - a["cpu_s"],
        b.get("device_cpu_s", 0.0) - a.get("device_cpu_s", 0.0),
        b.get("machine_busy_s", math.nan) - a.get("machine_busy_s", math.nan),
        actors,
        b.get("publish_s", math.nan) - a.get("publish_s", math.nan),
    )


def machine_busy_s() -> float:
    """CPU-seconds the machine's cores have been busy since boot (every process)."""
    import psutil

    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def window_cores(log: Path, t0: float, t1: float, names: dict[int, str]) -> dict[str, float]:
    """Cores used per kind of process between ``t0`` and ``t1``, from ``gpu_host.ProcCpu``'s
    CSV (time, pid, label, cpu_s): each process's CPU at its last sample by ``t1`` less at its
    last by ``t0`` (0 if it started after), over ``t1 - t0``; ``names`` labels some by pid."""
    before: dict[int, float] = {}
    until: dict[int, float] = {}
    label: dict[int, str] = {}
    with open(log, newline="") as f:
        for row in csv.DictReader(f):
            t, pid, cpu = float(row["time"]), int(row["pid"]), float(row["cpu_s"])
            label[pid] = names.get(pid, row["label"])
            if t <= t0:
                before[pid] = cpu
            if t <= t1:
                until[pid] = cpu
    out: dict[str, float] = {}
    for pid, cpu in until.items():
        out[label[pid]] = out.get(label[pid], 0.0) + (cpu - before.get(pid, 0.0)) / (t1 - t0)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclasses.dataclass
class PipelineRun:
    window: Window | None
    cores: dict[str, float]
    command: str
    failed: str = ""
    weights_sent: int = 0


def run_pipeline(args: argparse.Namespace, tmp: Path) -> PipelineRun:
    """``zrl run`` (``RUN_SETS``: random actors, no learner of its own) and our learner
    process beside it, for ``args.seconds`` after the first env step; every process's CPU
    sampled each second (``gpu_host.ProcCpu``)."""
    s = atari.settings_from_config(args.config, 1)
    # run_zrl gives each actor s.envs // s.actors envs: --envs
    s = dataclasses.replace(s, envs_per_core=args.envs, cores=args.actors, actors=args.actors)
    sets = [*RUN_SETS, f"roles.actors={args.actors}", *args.set]
    cap = args.seconds + 120  # start-up included
    sets.append(f"stop.wall_time={cap}")
    run_dir = tmp / "zrl"
    stats = tmp / "learner.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    learner: subprocess.Popen[Any] | None = None
    cpu_log = tmp / "cpu.csv"
    try:
        with open(tmp / "learner.log", "w") as log:  # the child has its own copy
            learner = subprocess.Popen(
                [sys.executable, __file__, "--learner-process", str(run_dir), str(stats)]
                + (["--device-work"] if args.device_work else []),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        with gpu_host.ProcCpu(cpu_log):
            stop = gpu_host.stop_after_stepping(args.seconds, cap)
            run = atari.run_zrl(s, args.config, cap, args.seed, tmp, sets, stop)
    finally:
        stop_pid(learner)
    rows = read_stats(stats)
    env_rows = [(x.time, x.env_steps) for x in run.samples]
    win = steady_window(rows, env_rows, args.warmup)
    names = {os.getpid(): "this script"}
    if learner is not None:
        names[learner.pid] = "learner (no-op update)"
    cores = window_cores(cpu_log, win.t0, win.t1, names) if win else {}
    failed = ""
    if win is None:
        tail = (tmp / "learner.log").read_text(errors="replace")[-1500:]
        failed = (run.failed or "the learner received too little") + "\nlearner log:\n" + tail
    sent = int(rows[-1]["weights_sent"]) if rows else 0
    return PipelineRun(win, cores, gpu_host.shown_command(run.command), failed, sent)


# --- the learner's stages, in this process ---------------------------------------------


@dataclasses.dataclass
class HostSide:
    """CPU-ms per 1024 samples of each of the learner's stages (``stages``: the host side;
    ``device``: the work a GPU learner does on its device, here on the CPU; ``gpu_stage``:
    the GPU path's copy into reused host buffers) over ``samples`` fed in ``seconds``."""

    stages: dict[str, float]
    device: dict[str, float]
    gpu_stage: float
    samples: int
    seconds: float

    @property
    def total(self) -> float:
        """The host side: what a GPU learner's CPU does per 1024 samples, but the GPU path's
        copy (``gpu_stage``: add it for a GPU learner; the CPU path copies in ``stage``)."""
        return sum(self.stages.values())

    @property
    def device_total(self) -> float:
        return sum(self.device.values())


class Timed:
    """Wraps a callable: its calls' thread CPU time, added up."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.cpu = fn, 0.0

    def __call__(self, *a: Any, **k: Any) -> Any:
        t = time.thread_time()
        try:
            return self.fn(*a, **k)
        finally:
            self.cpu += time.thread_time() - t


def _skip_stacks(frames: Any, valid: Any) -> tuple[Any, Any]:
    return frames, frames  # unread: the no-op update trains on nothing


def _skip_observe(model: Any, obs: Any) -> None:
    return None


DEVICE_WORK = {
    "frame stacks": ("stacks_from_frames", _skip_stacks),
    "input statistics": ("observe_inputs", _skip_observe),
}
"""What ``UnrollUpdate.train_batch`` does on the learner's device before the model step
(``zrl.algos.kernel.unrolls``' names): on a GPU none of it is host work."""


@contextlib.contextmanager
def device_work(run: bool) -> Any:
    """While in it, ``zrl.algos.kernel.unrolls``' device work (``DEVICE_WORK``) timed
    (``Timed``, by this process's thread CPU), or with ``run`` False skipped at zero cost as
    on a GPU, where it is no host work; yields the timers by name."""
    from zrl.algos.kernel import unrolls

    saved = {attr: getattr(unrolls, attr) for attr, _ in DEVICE_WORK.values()}
    timers = {
        name: Timed(saved[attr] if run else skip) for name, (attr, skip) in DEVICE_WORK.items()
    }
    try:
        for name, (attr, _) in DEVICE_WORK.items():
            setattr(unrolls, attr, timers[name])
        yield timers
    finally:
        for attr, fn in saved.items():
            setattr(unrolls, attr, fn)


def host_side(
    update: Any, frames: Sequence[Sequence[bytes]], seconds: float, warmup: int = 2
) -> HostSide:
    """The learner's stages on batches' wire ``frames`` (``gpu_host.wire_frames``), fed round
    and round to ``update`` (a :func:`no_model` APPO update on the CPU) as the learner role
    does, each stage timed by thread CPU for ``seconds`` (one batch at least) after
    ``warmup`` batches. Host side: ``decode`` (``P.decode``), ``check`` (``update.receive``
    less its staging: the schema, the actions, the fresh rows), ``stage`` (the CPU path's
    copy into plain memory, ``HostStaging.move``), ``rest of train`` (``update.train`` less
    its device work: the policy lag, the bookkeeping) and the loop. Device work
    (``device_work``): the frame stacks and the input statistics. ``gpu_stage``: the same
    arrays copied into reused host buffers as a GPU learner stages them into pinned ones
    (``HostStaging.stage``, plain memory here)."""
    from zrl.algos.kernel.batches import HostStaging
    from zrl.algos.kernel.unrolls import FRAME_TRAINED_ARRAYS
    from zrl.transport import protocol as P

    decode = Timed(P.decode)
    stage = Timed(update.staging.move)
    receive = Timed(update.receive)
    train = Timed(update.train)
    gpu_staging = HostStaging(update.device, pin=False)
    gpu_stage = Timed(gpu_staging.stage)
    update.staging.move = stage
    samples = i = 0
    with device_work(True) as dev:

        def one() -> int:
            nonlocal i
            msg = decode(frames[i % len(frames)])
            receive(msg, 0)
            got = train(0)
            gpu_stage({n: msg.arrays[n] for n in FRAME_TRAINED_ARRAYS if n in msg.arrays})
            i += 1
            if got is None:
                raise RuntimeError("the no-op update trained nothing on a recorded batch")
            return int(got.samples)

        for _ in range(warmup):
            one()
        for t in (decode, stage, receive, train, gpu_stage, *dev.values()):
            t.cpu = 0.0
        cpu0, t0 = time.thread_time(), time.perf_counter()
        while samples == 0 or time.perf_counter() - t0 < seconds:
            samples += one()
        wall = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
    del update.staging.move  # the instance's own method again
    per = 1e3 * PER / samples
    device = {name: t.cpu * per for name, t in dev.items()}
    stages = {
        "decode": decode.cpu * per,
        "check": (receive.cpu - stage.cpu) * per,
        "stage": stage.cpu * per,
        "rest of train": train.cpu * per - sum(device.values()),
    }
    stages["loop"] = (cpu - gpu_stage.cpu) * per - sum(stages.values()) - sum(device.values())
    return HostSide(stages, device, gpu_stage.cpu * per, samples, wall)


# --- the verdicts and what limits ------------------------------------------------------


def pipeline_limit(
    rate: float,
    bare_rate: float,
    bare_cores: float,
    cores: dict[str, float],
    machine: int,
    busy: float,
) -> list[str]:
    """Which stage limits the end-to-end ``rate`` (env steps/s), and by how much: each kind
    of process's CPU-us per env step (``cores``: from ``window_cores``) against the
    emulator's own (the bare loop's cores over its rate); the actors' own is theirs less
    the emulator's work. The target allows the stages together ``1 / 0.8 - 1`` of the
    emulator's; the ratio "without" a stage is the emulator's share of the rest. ``busy``:
    the cores the whole machine had busy (others' processes too)."""
    env_us = 1e6 * bare_cores / bare_rate
    total = sum(cores.values())
    per = {k: 1e6 * v / rate for k, v in cores.items() if k != "this script"}
    if "zrl actor" in per:
        per["zrl actor, less the emulator"] = per.pop("zrl actor") - env_us
    stages = sum(per.values())
    budget = env_us * (1 / TARGET_VS_BARE - 1)
    lines = [
        f"  per env step: the emulator {env_us:.0f} CPU-us (the bare loop's), the stages "
        f"{stages:.0f} CPU-us where the target allows {budget:.0f} ({stages / budget:.1f}x); "
        f"ratio by this count {env_us / (env_us + stages):.2f}, measured {rate / bare_rate:.2f}"
    ]
    others = max(0.0, busy - total) if math.isfinite(busy) else math.nan
    used = f"{busy:.2f} of {machine} cores busy: this run {total:.2f}, other processes {others:.2f}"
    if not busy < SATURATED * machine:  # NaN too: not known to be idle
        lines.append(f"  CPU-bound: {used}")
    else:
        lines.append(
            f"  not CPU-bound ({used}): a stage waits (the replay queue, the learner's "
            "credit, the actors' in-flight window)"
        )
    for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
        if us > 0:
            without = env_us / (env_us + stages - us)
            lines.append(f"    {name:<30}{us:7.0f} CPU-us per step; without it {without:.2f}")
    return lines


def host_limit(
    hs: HostSide, process: float | None, rate: float | None, publish_ms_per_s: float = math.nan
) -> list[str]:
    """Which of the learner's host-side stages limits, and by how much; what its process
    spent beyond them (at ``rate`` samples/s) as CPU-ms per second, which costs less per
    batch the more batches a second come."""
    lines = []
    if process is not None and rate:
        rest = process - hs.total
        per_s = rest * rate / PER
        lines.append(
            f"  the learner process {process:.2f} CPU-ms per 1024 = its stages {hs.total:.2f} "
            f"+ {rest:.2f} more (sockets, acks, heartbeats, weights sent by time, the "
            f"receive polls): {per_s:.0f} CPU-ms per second at {rate:,.0f} samples/s, "
            f"{per_s / 100:.2f} per batch if it were paid per second at 100 batches/s"
        )
        if math.isfinite(publish_ms_per_s):
            lines.append(
                f"    of which building and sending weights {publish_ms_per_s:.0f} ms/s (wall)"
            )
    name, worst = max(hs.stages.items(), key=lambda kv: kv[1])
    over = hs.total - TARGET_HOST_MS
    lines.append(
        f"  the stages {hs.total:.2f} CPU-ms per 1024: {over:+.2f} ({over / TARGET_HOST_MS:+.0%}) "
        f"against the target's {TARGET_HOST_MS:g}; the largest, {name}, {worst:.2f} "
        f"({worst / hs.total:.0%} of them); without it {hs.total - worst:.2f}"
    )
    return lines


def table(rows: Sequence[tuple[str, str, str]]) -> str:
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"  {a:<{w}}  {b:>14}  {c}" for a, b, c in rows)


# --- main ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="the run, from its first env step")
    ap.add_argument("--bare-seconds", type=float, default=15.0, help="the bare loop")
    ap.add_argument("--host-seconds", type=float, default=8.0, help="the in-process stages")
    ap.add_argument(
        "--host-batches",
        type=int,
        default=2,
        help="batches recorded for them; 0: one synthetic batch in the shard's wire format "
        "(learner_cpu.frame_batch), no recording run (the test's)",
    )
    ap.add_argument("--warmup", type=float, default=10.0, help="s after the first batch")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--envs", type=int, default=8, help="envs per actor")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--set", action="append", default=[], help="more zrl run --set KEY=VALUE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--device-work",
        action="store_true",
        help="the learner rebuilds the frame stacks and the input statistics on the CPU, as a "
        "CPU learner; without it, skipped, as on a GPU where they are no host work",
    )
    ap.add_argument(
        "--learner-process", nargs=2, metavar=("RUN_DIR", "STATS"), help=argparse.SUPPRESS
    )
    return ap.parse_args(argv)


def atari_threads(config: Path) -> int:
    s = atari.settings_from_config(config, 1)
    return int(s.atari.get("num_threads", 1) or 1)


def record(config: Path, batches: int) -> tuple[Any, list[list[bytes]]]:
    """A :func:`no_model` APPO update on the CPU (``gpu_host.make_learner_update``) and
    ``batches`` Pong batches' wire frames recorded from a random actor through a FIFO shard
    (``gpu_host.record_batches``); for 0, one synthetic batch of the same wire format
    (``learner_cpu.frame_batch``) and no recording run."""
    sets = ["actor.random_policy=true"]
    if batches > 0:
        msgs = gpu_host.record_batches(config, batches, sets)
    else:
        import learner_cpu  # beside this file (the path above)

        msgs = [learner_cpu.frame_batch(np.random.default_rng(0))]
    return no_model(gpu_host.make_learner_update(config, "cpu", sets)), gpu_host.wire_frames(msgs)


def report(
    args: argparse.Namespace,
    bare: tuple[float, float],
    run: PipelineRun,
    hs: HostSide,
    loads: tuple[str, str],
) -> dict[str, Any]:
    """The figures as a table, the verdicts and what limits (printed); the same as a dict."""
    bare_rate, bare_cores = bare
    w = run.window
    e2e = w.samples_per_s if w else None
    actors = w.env_steps_per_s if w else None
    process = w.learner_ms_per_1024 if w else None
    ratio = gpu_host.ratio
    rows = [
        ("", "env steps/s", "/ bare loop"),
        ("bare AtariVectorEnv", f"{bare_rate:,.0f}", f"1.00  ({bare_cores:.2f} cores)"),
        ("zrl actors (env steps)", fmt(actors), fmt(ratio(actors, bare_rate), ".2f")),
        ("zrl end to end (learner)", fmt(e2e), fmt(ratio(e2e, bare_rate), ".2f")),
    ]
    print("\n" + table(rows))
    if w:
        print(
            f"  window {w.seconds:.0f} s ({args.warmup:g} s after the learner's first batch), "
            f"{w.samples:,} samples; weights sent {run.weights_sent}; learner device work "
            + ("run on the CPU (--device-work)" if args.device_work else "skipped, as on a GPU")
        )
        print("  cores in the window: " + ", ".join(f"{k} {v:.2f}" for k, v in run.cores.items()))
        print(
            f"  the machine: {w.machine_cores:.2f} of {atari.cores()} cores busy, "
            f"{sum(run.cores.values()):.2f} of them this run's"
        )
    print("\n  learner, CPU-ms per 1024 samples")
    print(f"    host side, the learner process (its CPU less device work)  {fmt(process, '.2f')}")
    print(f"    host side, its stages timed in this process                {hs.total:.2f}")
    for k, v in hs.stages.items():
        print(f"      {k:<57}{v:.2f}")
    print(f"    a GPU learner's copy into pinned buffers (plain here)      {hs.gpu_stage:.2f}")
    print(f"    device work, on the CPU here (on a GPU: the GPU's)         {hs.device_total:.2f}")
    for k, v in hs.device.items():
        print(f"      {k:<57}{v:.2f}")
    if w and args.device_work:
        shown = fmt(w.device_ms_per_1024, ".2f")
        print(f"    device work in the learner process                         {shown}")
    print(f"\n  load average at start {loads[0]}, at the end {loads[1]}")
    print("\nVerdicts:")
    r_e2e = ratio(e2e, bare_rate)
    print(gpu_host.verdict("end to end / bare loop", r_e2e, TARGET_VS_BARE))
    gpu_path = hs.total - hs.stages["stage"] + hs.gpu_stage
    print(gpu_host.verdict("learner host side, its stages", hs.total, TARGET_HOST_MS, True))
    print(gpu_host.verdict("the same, GPU path's copy", gpu_path, TARGET_HOST_MS, True))
    print(
        gpu_host.verdict(
            "learner host side, its process (per-second costs in)", process, TARGET_HOST_MS, True
        )
    )
    limits: list[str] = []
    if r_e2e is not None and e2e and r_e2e < TARGET_VS_BARE:
        machine = atari.cores()
        busy = w.machine_cores if w else math.nan
        limits += [
            "end to end:",
            *pipeline_limit(e2e, bare_rate, bare_cores, run.cores, machine, busy),
        ]
    if max(process or 0.0, hs.total, gpu_path) > TARGET_HOST_MS:
        publish = 1e3 * w.publish_s / w.seconds if w else math.nan
        limits += ["learner host side:", *host_limit(hs, process, e2e, publish)]
    if limits:
        print("\nWhat limits:\n" + "\n".join(limits))
    return {
        "bare": {"env_steps_per_s": bare_rate, "cores": bare_cores},
        "actors_env_steps_per_s": actors,
        "e2e_samples_per_s": e2e,
        "ratio": r_e2e,
        "learner_host_ms_per_1024": process,
        "host_side": dataclasses.asdict(hs) | {"total": hs.total, "gpu_path": gpu_path},
        "cores": run.cores,
        "window": dataclasses.asdict(w) if w else None,
        "device_work": args.device_work,
        "load": list(loads),
        "command": run.command,
        "failed": run.failed,
        "limits": limits,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.learner_process:
        run_dir, stats = (Path(x) for x in args.learner_process)
        learner_process(run_dir, stats, args.device_work)
        return 0
    raise_on_sigterm()
    envs = args.actors * args.envs
    threads = args.actors * atari_threads(args.config)
    load0 = atari.load()
    print(
        f"pipeline capacity, Pong APPO without the model: {args.actors} actors x {args.envs} "
        f"envs, {threads} emulator thread(s); {atari.cores()} cores, load average {load0}",
        flush=True,
    )
    s = atari.settings_from_config(args.config, 1)
    bare = atari.bare_atari_rate(envs, args.bare_seconds, s.atari, threads)
    print(f"  bare AtariVectorEnv: {bare[0]:,.0f} env steps/s on {bare[1]:.2f} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="zrl-capacity-") as tmp:
        run = run_pipeline(args, Path(tmp))
    print(f"  {run.command}", flush=True)
    if run.failed:
        print(f"  the run: {run.failed}", file=sys.stderr)
    update, frames = record(args.config, args.host_batches)
    hs = host_side(update, frames, args.host_seconds)
    out = report(args, bare, run, hs, (load0, atari.load()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0 if run.window else 1


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "n/a" if x is None or math.isnan(x) else format(x, spec)


if __name__ == "__main__":
    sys.exit(main())
