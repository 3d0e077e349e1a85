"""Run-directory metrics: CSV files, TensorBoard event files, and the learning-curve plot."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

PROGRESS_FIELDS = [
    "time",
    "env_steps",
    "env_steps_per_s",
    "updates",
    "updates_per_s",
    "replay_size",
    "samples_per_insert",
    "weights_version",
    "max_version_lag",
    "eval_return",
]
EVAL_FIELDS = ["time", "env_steps", "weights_version", "mean", "std", "min", "max", "episodes"]


class ScalarWriter:
    """TensorBoard scalars through tensorboard's own event-file writer.

    Not torch's ``SummaryWriter``: importing torch costs the supervisor about 2 s of CPU,
    taken from the roles it has just started on a small machine."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(logdir))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self.writer.add_event(Event(summary=summary, step=step, wall_time=time.time()))

    def close(self) -> None:
        self.writer.close()


class MetricsWriter:
    """Appends rows to ``progress.csv`` / ``eval.csv`` and mirrors them to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self._progress = open(self.run_dir / "progress.csv", "a", newline="")  # noqa: SIM115
        self._eval = open(self.run_dir / "eval.csv", "a", newline="")  # noqa: SIM115
        self.progress = csv.DictWriter(self._progress, PROGRESS_FIELDS, extrasaction="ignore")
        self.eval = csv.DictWriter(self._eval, EVAL_FIELDS, extrasaction="ignore")
        if self._progress.tell() == 0:
            self.progress.writeheader()
        if self._eval.tell() == 0:
            self.eval.writeheader()
        self.tb: ScalarWriter | None = None
        if tensorboard:
            self.tb = ScalarWriter(self.run_dir / "tensorboard")

    def write_progress(self, row: dict[str, Any]) -> None:
        self.progress.writerow(row)
        self._progress.flush()
        if self.tb is not None:
            step = int(row.get("env_steps") or 0)
            for key in PROGRESS_FIELDS[2:]:
                value = row.get(key)
                if isinstance(value, int | float):
                    self.tb.add_scalar(f"progress/{key}", value, step)

    def write_eval(self, row: dict[str, Any]) -> None:
        self.eval.writerow(row)
        self._eval.flush()
        if self.tb is not None:
            step = int(row.get("env_steps") or 0)
            self.tb.add_scalar("eval/return_mean", row["mean"], step)
            self.tb.add_scalar("eval/return_std", row["std"], step)

    def close(self) -> None:
        self._progress.close()
        self._eval.close()
        if self.tb is not None:
            self.tb.close()


def read_csv(path: Path) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            rows.append({k: float(v) for k, v in raw.items() if v not in ("", None)})
    return rows


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Learning curve (eval return against env steps and wall time) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    eval_path = run_dir / "eval.csv"
    if not eval_path.is_file():
        raise FileNotFoundError(f"{eval_path} does not exist: is {run_dir} a zrl run directory?")
    evals = read_csv(eval_path)
    if not evals:
        raise ValueError(f"{eval_path} has no evaluations yet: nothing to plot")
    steps = [r["env_steps"] for r in evals]
    times = [r["time"] for r in evals]
    mean = [r["mean"] for r in evals]
    std = [r.get("std", 0.0) for r in evals]
    lo = [m - s for m, s in zip(mean, std, strict=True)]
    hi = [m + s for m, s in zip(mean, std, strict=True)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], steps, "env steps"), (axes[1], times, "wall time (s)")):
        ax.plot(x, mean, marker="o", ms=3, label="eval return (mean)")
        ax.fill_between(x, lo, hi, alpha=0.25, label="+- std")
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(f"zrl run {run_dir.name}")
    fig.tight_layout()
    path = Path(out) if out is not None else run_dir / "learning_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
