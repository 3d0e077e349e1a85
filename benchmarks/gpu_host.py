"""A GPU host: zrl against Sample Factory 2.1.1 on Pong APPO, side by side in one run (issue 29).

Sections (``--sections g1,g2,g3,g4``; default all four):

  (g1) env steps/s with learning on, Pong APPO (``configs/pong_appo.yaml``: rollout 32,
       batches of 1024 samples, 1 epoch, Nature CNN): zrl with ``roles.actors=auto``,
       ``env.num_envs=--zrl-envs`` and ``learner.device=cuda`` against Sample Factory 2.1.1
       with ``--device=gpu`` and ``--num_workers`` = the cores, once with 8 and once with 16
       envs per worker (its better one counts), the same rollout, batch, epochs and model;
       and the emulator's ceiling in the same run: a bare ``AtariVectorEnv`` with random
       actions (``--ceiling-envs``, one thread per core). With ``--inference``, also zrl with
       ``roles.inference=1`` and ``inference.device=cuda`` (skipped, saying why, where the
       config refuses those keys). Targets: zrl >= 1.5x Sample Factory, >= 0.75 of the ceiling.
  (g2) seconds from launch to a training return of 18 on Pong (the mean of the last 100
       episodes, counted the same way for both: ``time_to_return``), the same two systems
       (Sample Factory with its better envs per worker of (g1), else 16), each stopped at the
       target or after ``--g2-seconds``. Target: zrl <= 0.5x Sample Factory's time.
  (g3) the learner's intake alone: a real APPO learner update (``Learner.make_update``: the
       update a learner role builds) on ``--device``, fed in this process as fast as it takes
       them with Pong batches recorded first from a real actor and FIFO replay shard
       (``record_batches``): each batch decoded from its wire frames, checked and kept
       (``update.receive``), staged to the device and trained on (``update.train``).
       Samples trained/s, the time split between the input and the update, CPU-seconds per
       1000 samples, and the GPU's utilization (``nvidia-smi`` sampled) where there is one.
       Target: >= 50,000 samples/s on a GPU. ``--device cpu`` gives a smoke figure, labelled.
  (g4) bytes per env step on the wire for Pong, every experience path (summary.json's
       ``wire.<path>.bytes_per_env_step`` of one short run per algorithm: APPO and IMPALA
       unrolls, PPO rollouts, Ape-X DQN transitions, R2D2 sequences), and the learner's
       CPU-seconds per 1000 samples trained on the CPU path (the APPO run, learner on the
       CPU, steady state). Runs anywhere: no GPU needed.

Without a GPU (torch sees no CUDA device), (g1)-(g3) say that they need one and are not run;
(g3) runs with ``--device cpu`` as a smoke figure. Sample Factory runs in its own venv (see
``benchmarks/atari.py``: ``--build-sf-venv``, offline from ``--sf-wheels DIR``); where it cannot
be built or imported, its side of (g1) and (g2) prints "not run" with the reason. Run from the
repo root::

    python benchmarks/gpu_host.py --build-sf-venv                     # everything, a GPU host
    python benchmarks/gpu_host.py --sections g4                       # anywhere
    python benchmarks/gpu_host.py --sections g3 --device cpu --g3-seconds 20   # a smoke figure

``--lease`` (``benchmarks/gpu_lease.sh``, issue 42) is a GPU lease in one command of at most
six minutes (``--budget``): the wheels of ``benchmarks/gpu_wheels.sh`` installed offline, the
CUDA tests, (g3) for 45 s, (g1)'s zrl (the README's GPU line) and Sample Factory (16 envs per
worker) for 75 s each from their first env step and the bare ``AtariVectorEnv`` for 20 s, with
``nvidia-smi`` and every process's CPU sampled during each; a table, the figures and the raw
logs to ``$OUT`` (``--out``). ``--dry-run`` does the same on a CPU machine, shorter (class
``Lease``)::

    python benchmarks/gpu_host.py --lease --dry-run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # atari.py beside this file

import atari  # noqa: E402 - the path above first
from atari import time_to_return  # noqa: E402

REPO = atari.REPO
PONG_APPO = REPO / "configs" / "pong_appo.yaml"
TARGET_VS_SF = 1.5  # (g1) zrl / Sample Factory env steps/s
TARGET_VS_CEILING = 0.75  # (g1) zrl / bare AtariVectorEnv
TARGET_TIME = 0.5  # (g2) zrl's seconds / Sample Factory's
TARGET_INTAKE = 50_000.0  # (g3) samples/s into an APPO learner on a GPU
RETURN_TARGET = 18.0  # (g2)
RETURN_WINDOW = 100  # (g2) episodes in the mean
SF_ENVS_PER_WORKER = (8, 16)  # (g1)
INFERENCE_SETS = ("roles.inference=1", "inference.device=cuda")
GPU_SAMPLE_S = 0.5
# (g4): one short run per experience path, Pong, learner on the CPU.
WIRE_RUNS: dict[str, tuple[str, list[str]]] = {
    "appo": ("pong_appo.yaml", []),
    "impala": ("pong_impala.yaml", []),
    "ppo": ("pong_appo.yaml", ["algo=ppo", "roles.replay=0", "model.normalize_input=false"]),
    "apex_dqn": (
        "pong_apex_dqn.yaml",
        ["replay.min_size=1000", "replay.capacity=50000", "replay.capacity_bytes=400000000"],
    ),
    "r2d2": (
        "pong_apex_dqn.yaml",
        [
            "algo=r2d2",
            "model.core=lstm",
            "model.core_size=256",
            "r2d2.sequence_length=40",
            "r2d2.burn_in=20",
            "replay.batch_size=16",
            "replay.min_size=64",
            "replay.capacity=2000",
            "replay.capacity_bytes=null",
        ],
    ),
}


# --- pure figures ----------------------------------------------------------------------


def learner_cpu_per_1000(samples: Sequence[atari.Sample], warmup: float) -> float | None:
    """Learner CPU-seconds per 1000 samples trained, from ``warmup`` s after the first trained
    sample to the last sample that trained more (start-up and the stop count for nothing);
    None when too little was trained after the warm-up."""
    first = next((s for s in samples if s.trained > 0), None)
    if first is None:
        return None
    window = [s for s in samples if s.time >= first.time + warmup]
    while len(window) > 1 and window[-1].trained == window[-2].trained:
        window.pop()
    if len(window) < 2 or window[-1].trained <= window[0].trained:
        return None
    cpu = window[-1].learner_cpu - window[0].learner_cpu
    return 1000.0 * cpu / (window[-1].trained - window[0].trained)


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den or math.isnan(num) or math.isnan(den):
        return None
    return num / den


def verdict(
    name: str, value: float | None, target: float, at_most: bool = False, fmt: str = ".2f"
) -> str:
    """One line: ``name: 1.62  target >= 1.5: MET``."""
    sign = "<=" if at_most else ">="
    if value is None:
        return f"  {name}: n/a  target {sign} {target:,g}: NOT MEASURED"
    met = value <= target if at_most else value >= target
    shown = format(value, fmt)
    return f"  {name}: {shown}  target {sign} {target:,g}: {'MET' if met else 'NOT MET'}"


# --- the GPU's utilization -------------------------------------------------------------


class GpuSampler:
    """GPU 0's utilization (``utilization.gpu``: percent of the time a kernel ran) and memory
    used, every ``GPU_SAMPLE_S`` seconds while the ``with`` block runs, from ``nvidia-smi
    --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 500`` running in the
    background (its CSV kept at ``log`` if given); ``mean`` is None where there is no
    ``nvidia-smi`` or it answered nothing."""

    def __init__(self, log: Path | None = None) -> None:
        self.values: list[float] = []
        self.memory: list[float] = []
        self.smi = shutil.which("nvidia-smi")
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._file: Any = None

    def __enter__(self) -> GpuSampler:
        if self.smi:
            self._file = (
                open(self.log, "w+b")  # noqa: SIM115 - closed in __exit__
                if self.log is not None
                else tempfile.TemporaryFile()
            )
            query = "--query-gpu=timestamp,utilization.gpu,memory.used"
            ms = str(int(GPU_SAMPLE_S * 1000))
            with contextlib.suppress(OSError):
                self._proc = subprocess.Popen(
                    [self.smi, query, "--format=csv", "-lms", ms, "--id=0"],
                    stdout=self._file,
                    stderr=subprocess.DEVNULL,
                )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        if self._file is not None:
            self._file.seek(0)
            self.values, self.memory = parse_smi_csv(self._file.read().decode(errors="replace"))
            self._file.close()

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def memory_max(self) -> float | None:
        return max(self.memory) if self.memory else None


def parse_smi_csv(text: str) -> tuple[list[float], list[float]]:
    """Utilization (%) and memory used (MiB) per line of ``nvidia-smi --query-gpu=...
    --format=csv`` output (header and units or not); a line it cannot read is left out."""
    util: list[float] = []
    mem: list[float] = []
    columns: list[str] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if any(f.startswith(("utilization.gpu", "memory.used")) for f in fields):
            columns = [f.split(" ")[0] for f in fields]
            continue
        names = columns or ["utilization.gpu", "memory.used"][-len(fields) :]
        if len(names) != len(fields):
            continue
        row = dict(zip(names, fields, strict=True))
        try:
            u = float(row["utilization.gpu"].removesuffix("%").strip())
            m = float(row["memory.used"].removesuffix("MiB").strip())
        except (KeyError, ValueError):
            continue
        util.append(u)
        mem.append(m)
    return util, mem


def gpu_text(sampler: GpuSampler) -> str:
    m = sampler.mean
    if m is None:
        return "n/a" if sampler.smi else "n/a (no nvidia-smi)"
    mem = sampler.memory_max
    return f"{m:.0f} % ({len(sampler.values)} samples), memory up to {mem or 0:,.0f} MiB"


# --- (g1), (g2): whole runs ------------------------------------------------------------


@dataclasses.dataclass
class Systems:
    """What (g1) and (g2) run, and why a side is not run."""

    settings: atari.Settings
    config: Path
    zrl_sets: list[str]
    sf_python: Path | None
    sf_missing: str = ""
    inference_skip: str = ""


def sf_side(args: argparse.Namespace) -> tuple[Path | None, str]:
    """Sample Factory's venv Python, or None and why it is not there."""
    if args.skip_sf:
        return None, "--skip-sf"
    if atari.sf_venv_ok(args.sf_venv):
        return atari.sf_python(args.sf_venv), ""
    if not args.build_sf_venv:
        return None, f"no Sample Factory venv at {args.sf_venv} (pass --build-sf-venv)"
    try:
        return atari.build_sf_venv(args.sf_venv, args.sf_wheels), ""
    except (SystemExit, subprocess.CalledProcessError, OSError) as exc:
        return None, f"its venv could not be built: {exc}"


def inference_refused(config: Path, sets: list[str]) -> str:
    """Why zrl's config refuses the inference variant's keys ('' if it takes them)."""
    from zrl.config.experiment import ConfigError, load_config

    try:
        load_config(config, [*sets, *INFERENCE_SETS])
    except ConfigError as exc:
        return str(exc).splitlines()[0][:300]
    return ""


def zrl_gpu_sets(args: argparse.Namespace) -> list[str]:
    return [
        "roles.actors=auto",
        f"env.num_envs={args.zrl_envs}",
        "learner.device=cuda",
        *args.zrl_set,
    ]


def steady_text(st: dict[str, float] | None) -> str:
    if st is None:
        return "no steady-state figures"
    return (
        f"{st['env_steps_per_s']:9.0f}   trained/s {st['trained_per_s']:.0f}, cores "
        f"{st['total_cores']:.1f} (learner {st['learner_cores']:.2f}), start-up "
        f"{st['startup_s']:.0f} s"
    )


def section_g1(sy: Systems, args: argparse.Namespace, report: dict[str, Any]) -> int | None:
    """(g1); Sample Factory's better envs per worker (None if it did not run)."""
    s = sy.settings
    rows: dict[str, dict[str, float] | None] = {}
    gpu: dict[str, str] = {}

    def zrl_run(name: str, sets: list[str]) -> None:
        with tempfile.TemporaryDirectory(prefix="zrl-gpu-host-") as tmp, GpuSampler() as g:
            run = atari.run_zrl(s, sy.config, args.g1_seconds, args.seed, Path(tmp), sets)
        rows[name] = run.steady(args.warmup) if not run.failed else None
        gpu[name] = gpu_text(g)
        if run.failed:
            print(f"  {name}: {run.failed}", file=sys.stderr)
        print(f"  {name:<34}{steady_text(rows[name])}, GPU {gpu[name]}", flush=True)

    print(
        f"\n(g1) env steps/s with learning on, Pong APPO: rollout {s.rollout}, batch {s.batch}, "
        f"minibatch {s.minibatch}, {s.epochs} epoch(s), {s.cores} cores; zrl "
        f"{args.zrl_envs} envs per actor",
        flush=True,
    )
    zrl_run("zrl, roles.actors=auto", sy.zrl_sets)
    if args.inference:
        if sy.inference_skip:
            print(f"  zrl with the inference role: not run ({sy.inference_skip})")
        else:
            zrl_run("zrl, roles.inference=1", [*sy.zrl_sets, *INFERENCE_SETS])
    best_sf: tuple[float, int] | None = None
    for epw in SF_ENVS_PER_WORKER:
        name = f"Sample Factory, {s.cores} x {epw} envs"
        if sy.sf_python is None:
            print(f"  {name:<34}not run ({sy.sf_missing})")
            continue
        sf = dataclasses.replace(s, envs_per_core=epw)
        with tempfile.TemporaryDirectory(prefix="zrl-gpu-host-") as tmp, GpuSampler() as g:
            run = atari.run_sf(sf, args.g1_seconds, args.seed, Path(tmp), sy.sf_python, "gpu")
        rows[name] = run.steady(args.warmup) if not run.failed else None
        gpu[name] = gpu_text(g)
        if run.failed:
            print(f"  {name}: {run.failed}", file=sys.stderr)
        print(f"  {name:<34}{steady_text(rows[name])}, GPU {gpu[name]}", flush=True)
        st = rows[name]
        if st is not None and (best_sf is None or st["env_steps_per_s"] > best_sf[0]):
            best_sf = (st["env_steps_per_s"], epw)
    ceiling = atari.bare_atari_loop(args.ceiling_envs, min(args.g1_seconds, 60.0), s.atari)
    print(
        f"  {'bare AtariVectorEnv, ' + str(args.ceiling_envs) + ' envs':<34}{ceiling:9.0f}"
        f"   random actions, {atari.cores()} threads",
        flush=True,
    )
    zrl = rows.get("zrl, roles.actors=auto")
    z = zrl["env_steps_per_s"] if zrl else None
    sf_rate = best_sf[0] if best_sf else None
    print(verdict("zrl / Sample Factory (its better)", ratio(z, sf_rate), TARGET_VS_SF))
    print(verdict("zrl / bare AtariVectorEnv", ratio(z, ceiling), TARGET_VS_CEILING))
    inf = rows.get("zrl, roles.inference=1")
    if inf is not None:
        zi = inf["env_steps_per_s"]
        print(verdict("zrl with inference / Sample Factory", ratio(zi, sf_rate), TARGET_VS_SF))
        print(verdict("zrl with inference / bare", ratio(zi, ceiling), TARGET_VS_CEILING))
    report["g1"] = {"rows": rows, "gpu": gpu, "ceiling": ceiling, "sf_best": best_sf}
    return best_sf[1] if best_sf else None


def section_g2(
    sy: Systems, args: argparse.Namespace, sf_envs: int | None, report: dict[str, Any]
) -> None:
    s = sy.settings
    seconds = args.g2_seconds

    def reached(run: atari.Run) -> bool:
        return time_to_return(run.episodes, RETURN_TARGET) is not None

    print(
        f"\n(g2) seconds from launch to a training return of {RETURN_TARGET:g} (the mean of "
        f"the last {RETURN_WINDOW} episodes), at most {seconds:g} s each",
        flush=True,
    )
    times: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="zrl-gpu-host-") as tmp:
        run = atari.run_zrl(s, sy.config, seconds, args.seed, Path(tmp), sy.zrl_sets, reached)
    t = time_to_return(run.episodes, RETURN_TARGET)
    times["zrl"] = None if t is None else t - run.launched
    print(f"  {'zrl, roles.actors=auto':<34}{_seconds(times['zrl'], seconds)}", flush=True)
    epw = sf_envs or max(SF_ENVS_PER_WORKER)
    name = f"Sample Factory, {s.cores} x {epw} envs"
    if sy.sf_python is None:
        print(f"  {name:<34}not run ({sy.sf_missing})")
    else:
        sf = dataclasses.replace(s, envs_per_core=epw)
        with tempfile.TemporaryDirectory(prefix="zrl-gpu-host-") as tmp:
            run = atari.run_sf(
                sf, seconds, args.seed, Path(tmp), sy.sf_python, "gpu", stop_when=reached
            )
        t = time_to_return(run.episodes, RETURN_TARGET)
        times["sf"] = None if t is None else t - run.launched
        print(f"  {name:<34}{_seconds(times['sf'], seconds)}", flush=True)
    # Not reached: the budget is a lower bound, not a figure; the ratio is left out.
    print(verdict("zrl's time / Sample Factory's", ratio(times["zrl"], times.get("sf")), 0.5, True))
    report["g2"] = times


def _seconds(t: float | None, budget: float) -> str:
    return f"{t:9.1f} s" if t is not None else f"not reached in {budget:g} s"


# --- (g3): the learner's intake --------------------------------------------------------


def record_batches(config: Path, count: int, sets: Sequence[str] = ()) -> list[Any]:
    """``count`` Pong BATCH messages (``frame_unroll_batch``: each frame once) as a learner
    receives them, recorded in this process from one real actor (its CNN policy on the CPU,
    initial weights) through the broker into a real FIFO replay shard: the config's unroll
    length and batch size. Their ``weights_version`` is set to 0, so none is stale."""
    import numpy as np
    import zmq

    from zrl.config.experiment import load_config
    from zrl.roles.actor import Actor
    from zrl.roles.replay import ReplayServer
    from zrl.testing.inproc import InProc, collect
    from zrl.transport import protocol as P

    cfg = load_config(
        config,
        [
            *sets,
            "roles.actors=1",
            "roles.replay=1",
            "roles.params=0",
            "roles.learners=0",
            "roles.evaluator=0",
        ],
    )
    ctx = zmq.Context()
    harness = InProc(ctx, "gpu-host-record")
    out: list[Any] = []
    try:
        harness.start_broker(cfg)
        batches = harness.pull("batches")
        acks = harness.pub("learner-0")
        harness.start(ReplayServer, index=0)
        harness.start(Actor, index=0)
        harness.wait_for_subscriber(P.batch_ack_topic("replay-0"), pub=acks, timeout=60)
        deadline = time.monotonic() + 60 + 30 * count
        while len(out) < count and time.monotonic() < deadline:
            got = collect(batches, until=1, timeout=30)
            if not got:
                continue
            msg = got[0]
            acks.send(
                P.Message(P.ACK, meta={"seq": msg.seq}),
                topic=P.batch_ack_topic(str(msg.meta["shard"])),
            )
            arrays = {k: np.array(v) for k, v in msg.arrays.items()}  # off the zmq frames
            arrays["weights_version"] = np.zeros_like(arrays["weights_version"])
            out.append(P.Message(msg.kind, meta=dict(msg.meta), arrays=arrays, seq=msg.seq))
    finally:
        harness.close()
        ctx.term()
    if len(out) < count:
        raise RuntimeError(f"recorded {len(out)} of {count} batches in time")
    return out


def wire_frames(msgs: Sequence[Any]) -> list[list[bytes]]:
    """Each message as the frames a learner's socket hands it (bytes: read-only buffers)."""
    from zrl.transport import protocol as P

    return [[memoryview(f).tobytes() for f in P.encode(m)] for m in msgs]


@dataclasses.dataclass
class Intake:
    """What (g3) measured: ``batches`` fed in ``seconds`` after the warm-up."""

    device: str
    batches: int
    samples: int
    updates: int
    seconds: float
    input_s: float
    """Decoding, checking and keeping the batches (``P.decode`` and ``update.receive``)."""
    train_s: float
    """Staging to the device, rebuilding the stacks and the update (``update.train``)."""
    cpu_s: float
    """This process's CPU time over the same window."""
    gpu_busy: float | None = None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else math.nan


def make_learner_update(
    config: Path, device: str, sets: Sequence[str] = (), threads: int = 0
) -> Any:
    """The APPO update a learner role builds in its setup (``Learner.make_update``), on
    ``device``, without sockets (APPO's update never calls the learner's services); torch
    limited to ``threads`` (0: ``learner.torch_threads``) and freed memory kept for reuse
    (``limits.heap_keep_mb``), as the role's process does."""
    import torch

    from zrl.algos.kernel.batches import resolve_device
    from zrl.config.experiment import load_config
    from zrl.roles.learner import Learner
    from zrl.utils.runtime import keep_freed_memory, limit_torch_threads

    cfg = load_config(config, [*sets, f"learner.device={device}"])
    limit_torch_threads(threads or cfg.learner.torch_threads)
    keep_freed_memory(cfg.limits.heap_keep_mb)
    learner = Learner("inproc://unused", index=0)
    learner.config = cfg
    torch.manual_seed(cfg.seed)
    probe = learner.make_envs(num_envs=1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    learner.device = resolve_device(cfg.learner.device)
    return learner.make_update(spaces)


def feed(update: Any, frames: Sequence[Sequence[bytes]], seconds: float, warmup: int) -> Intake:
    """Feed ``frames`` (recorded batches, round and round) to ``update`` as fast as it takes
    them, one batch at a time as the learner role does: decode, ``receive``, ``train``, for
    ``seconds`` (one batch at least). The first ``warmup`` batches (kernel choice, allocator
    growth) are not timed."""
    import torch

    from zrl.transport import protocol as P

    cuda = update.device.type == "cuda"

    def one(i: int) -> tuple[float, float, int, int]:
        t0 = time.perf_counter()
        update.receive(P.decode(frames[i % len(frames)]), 0)
        t1 = time.perf_counter()
        result = update.train(0)
        t2 = time.perf_counter()
        if result is None:
            raise RuntimeError("the update trained nothing on a recorded batch")
        return t1 - t0, t2 - t1, result.samples, result.updates

    for i in range(warmup):
        one(i)
    if cuda:
        torch.cuda.synchronize(update.device)
    got = Intake(str(update.device), 0, 0, 0, 0.0, 0.0, 0.0, 0.0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    with GpuSampler() if cuda else contextlib.nullcontext() as sampler:
        while got.batches == 0 or time.perf_counter() - t0 < seconds:  # one at least
            inp, train, samples, updates = one(warmup + got.batches)
            got.batches += 1
            got.input_s += inp
            got.train_s += train
            got.samples += samples
            got.updates += updates
        if cuda:
            torch.cuda.synchronize(update.device)
    got.seconds = time.perf_counter() - t0
    got.cpu_s = time.process_time() - cpu0
    if isinstance(sampler, GpuSampler):
        got.gpu_busy = sampler.mean
    return got


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def section_g3(args: argparse.Namespace, device: str, report: dict[str, Any]) -> None:
    label = "" if device == "cuda" else "  [CPU smoke figure: the target is for a GPU]"
    print(
        f"\n(g3) the learner's intake alone: APPO on recorded Pong batches, learner on "
        f"{device}{label}",
        flush=True,
    )
    started = time.perf_counter()
    msgs = record_batches(args.zrl_config, args.g3_batches, args.zrl_set)
    a = msgs[0].arrays
    print(
        f"  recorded {len(msgs)} batches in {time.perf_counter() - started:.0f} s: "
        f"{msgs[0].meta.get('shard')} -> frames {tuple(a['frames'].shape)} "
        f"{a['frames'].dtype}, {sum(x.nbytes for x in a.values()) / 2**20:.1f} MiB each",
        flush=True,
    )
    update = make_learner_update(args.zrl_config, device, args.zrl_set, args.g3_threads)
    print(f"  learner: {type(update).__name__} on {device}, {torch_threads()} torch thread(s)")
    got = feed(update, wire_frames(msgs), args.g3_seconds, args.g3_warmup)
    per_batch = 1e3 / got.batches if got.batches else math.nan
    print(
        f"  {got.samples_per_s:,.0f} samples/s trained ({got.batches} batches, "
        f"{got.updates} updates in {got.seconds:.1f} s); per batch: input "
        f"{got.input_s * per_batch:.1f} ms, staging + update {got.train_s * per_batch:.1f} ms; "
        f"{1000 * got.cpu_s / max(got.samples, 1):.3f} CPU-s per 1000 samples; GPU busy "
        + ("n/a" if got.gpu_busy is None else f"{got.gpu_busy:.0f} %")
    )
    if device == "cuda":
        print(verdict("samples/s / 50,000", got.samples_per_s / TARGET_INTAKE, 1.0))
    report["g3"] = dataclasses.asdict(got) | {"samples_per_s": got.samples_per_s}


# --- (g4): wire bytes and the CPU learner ----------------------------------------------


def shown_command(cmd: Sequence[str]) -> str:
    """``atari.run_zrl``'s command as a user types it: ``zrl run configs/X.yaml --set ...``,
    without the temporary ``--run-dir`` or a ``--set`` that a later one of the same key
    overrides."""
    words = list(cmd)
    if "--run-dir" in words:
        i = words.index("--run-dir")
        del words[i : i + 2]
    if words[1:3] == ["-m", "zrl"]:
        words = ["zrl", *words[3:]]
    sets = [i for i, w in enumerate(words[:-1]) if w == "--set"]
    last = {words[i + 1].split("=", 1)[0]: i for i in sets}
    drop = {j for i in sets if last[words[i + 1].split("=", 1)[0]] != i for j in (i, i + 1)}
    words = [w for j, w in enumerate(words) if j not in drop]
    return " ".join(str(Path(w).relative_to(REPO)) if w.startswith(str(REPO)) else w for w in words)


def section_g4(args: argparse.Namespace, report: dict[str, Any]) -> None:
    print(
        f"\n(g4) bytes per env step on the wire, Pong, one run of {args.g4_seconds:g} s per "
        "algorithm, learner on the CPU (summary.json's wire.<path>.bytes_per_env_step)",
        flush=True,
    )
    s = atari.settings_from_config(PONG_APPO, 8)
    rows: dict[str, Any] = {}
    for algo in [a.strip() for a in args.g4_algos.split(",") if a.strip()]:
        if algo not in WIRE_RUNS:
            raise SystemExit(f"--g4-algos: {algo!r} is none of {sorted(WIRE_RUNS)}")
        name, sets = WIRE_RUNS[algo]
        # run_zrl sets the seed and the stop; 8 envs per actor on any host (as configured).
        extra = [*sets, "learner.device=cpu", "env.num_envs=8"]
        with tempfile.TemporaryDirectory(prefix="zrl-gpu-host-") as tmp:
            run = atari.run_zrl(s, REPO / "configs" / name, args.g4_seconds, 0, Path(tmp), extra)
            cmd = shown_command(run.command)
            summary = Path(tmp) / "zrl" / "summary.json"
            wire = json.loads(summary.read_text()).get("wire", {}) if summary.is_file() else {}
        cpu = learner_cpu_per_1000(run.samples, args.warmup) if algo == "appo" else None
        rows[algo] = {"command": cmd, "wire": wire, "learner_cpu_s_per_1000": cpu}
        print(f"  {algo}: {cmd}", flush=True)
        if not wire:
            print(f"    no wire figures ({run.failed or 'summary.json has none'})"[:400])
        for path, fig in wire.items():
            print(
                f"    {path:<13}{fig['bytes_per_env_step']:>10,.1f} bytes per env step "
                f"({fig['bytes']:,} bytes over {fig['env_steps']:,} env steps)"
            )
        if algo == "appo":
            shown = "n/a (too little trained)" if cpu is None else f"{cpu:.3f}"
            print(f"    learner CPU-seconds per 1000 samples trained: {shown}", flush=True)
    report["g4"] = rows


# --- a GPU lease: one command, six minutes (issue 42) ----------------------------------

LEASE_BUDGET_S = 360.0  # the whole command, the install to the last figure
TARGET_INSTALL_S = 30.0
WHEELS = REPO / "build" / "gpu-wheels"  # benchmarks/gpu_wheels.sh makes it (git ignores build/)
LEASE_OUT = REPO / "build" / "gpu-lease"  # without --out or $OUT
WHEEL_PLATFORMS = (  # as benchmarks/gpu_wheels.sh downloads them
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux1_x86_64",
)
LEASE_STEPS = ("wheels", "tests", "g3", "zrl", "sf", "ceiling")
# The lease's figures, then the dry run's: (lease, dry run).
LEASE_DEFAULTS: dict[str, tuple[int, int]] = {
    "g3_seconds": (45, 10),
    "g1_seconds": (75, 10),  # each g1 run, counted from its first env step
    "ceiling_seconds": (20, 5),
    "warmup": (15, 0),  # g1: seconds after the first trained batch before rates count
    "g3_batches": (4, 1),
    "g3_warmup": (5, 1),
    "ceiling_envs": (256, 16),
}
LEASE_INTS = ("g3_batches", "g3_warmup", "ceiling_envs")
# What each step costs beyond its measured seconds (start-up, stop), for the budget.
LEASE_OVERHEAD_S = {"g3": 20.0, "zrl": 20.0, "sf": 30.0, "ceiling": 5.0, "finish": 5.0}
CUDA_ONLY_PLUGIN = "zrl_lease_cuda_only"
CUDA_NEEDED = r"needs an? (CUDA|GPU)\b"  # the skip reasons of the tests that need a GPU
CUDA_ONLY_TEXT = f'''"""pytest plugin of benchmarks/gpu_host.py --lease: keep only the tests that a
``skipif`` whose reason says it needs a GPU guards (they skip without one)."""

import re

NEEDED = re.compile(r"{CUDA_NEEDED}")


def needs_gpu(item):
    return any(NEEDED.search(str(m.kwargs.get("reason", ""))) for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    drop = [i for i in items if not needs_gpu(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = [i for i in items if needs_gpu(i)]
'''


def cuda_test_files(tests: Path = REPO / "tests") -> list[Path]:
    """The test modules with tests that skip without a GPU (those asking
    ``torch.cuda.is_available()``), but the benchmarks' own."""
    return [
        p
        for p in sorted(tests.rglob("test_*.py"))
        if "cuda.is_available" in p.read_text(errors="replace")
        and p.name not in ("test_gpu_host_bench.py", "test_gpu_lease.py")
    ]


def pytest_counts(text: str) -> dict[str, int]:
    """pytest's closing line as counts: ``{'passed': 61, 'skipped': 2, ...}``."""
    import re

    counts: dict[str, int] = {}
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)", text):
        counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    return counts


def proc_label(cmdline: Sequence[str]) -> str:
    """A process by what it is: ``zrl actor`` (a role's title: ``python -m zrl start actor
    ...``), ``zrl run`` (the head), ``Sample Factory`` (its launcher), ``Sample Factory
    worker`` (the processes it spawns), else the program's name."""
    words = " ".join(cmdline).split()
    if "zrl.run.zygote" in words:
        return "zrl zygote"
    if "zrl" in words:
        rest = words[words.index("zrl") + 1 :]
        if rest[:1] == ["start"] and len(rest) > 1:
            return f"zrl {rest[1]}"
        return f"zrl {rest[0]}" if rest else "zrl"
    if any(w.endswith("sf_pong.py") for w in words):
        return "Sample Factory"
    if any("resource_tracker" in w for w in words):
        return "multiprocessing resource tracker"
    if any("multiprocessing" in w for w in words):
        return "Sample Factory worker"
    return Path(words[0]).name if words else "?"


class ProcCpu:
    """The CPU seconds (user + system) of this process and every process it started (a run's
    head and roles, Sample Factory's workers), sampled every ``every`` seconds while the
    ``with`` block runs; each sample a row of the CSV at ``log``. ``summary()``: cores used
    over the block per kind of process (``proc_label``)."""

    def __init__(self, log: Path, every: float = 1.0) -> None:
        self.log, self.every = log, every
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.wall = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: Any = None

    def __enter__(self) -> ProcCpu:
        import psutil

        self.me = psutil.Process()
        self._file = open(self.log, "w")  # noqa: SIM115 - closed in __exit__
        self._file.write("time,pid,label,cpu_s\n")
        self.t0 = time.time()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._sample()
        self.wall = time.time() - self.t0
        self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        import psutil

        now = time.time()
        try:
            procs = [self.me, *self.me.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
                me = p.pid == self.me.pid
                label = "gpu_host.py" if me else proc_label(p.cmdline() or [p.name()])
            except psutil.Error:
                continue
            # Children count from 0 (their start-up is theirs); this one from the block's start.
            self.first.setdefault(p.pid, cpu if me else 0.0)
            self.last[p.pid] = (label, cpu)
            self._file.write(f"{now:.2f},{p.pid},{label},{cpu:.2f}\n")

    def summary(self, names: dict[int, str] | None = None) -> dict[str, dict[str, float]]:
        """``{label: {"processes": n, "cores": c}}``, most cores first; ``names`` labels some
        processes by their pid instead."""
        out: dict[str, dict[str, float]] = {}
        for pid, (label, cpu) in self.last.items():
            row = out.setdefault((names or {}).get(pid, label), {"processes": 0, "cores": 0.0})
            row["processes"] += 1
            row["cores"] += (cpu - self.first[pid]) / max(self.wall, 1e-9)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["cores"]))


def sf_learner(events: Path) -> dict[int, str]:
    """Sample Factory's learner process by its pid, from sf_pong.py's ``start`` event."""
    try:
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == "start" and e.get("learner_pid"):
                return {int(e["learner_pid"]): "Sample Factory learner"}
    except (OSError, ValueError):
        pass
    return {}


def cpu_text(summary: dict[str, dict[str, float]], top: int = 5) -> str:
    total = sum(r["cores"] for r in summary.values())
    parts = [
        f"{label}{' x' + str(int(r['processes'])) if r['processes'] > 1 else ''} {r['cores']:.2f}"
        for label, r in list(summary.items())[:top]
    ]
    return f"{total:.1f} cores: " + ", ".join(parts)


def run_rates(run: atari.Run, warmup: float) -> dict[str, Any] | None:
    """A g1 run's rates: over the steady state (``Run.steady``: from ``warmup`` s after the
    first trained batch) where there is one, else from its first env step to its last (the
    dry run's short CPU runs train little or nothing), saying which in ``basis``."""
    st = run.steady(warmup)
    if st is not None:
        return {**st, "basis": f"steady: from {warmup:g} s after the first trained batch"}
    moving = [x for x in run.samples if x.env_steps > 0]
    while len(moving) > 1 and moving[-1].env_steps == moving[-2].env_steps:
        moving.pop()  # the stop
    if len(moving) < 2 or moving[-1].time <= moving[0].time:
        return None
    a, b = moving[0], moving[-1]
    dt = b.time - a.time
    return {
        "startup_s": a.time - run.launched,
        "window_s": dt,
        "env_steps_per_s": (b.env_steps - a.env_steps) / dt,
        "trained_per_s": (b.trained - a.trained) / dt,
        "learner_cores": (b.learner_cpu - a.learner_cpu) / dt,
        "total_cores": (b.total_cpu - a.total_cpu) / dt,
        "basis": "from the first env step (too little trained for a steady window)",
    }


def stop_after_stepping(seconds: float, cap: float) -> Any:
    """A run's ``stop_when``: ``seconds`` after its first env step, or ``cap`` seconds after
    its launch, whichever comes first."""

    def stop(run: atari.Run) -> bool:
        now = time.time()
        first = next((x.time for x in run.samples if x.env_steps > 0), None)
        return now >= run.launched + cap or (first is not None and now >= first + seconds)

    return stop


def pip_env() -> dict[str, str]:
    """pip with no configuration: no index, no find-links but the wheel folder's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def install_wheels(folder: Path, target: Path, python_version: str, log: Path) -> tuple[int, str]:
    """``pip install --no-index --find-links folder --no-deps --target target -r
    folder/requirements.txt``, offline; for another Python than this one
    (``python_version``), with pip's ``--python-version`` and the folder's platforms (a check
    that the folder is whole: what it installs is not for this Python). pip's exit status and
    output (kept at ``log``)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        str(folder),
        "--no-deps",
        "--no-compile",
        "--target",
        str(target),
        "-r",
        str(folder / "requirements.txt"),
    ]
    if python_version != here:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
        cmd += ["--only-binary=:all:", *[x for p in WHEEL_PLATFORMS for x in ("--platform", p)]]
    try:
        proc = subprocess.run(cmd, env=pip_env(), capture_output=True, text=True, timeout=180)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, f"pip did not finish in 180 s: {exc}"
    log.write_text(" ".join(cmd) + "\n" + text)
    return rc, text


class Tee:
    """This process's output to the terminal and to the lease's log."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def tar_filter(info: Any) -> Any:
    """The logs worth bringing back: no checkpoints or model files, no run's keys, nothing
    over 8 MiB."""
    name = Path(info.name)
    if "keys" in name.parts[:-1] or name.name == "keys":
        return None
    if info.isfile() and (
        info.size > 8 * 2**20
        or name.suffix in (".pt", ".pth", ".safetensors")
        or "checkpoint" in name.name
    ):
        return None
    return None if name.name == "__pycache__" else info


class Lease:
    """One GPU lease in one command (``--lease``), or its dry run on a CPU machine
    (``--dry-run``): the steps in order, each a row of the results table; the table, the
    figures and the raw logs written to ``--out`` after every step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry: bool = args.dry_run
        self.t0 = time.monotonic()
        self.out: Path = args.out or Path(os.environ.get("OUT") or LEASE_OUT)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work: Path = args.work or Path(tempfile.mkdtemp(prefix="zrl-lease-"))
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.site_zrl = self.work / "site-zrl"
        self.site_sf = self.work / "site-sf"
        self.skip = {x.strip() for x in args.skip.split(",") if x.strip()}
        self.device = "cpu" if self.dry else "cuda"
        self.rows: list[tuple[str, str, str, str, float]] = []
        self.verdicts: list[str] = []
        self.failed: list[str] = []
        self.report: dict[str, Any] = {
            "dry_run": self.dry,
            "budget_s": args.budget,
            "cores": atari.cores(),
            "steps": {},
        }
        self.sf_python: Path | None = None
        self.sf_missing = "not set up"
        self.settings: atari.Settings | None = None
        self.rates: dict[str, float | None] = {}

    # -- bookkeeping --

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        t = int(self.elapsed())
        print(f"\n[{t // 60}:{t % 60:02d}] {text}", flush=True)

    def row(self, step: str, result: str, gpu: str, cpu: str, seconds: float) -> None:
        self.rows.append((step, result, gpu, cpu, seconds))
        self.write()

    def fit(self, step: str, want: float, least: float, later: Sequence[str]) -> float:
        """``want`` seconds for ``step``, less if the budget would not hold what is left."""
        reserve = sum(self.cost(x) for x in later) + LEASE_OVERHEAD_S["finish"]
        left = self.args.budget - self.elapsed() - LEASE_OVERHEAD_S[step] - reserve
        got = max(least, min(want, left))
        if got < want:
            print(f"  shortened to {got:.0f} s (of {want:g}) to keep the {self.args.budget:g} s")
        return got

    def cost(self, step: str) -> float:
        """What a step still to come will take: its seconds and its overhead."""
        if step in self.skip or (step == "sf" and self.sf_python is None):
            return 0.0
        seconds = {
            "g3": self.args.g3_seconds,
            "zrl": self.args.g1_seconds,
            "sf": self.args.g1_seconds,
            "ceiling": self.args.ceiling_seconds,
        }[step]
        return seconds + LEASE_OVERHEAD_S[step]

    def table(self) -> str:
        mode = "dry run on the CPU: no GPU, not figures for the targets" if self.dry else "GPU"
        head = [
            f"# GPU lease ({mode})",
            "",
            f"{atari.cores()} cores; {self.report.get('host', '')}",
            "",
            "| step | result | GPU utilization, memory | CPU over the step | wall s |",
            "| --- | --- | --- | --- | --- |",
        ]
        rows = [f"| {a} | {b} | {c} | {d} | {e:.0f} |" for a, b, c, d, e in self.rows]
        tail = ["", "Verdicts:", *self.verdicts] if self.verdicts else []
        return "\n".join([*head, *rows, *tail]) + "\n"

    def write(self) -> None:
        self.report["elapsed_s"] = self.elapsed()
        self.report["rows"] = self.rows
        self.report["verdicts"] = self.verdicts
        self.report["failed"] = self.failed
        (self.out / "table.md").write_text(self.table())
        text = json.dumps(self.report, indent=1, default=str)
        (self.out / "report.json").write_text(text)

    def finish(self) -> None:
        import tarfile

        self.write()
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            tar.add(self.logs, arcname="logs", filter=tar_filter)

    # -- the steps --

    def step_wheels(self) -> None:
        """Install the carried wheels offline: ``zrl/`` into a target for this process and
        every zrl run, ``sf/`` into one of its own for Sample Factory (gymnasium 0.29 and
        numpy 1.26 before zrl's)."""
        folder = self.args.wheels
        self.say(f"wheels: offline from {folder}")
        t = time.monotonic()
        if "wheels" in self.skip:
            self.row("wheels", "skipped (--skip)", "", "", 0.0)
            return
        if not (folder / "zrl" / "requirements.txt").is_file():
            why = f"no wheel folder at {folder} (make it with bash benchmarks/gpu_wheels.sh)"
            print(f"  {why}: nothing installed; using what this Python has")
            self.row("wheels", why, "", "", time.monotonic() - t)
            return
        version_file = folder / "python-version"
        want = version_file.read_text().strip() if version_file.is_file() else "3.12"
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        native = want == here
        results, total = [], 0.0
        for sub, target in (("zrl", self.site_zrl), ("sf", self.site_sf)):
            if not (folder / sub / "requirements.txt").is_file():
                results.append(f"{sub}/: none")
                continue
            started = time.monotonic()
            rc, text = install_wheels(folder / sub, target, want, self.logs / f"pip-{sub}.log")
            took = time.monotonic() - started
            total += took
            n = len((folder / sub / "requirements.txt").read_text().split())
            shown = f"{sub}/: {n} packages in {took:.1f} s" if rc == 0 else f"{sub}/: FAILED"
            results.append(shown)
            print(f"  {shown}")
            if rc != 0:
                print("  " + text.strip()[-1500:].replace("\n", "\n  "))
                self.failed.append(f"wheels {sub}/")
        self.report["steps"]["wheels"] = {"seconds": total, "python": want, "native": native}
        if native and self.site_zrl.is_dir():
            sys.path.insert(0, str(self.site_zrl))
            sys.path.insert(0, str(REPO))
            paths = [str(REPO), str(self.site_zrl), os.environ.get("PYTHONPATH", "")]
            os.environ["PYTHONPATH"] = os.pathsep.join(x for x in paths if x)
        note = "" if native else f" (for CPython {want}: a check only, this is {here})"
        self.row("wheels", "; ".join(results) + note, "", "", time.monotonic() - t)
        self.verdicts.append(verdict("wheels installed, seconds", total, TARGET_INSTALL_S, True))
        if native and self.site_sf.is_dir():
            self.sf_python = self.work / "sf-python"
            sf_path = f"{self.site_sf}{os.pathsep}{self.site_zrl}"
            self.sf_python.write_text(
                "#!/bin/sh\n"
                f'PYTHONPATH="{sf_path}${{PYTHONPATH:+:$PYTHONPATH}}" '
                f'exec "{sys.executable}" "$@"\n'
            )
            self.sf_python.chmod(0o755)
        elif not native:
            self.sf_missing = f"its wheels are for CPython {want}, this is {here}"

    def step_host(self) -> bool:
        """What the host is; False where the lease cannot go on (no GPU, zrl not importable)."""
        self.say("host")
        try:
            import torch
            import zmq  # noqa: F401 - zrl's own, from the wheels on a lent host

            from zrl.config.experiment import load_config  # noqa: F401
        except ImportError as exc:
            self.failed.append("host")
            print(f"  cannot import what zrl needs: {exc}")
            self.row("host", f"cannot import what zrl needs: {exc}", "", "", 0.0)
            return False
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        host = (
            f"Python {sys.version.split()[0]}, torch {torch.__version__}, GPU {gpu}, "
            f"load average {atari.load()}"
        )
        self.report["host"] = host
        print(f"  {atari.cores()} cores; {host}")
        if not self.dry and gpu == "none":
            self.failed.append("host")
            print("  torch sees no GPU: this is no GPU host (--dry-run goes through the steps)")
            self.row("host", "torch sees no GPU", "", "", 0.0)
            return False
        self.settings = atari.settings_from_config(PONG_APPO, self.args.sf_envs)
        if "sf" in self.skip:
            self.sf_python, self.sf_missing = None, "--skip sf"
        elif self.sf_python is None and atari.sf_venv_ok():  # benchmarks/atari.py's venv
            self.sf_python, self.sf_missing = atari.sf_python(), ""
        elif self.sf_python is not None:
            check = "import sample_factory, gymnasium, ale_py; assert gymnasium.__version__ < '1'"
            proc = subprocess.run(
                [str(self.sf_python), "-c", check], capture_output=True, text=True, timeout=120
            )
            if proc.returncode:
                self.sf_missing = "does not import: " + proc.stderr.strip()[-300:]
                self.sf_python = None
            else:
                self.sf_missing = ""
        elif self.sf_missing == "not set up":
            self.sf_missing = "no wheels for it (bash benchmarks/gpu_wheels.sh)"
        return True

    def step_tests(self) -> bool:
        """The tests that skip without a GPU; False (stop) if one fails on a GPU."""
        files = cuda_test_files()
        self.say(f"CUDA tests: the GPU-only tests of {len(files)} modules")
        if "tests" in self.skip:
            self.row("CUDA tests", "skipped (--skip)", "", "", 0.0)
            return True
        t = time.monotonic()
        plugins = self.work / "plugins"
        plugins.mkdir(exist_ok=True)
        (plugins / f"{CUDA_ONLY_PLUGIN}.py").write_text(CUDA_ONLY_TEXT)
        env = dict(os.environ)
        parts = [str(plugins), str(REPO), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(x for x in parts if x)
        rel = [str(f.relative_to(REPO)) for f in files]
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider"]
        cmd += ["-p", CUDA_ONLY_PLUGIN, *rel]
        log = self.logs / "cuda-tests.log"
        with open(log, "w") as f, GpuSampler(self.logs / "gpu-tests.csv") as g:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(
                    cmd,
                    cwd=REPO,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    timeout=self.args.tests_timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        text = log.read_text(errors="replace")
        counts = pytest_counts(text.splitlines()[-1] if text.strip() else "")
        shown = ", ".join(f"{n} {k}" for k, n in counts.items()) or f"exit status {rc}"
        if rc == 124:
            shown = f"did not finish in {self.args.tests_timeout:g} s"
        print(f"  {shown}")
        self.report["steps"]["tests"] = {"rc": rc, "counts": counts, "files": rel}
        self.row("CUDA tests", shown, gpu_text(g), "", time.monotonic() - t)
        ok = rc == 0 and (self.dry or counts.get("passed", 0) > 0)
        if not ok:
            self.failed.append("CUDA tests")
            print("  the CUDA tests failed: their output, then the lease stops")
            print("\n".join(text.splitlines()[-80:]))
        return ok

    def step_g3(self) -> None:
        want = self.fit("g3", self.args.g3_seconds, 5, ["zrl", "sf", "ceiling"])
        self.say(f"(g3) the learner's intake alone, {want:.0f} s")
        t = time.monotonic()
        ns = argparse.Namespace(
            zrl_config=PONG_APPO,
            g3_batches=self.args.g3_batches,
            zrl_set=[],
            g3_threads=0,
            g3_seconds=want,
            g3_warmup=self.args.g3_warmup,
        )
        got: dict[str, Any] = {}
        with GpuSampler(self.logs / "gpu-g3.csv") as g, ProcCpu(self.logs / "cpu-g3.csv") as pc:
            section_g3(ns, self.device, got)
        g3 = got["g3"]
        rate = g3["samples_per_s"]
        self.rates["g3"] = rate
        per_1000 = 1000 * g3["cpu_s"] / max(g3["samples"], 1)
        result = (
            f"{rate:,.0f} samples/s on {self.device} ({g3['batches']} batches in "
            f"{g3['seconds']:.0f} s; {per_1000:.2f} CPU-s per 1000 samples)"
        )
        self.report["steps"]["g3"] = g3 | {"cpu": pc.summary(), "gpu": gpu_text(g)}
        self.row(
            "(g3) learner intake", result, gpu_text(g), cpu_text(pc.summary()), time.monotonic() - t
        )

    def g1_run(self, step: str, name: str, later: Sequence[str]) -> None:
        s = self.settings
        assert s is not None
        want = self.fit(step, self.args.g1_seconds, 5, later)
        cap = want + LEASE_OVERHEAD_S[step] + 30  # the latest it stops, from its launch
        stop = stop_after_stepping(want, cap)
        folder = self.logs / f"g1-{step}"
        folder.mkdir(exist_ok=True)
        t = time.monotonic()
        with (
            GpuSampler(self.logs / f"gpu-g1-{step}.csv") as g,
            ProcCpu(self.logs / f"cpu-g1-{step}.csv") as pc,
        ):
            if step == "zrl":
                envs = self.args.zrl_envs or atari_num_envs(PONG_APPO)
                sets = [f"learner.device={self.device}", "roles.actors=auto"]
                sets.append(f"env.num_envs={envs}")
                self.say(f"(g1) {name}, {want:.0f} s from its first env step")
                run = atari.run_zrl(s, PONG_APPO, cap + 30, self.args.seed, folder, sets, stop)
                print(f"  {shown_command(run.command)}")
            else:
                self.say(f"(g1) {name}, {want:.0f} s from its first env step")
                device = "cpu" if self.dry else "gpu"
                assert self.sf_python is not None
                run = atari.run_sf(
                    s, cap + 30, self.args.seed, folder, self.sf_python, device, stop_when=stop
                )
        rates = run_rates(run, self.args.warmup) if not run.failed else None
        cpu = pc.summary(sf_learner(folder / "sf.jsonl"))
        self.report["steps"][step] = {
            "rates": rates,
            "failed": run.failed,
            "notes": run.notes,
            "command": shown_command(run.command) if run.command else "",
            "cpu": cpu,
            "gpu": gpu_text(g),
        }
        if rates is None:
            result = f"no rates ({(run.failed or 'too few progress rows').splitlines()[0]})"
            self.failed.append(f"g1 {step}")
            print(f"  {result}\n  {(run.failed or '')[-1500:]}")
        else:
            result = (
                f"{rates['env_steps_per_s']:,.0f} env steps/s, trained/s "
                f"{rates['trained_per_s']:,.0f} over {rates['window_s']:.0f} s "
                f"({rates['basis']}; first step after {rates['startup_s']:.0f} s)"
            )
            print(f"  {result}")
        self.rates[step] = rates["env_steps_per_s"] if rates else None
        self.row(f"(g1) {name}", result, gpu_text(g), cpu_text(cpu), time.monotonic() - t)

    def step_zrl(self) -> None:
        envs = self.args.zrl_envs or atari_num_envs(PONG_APPO)
        name = f"zrl, the README's GPU line ({envs} envs per actor)"
        self.g1_run("zrl", name, ["sf", "ceiling"])

    def step_sf(self) -> None:
        s = self.settings
        assert s is not None
        name = f"Sample Factory 2.1.1, {s.cores} x {s.envs_per_core} envs"
        if self.sf_python is None:
            self.say(f"(g1) {name}: not run ({self.sf_missing})")
            self.row(f"(g1) {name}", f"not run ({self.sf_missing})", "", "", 0.0)
            self.rates["sf"] = None
            return
        self.g1_run("sf", name, ["ceiling"])

    def step_ceiling(self) -> None:
        s = self.settings
        assert s is not None
        envs = self.args.ceiling_envs
        want = self.fit("ceiling", self.args.ceiling_seconds, 2, [])
        name = f"bare AtariVectorEnv, {envs} envs"
        self.say(f"(g1) {name}, random actions, {want:.0f} s")
        t = time.monotonic()
        with ProcCpu(self.logs / "cpu-ceiling.csv") as pc:
            rate = atari.bare_atari_loop(envs, want, s.atari)
        self.rates["ceiling"] = rate
        print(f"  {rate:,.0f} env steps/s ({atari.cores()} threads)")
        self.report["steps"]["ceiling"] = {"env_steps_per_s": rate, "cpu": pc.summary()}
        self.row(
            f"(g1) {name}",
            f"{rate:,.0f} env steps/s",
            "",
            cpu_text(pc.summary()),
            time.monotonic() - t,
        )

    def judge(self) -> None:
        label = "  [dry run: CPU figures, not for the targets]" if self.dry else ""
        r = self.rates
        self.verdicts += [
            verdict(
                "Pong APPO, zrl / Sample Factory", ratio(r.get("zrl"), r.get("sf")), TARGET_VS_SF
            )
            + label,
            verdict(
                "Pong APPO, zrl / bare AtariVectorEnv",
                ratio(r.get("zrl"), r.get("ceiling")),
                TARGET_VS_CEILING,
            )
            + label,
            verdict("learner intake, samples/s", r.get("g3"), TARGET_INTAKE, fmt=",.0f") + label,
            verdict("lease wall time, seconds", self.elapsed(), self.args.budget, True, ".0f"),
        ]

    def run(self) -> int:
        steps: list[tuple[str, Any]] = [
            ("g3", self.step_g3),
            ("zrl", self.step_zrl),
            ("sf", self.step_sf),
            ("ceiling", self.step_ceiling),
        ]
        try:
            self.step_wheels()
            if self.step_host() and self.step_tests():
                for name, step in steps:
                    if name in self.skip:
                        self.row(name, "skipped (--skip)", "", "", 0.0)
                        continue
                    try:
                        step()
                    except Exception as exc:  # noqa: BLE001 - one step's failure, recorded
                        import traceback

                        self.failed.append(name)
                        print(f"  {name} failed: {exc!r}")
                        (self.logs / f"error-{name}.txt").write_text(traceback.format_exc())
                        self.row(name, f"failed: {exc!r}"[:300], "", "", 0.0)
                self.judge()
        finally:
            stop_children()
            self.finish()
        print("\n" + self.table(), flush=True)
        print(f"results in {self.out}: table.md, report.json, lease.log, logs.tar.gz")
        return 1 if self.failed else 0


def stop_children(wait: float = 15.0) -> None:
    """End what this process started and left running (a run cut short by the lease's hard
    stop): SIGTERM to each child's process group (runs are started in sessions of their own)
    or the child, then SIGKILL to what is left after ``wait`` seconds."""
    import psutil

    me = os.getpid()
    children = psutil.Process(me).children()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for c in children:
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(c.pid) == c.pid and c.pid != os.getpgid(me):
                    os.killpg(c.pid, sig)
                else:
                    c.send_signal(sig)
        _, children = psutil.wait_procs(children, timeout=wait)
        if not children:
            return


def atari_num_envs(config: Path) -> int:
    """The config's ``env.num_envs`` (what the README's line runs with)."""
    import yaml

    raw = yaml.safe_load(config.read_text()) or {}
    return int((raw.get("env") or {}).get("num_envs", 8))


def lease_main(argv: Sequence[str]) -> int:
    """``gpu_host.py --lease``: see ``Lease`` and docs/benchmarks.md."""
    p = argparse.ArgumentParser(
        prog="gpu_host.py --lease",
        description="A GPU lease in one command, at most --budget s (issue 42).",
    )
    p.add_argument("--lease", action="store_true", required=True)
    p.add_argument("--dry-run", action="store_true", help="on a CPU machine: the CPU variants")
    p.add_argument("--out", type=Path, default=None, help="results ($OUT, else build/gpu-lease)")
    p.add_argument("--wheels", type=Path, default=WHEELS, help="benchmarks/gpu_wheels.sh's folder")
    p.add_argument("--work", type=Path, default=None, help="scratch (default: a new /tmp folder)")
    p.add_argument("--budget", type=float, default=LEASE_BUDGET_S, help="seconds, in all")
    for key, (full, dry) in LEASE_DEFAULTS.items():
        p.add_argument(
            f"--{key.replace('_', '-')}",
            type=int if key in LEASE_INTS else float,
            default=None,
            help=f"default {full}, dry run {dry}",
        )
    p.add_argument("--sf-envs", type=int, default=16, help="Sample Factory's envs per worker")
    p.add_argument("--zrl-envs", type=int, default=None, help="default: the config's")
    p.add_argument("--tests-timeout", type=float, default=120.0)
    p.add_argument("--skip", default="", help=f"any of {','.join(LEASE_STEPS)}")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for key, (full, dry) in LEASE_DEFAULTS.items():
        if getattr(args, key) is None:
            kind = int if key in LEASE_INTS else float
            setattr(args, key, kind(dry if args.dry_run else full))
    unknown = {x.strip() for x in args.skip.split(",") if x.strip()} - set(LEASE_STEPS)
    if unknown:
        p.error(f"--skip: unknown steps {sorted(unknown)}")
    lease = Lease(args)
    log = open(lease.out / "lease.log", "w")  # noqa: SIM115 - for the whole process
    sys.stdout = Tee(sys.__stdout__, log)  # type: ignore[assignment]
    sys.stderr = Tee(sys.__stderr__, log)  # type: ignore[assignment]

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # the results are written on the way out

    signal.signal(signal.SIGTERM, stop)
    print(
        f"GPU lease{' dry run' if args.dry_run else ''}: budget {args.budget:g} s; "
        f"out {lease.out}; scratch {lease.work}",
        flush=True,
    )
    try:
        return lease.run()
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        log.close()


# --- main ------------------------------------------------------------------------------


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--lease" in argv:
        sys.exit(lease_main(argv))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="g1,g2,g3,g4", help="any of g1,g2,g3,g4")
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="(g3)'s learner; auto: cuda if torch sees one. (g1), (g2) need cuda",
    )
    parser.add_argument("--g1-seconds", type=float, default=180.0, help="per (g1) run")
    parser.add_argument("--g2-seconds", type=float, default=900.0, help="at most, per run")
    parser.add_argument("--g3-seconds", type=float, default=30.0)
    parser.add_argument("--g3-batches", type=int, default=4, help="batches recorded")
    parser.add_argument("--g3-warmup", type=int, default=5, help="batches fed untimed")
    parser.add_argument(
        "--g3-threads", type=int, default=0, help="torch threads (0: learner.torch_threads)"
    )
    parser.add_argument("--g4-seconds", type=float, default=90.0, help="per (g4) run")
    parser.add_argument("--g4-algos", default=",".join(WIRE_RUNS))
    parser.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="seconds after the first trained batch before rates count",
    )
    parser.add_argument("--zrl-envs", type=int, default=16, help="(g1), (g2): envs per actor")
    parser.add_argument("--ceiling-envs", type=int, default=256)
    parser.add_argument("--inference", action="store_true", help="(g1): zrl's inference role too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zrl-config", type=Path, default=PONG_APPO)
    parser.add_argument(
        "--zrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more zrl overrides for (g1)-(g3) (repeatable)",
    )
    parser.add_argument("--sf-venv", type=Path, default=atari.SF_VENV)
    parser.add_argument("--build-sf-venv", action="store_true", help="build it if missing")
    parser.add_argument(
        "--sf-wheels", type=Path, default=None, help="build it offline from these wheels"
    )
    parser.add_argument("--skip-sf", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = set(sections) - {"g1", "g2", "g3", "g4"}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    gpu = cuda_available()
    device = ("cuda" if gpu else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not gpu:
        parser.error("--device cuda: torch sees no CUDA device")
    print(
        f"{atari.cores()} cores, GPU: {'yes' if gpu else 'none'}; load average {atari.load()}",
        flush=True,
    )
    report: dict[str, Any] = {"cores": atari.cores(), "gpu": gpu, "load_before": atari.load()}
    whole = [x for x in sections if x in ("g1", "g2")]
    if whole and not gpu:
        for x in whole:
            print(f"\n({x}) needs a GPU (torch sees no CUDA device): not run")
            report[x] = "not run: no GPU"
    elif whole:
        sf_py, missing = sf_side(args)
        sy = Systems(
            settings=atari.settings_from_config(args.zrl_config, min(SF_ENVS_PER_WORKER)),
            config=args.zrl_config,
            zrl_sets=zrl_gpu_sets(args),
            sf_python=sf_py,
            sf_missing=missing,
        )
        if args.inference:
            sy.inference_skip = inference_refused(args.zrl_config, sy.zrl_sets)
        sf_envs = section_g1(sy, args, report) if "g1" in whole else None
        if "g2" in whole:
            section_g2(sy, args, sf_envs, report)
    if "g3" in sections:
        if device == "cuda" or args.device == "cpu":
            section_g3(args, device, report)
        else:
            print(
                "\n(g3) needs a GPU (torch sees no CUDA device): not run "
                "(--device cpu gives a CPU smoke figure)"
            )
            report["g3"] = "not run: no GPU"
    if "g4" in sections:
        section_g4(args, report)
    report["load_after"] = atari.load()
    text = json.dumps(report, default=lambda o: None if o is None else str(o))
    if args.json:
        args.json.write_text(text)
    print(text)
    return report


if __name__ == "__main__":
    main()
