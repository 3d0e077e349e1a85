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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
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


def verdict(name: str, value: float | None, target: float, at_most: bool = False) -> str:
    """One line: ``name: 1.62  target >= 1.5: MET``."""
    sign = "<=" if at_most else ">="
    if value is None:
        return f"  {name}: n/a  target {sign} {target:g}: NOT MEASURED"
    met = value <= target if at_most else value >= target
    return f"  {name}: {value:.2f}  target {sign} {target:g}: {'MET' if met else 'NOT MET'}"


# --- the GPU's utilization -------------------------------------------------------------


class GpuSampler:
    """``nvidia-smi``'s ``utilization.gpu`` (percent of the time a kernel ran) of GPU 0,
    sampled every ``GPU_SAMPLE_S`` seconds in a thread while the ``with`` block runs;
    ``mean`` is None where there is no ``nvidia-smi`` or it answered nothing."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.smi = shutil.which("nvidia-smi")

    def __enter__(self) -> GpuSampler:
        if self.smi:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=0"]
        while not self._stop.wait(GPU_SAMPLE_S):
            with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
                out = subprocess.run(
                    [str(self.smi), *query], capture_output=True, text=True, timeout=5
                )
                self.values.append(float(out.stdout.strip().splitlines()[0]))

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None


def gpu_text(sampler: GpuSampler) -> str:
    m = sampler.mean
    return "n/a" if m is None else f"{m:.0f} % ({len(sampler.values)} samples)"


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
    out = []
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

    from zrl.algos.batches import resolve_device
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
    without the temporary ``--run-dir``."""
    words = list(cmd)
    if "--run-dir" in words:
        i = words.index("--run-dir")
        del words[i : i + 2]
    if words[1:3] == ["-m", "zrl"]:
        words = ["zrl", *words[3:]]
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


# --- main ------------------------------------------------------------------------------


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
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
