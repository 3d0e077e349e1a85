"""The run directory of ``zrl run``: what a run starts from, and what it ends with::

    RUN_DIR/config.yaml      the resolved config       RUN_DIR/seeds.json     per-actor seeds
    RUN_DIR/logs/<id>.log    one log per role          RUN_DIR/progress.csv   one row a second
    RUN_DIR/eval.csv         every evaluation          RUN_DIR/tensorboard/   event files
    RUN_DIR/model.pt         final weights             RUN_DIR/summary.json   how it ended

plus ``factories.pkl`` (a script's pickled factories), ``keys/`` (the run's own keys, see
``BrokerAccess.use_run_keys``), ``checkpoints/`` and ``remote_commands.txt``. The CSV and
TensorBoard files are ``zrl.run.metrics.MetricsWriter``'s.

config.yaml keeps a ``checkpoint.dir`` inside the run directory relative to it (``checkpoints``),
and a relative one read back from there (``--resume``) is relative to the run directory: a copy
of a run directory resumes from, and writes to, its own checkpoints, never the original's.

Sockets: throwaway DEALERs for the LOOKUP of the params server and the final GET_WEIGHTS
(``model.pt``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from zrl.config.experiment import ExperimentConfig, config_to_yaml
from zrl.config.factories import FACTORIES_FILE, Factories
from zrl.roles.errors import RoleError
from zrl.roles.registry_client import registry_request
from zrl.run.aggregator import Aggregator, number
from zrl.run.metrics import read_csv
from zrl.run.placement import BrokerAccess
from zrl.run.roster import Roster
from zrl.run.stop_rule import StopRule
from zrl.transport import protocol as P
from zrl.utils.durable import atomic_write

log = logging.getLogger("zrl.supervisor")  # the name its log lines have always had

OWN_CHECKPOINTS = "checkpoints"
"""A run's own checkpoint directory, in its run directory (config.yaml names it so)."""
LOG_TAIL_LINES = 15  # of a crashed role's log, shown in the terminal

# What summary.json says about the whole run rather than about one segment of it (a `zrl run`
# and each `--resume` of it is a segment).
ACROSS_SEGMENTS = ("segment", "segments", "total_wall_time", "resumed_at_env_steps")
UNFINISHED_SEGMENT = "this segment wrote no summary.json (it was killed, or its machine went down)"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, window: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of a log file, within its last ``window`` bytes (empty if it
    cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - window, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.rstrip("\n").splitlines()[-lines:]


def whole(value: Any) -> int:
    """A count read back from summary.json or progress.csv (whose numbers read as floats)."""
    n = number(value)
    return max(int(n), 0) if n is not None else 0


def earlier_segments(previous: Any, progress: list[dict[str, float]]) -> list[dict[str, Any]]:
    """The summaries of the segments a resumed run continues, earliest first.

    ``previous`` is what summary.json held (None if there was none, or it could not be read),
    ``progress`` the rows of progress.csv. The segments it lists come first, then the one it
    describes. A segment that ended without writing summary.json (a SIGKILL, a power cut:
    what ``--resume`` is for) left only progress rows, past the env steps of the last
    summary: it is kept as a short entry from its last row (two such segments in a row read
    as one)."""
    segments: list[dict[str, Any]] = []
    if isinstance(previous, dict):
        older = previous.get("segments")
        if isinstance(older, list):
            segments += [seg for seg in older if isinstance(seg, dict)]
        segments.append({k: v for k, v in previous.items() if k not in ACROSS_SEGMENTS})
    summarized = whole(segments[-1].get("env_steps")) if segments else 0
    if progress and whole(progress[-1].get("env_steps")) > summarized:
        last = progress[-1]
        segments.append(
            {
                "stop_reason": "unknown",
                "error": UNFINISHED_SEGMENT,
                # Each segment's progress rows count time from its own start.
                "wall_time": number(last.get("time")),
                "env_steps": whole(last.get("env_steps")),
                "updates": whole(last.get("updates")),
            }
        )
    return segments


def read_summary(path: Path) -> dict[str, Any] | None:
    """summary.json as written, or None (logged) when there is none or it cannot be read."""
    if not path.is_file():
        return None
    try:
        got = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning(
            "cannot read %s (%s): the earlier segments are summed up from progress.csv", path, exc
        )
        return None
    return got if isinstance(got, dict) else None


class RunDir:
    """One run's directory: written before anything starts, and at the stop."""

    def __init__(self, path: Path, cfg: ExperimentConfig, factories: Factories) -> None:
        self.path = path
        self.cfg = cfg
        self.factories = factories
        # With --resume: the summaries of the run's earlier segments, kept in this one's.
        self.earlier: list[dict[str, Any]] = []

    def log_path(self, name: str) -> Path:
        return self.path / "logs" / f"{name}.log"

    def prepare(self, agg: Aggregator, *, resume: bool) -> None:
        """The directory, the resolved config, the seeds and the pickled factories; with
        ``resume``, the env-step count to continue from (into ``agg``) and the summaries of
        the earlier segments, which summary.json keeps (``segments``)."""
        from zrl.utils.runtime import actor_seed

        (self.path / "logs").mkdir(parents=True, exist_ok=True)
        self.cfg.checkpoint.dir = str(self.checkpoint_dir(resume=resume))
        if resume:
            progress = self.restore_counters(agg)
            self.earlier = earlier_segments(read_summary(self.path / "summary.json"), progress)
        (self.path / "config.yaml").write_text(config_to_yaml(self.stored_config()))
        seeds = {
            "run_seed": self.cfg.seed,
            "actors": {
                f"actor-{i}": actor_seed(self.cfg.seed, i)
                for i in range(self.cfg.roles.count("actors"))
            },
        }
        (self.path / "seeds.json").write_text(json.dumps(seeds, indent=2))
        if self.factories.needs_pickle():
            (self.path / FACTORIES_FILE).write_bytes(self.factories.pickled())

    def checkpoint_dir(self, *, resume: bool) -> Path:
        """Where the roles of this run checkpoint, resolved: ``RUN_DIR/checkpoints`` unless
        the config names a directory (checkpoints live with the run, so a crashed role and
        ``--resume`` find them). A relative one is relative to the run directory when it was
        read from the run directory's config.yaml (``resume``), else to the working
        directory."""
        d = self.cfg.checkpoint.dir
        if d is None:
            return (self.path / OWN_CHECKPOINTS).resolve()
        path = Path(d).expanduser()
        if resume and not path.is_absolute():
            path = self.path / path
        return path.resolve()

    def stored_config(self) -> ExperimentConfig:
        """The config as config.yaml keeps it: a checkpoint directory inside the run
        directory relative to it, so that a copy of the run directory resumes into itself."""
        stored = self.cfg.model_copy(deep=True)
        d, here = self.cfg.checkpoint.dir, self.path.resolve()
        if d is not None and Path(d).is_absolute() and Path(d).is_relative_to(here):
            stored.checkpoint.dir = str(Path(d).relative_to(here))
        return stored

    def restore_counters(self, agg: Aggregator) -> list[dict[str, float]]:
        """Continue the env-step count of the run being resumed (actors count from 0); the
        rows of its progress.csv."""
        rows = (
            read_csv(self.path / "progress.csv") if (self.path / "progress.csv").is_file() else []
        )
        if rows:
            agg.env_steps_offset = int(rows[-1].get("env_steps", 0))
        log.info("resuming %s from %d env steps", self.path, agg.env_steps_offset)
        return rows

    def write_remote_commands(self, commands: dict[str, str]) -> list[str]:
        """``remote_commands.txt``: the command to type on each other host; its lines."""
        lines = []
        for host, cmd in commands.items():
            lines += [f"# on {host}:", cmd]
        (self.path / "remote_commands.txt").write_text("\n".join(lines) + "\n")
        return lines

    def save_model(
        self, ctx: zmq.Context, access: BrokerAccess, is_ours: Callable[[Any], bool]
    ) -> int | None:
        """``model.pt``: the latest weights of this run's params server (``is_ours`` tells
        a registered id of this run from any other); its version, or None if none came."""
        import torch

        from zrl.roles.weights import request_latest_weights

        try:
            services = registry_request(
                ctx,
                access.broker_addr,
                P.Message(P.LOOKUP, meta={"role": "params"}),
                2.0,
                access.keys,
            ).meta.get("services", [])
        except RoleError:
            return None
        # Only our own params server: another registered 'params' role could serve anything.
        services = [s for s in services if isinstance(s, dict) and is_ours(s.get("id"))]
        msg = request_latest_weights(
            ctx, services, self.cfg.broker.max_message_bytes, 5.0, access.keys
        )
        if msg is None:
            return None
        with atomic_write(self.path / "model.pt") as f:
            torch.save(
                {
                    "weights": {k: torch.from_numpy(v.copy()) for k, v in msg.arrays.items()},
                    "version": msg.meta.get("version"),
                    "config": json.dumps(self.cfg.model_dump(mode="json")),
                    "factory_refs": self.factories.references,
                },
                f,
            )
        return int(msg.meta.get("version", 0))

    def summary(
        self,
        row: dict[str, Any],
        version: int | None,
        *,
        stop_reason: str,
        fatal: str,
        fatal_tail: list[str],
        target: StopRule,
        agg: Aggregator,
        started: float,
        first_env_step: float | None,
        evals_dropped: int,
        roster: Roster,
        restarts_here: dict[str, int],
        metrics_dropped: int = 0,
    ) -> dict[str, Any]:
        """What summary.json says: how the run ended and what it reached. For a resumed run,
        this segment's figures (``env_steps`` and ``updates`` count on from the earlier ones),
        and the earlier segments' summaries in ``segments``, earliest first."""
        evals = agg.evals
        roles = roster.summary(restarts_here)
        restarts = {**restarts_here}
        for rid, known in roles["took_part"].items():
            if known["restarts"]:
                restarts[rid] = known["restarts"]
        wall_time = round(time.monotonic() - started, 2)
        earlier_wall = sum(number(seg.get("wall_time")) or 0.0 for seg in self.earlier)
        return {
            "experiment": self.cfg.name,
            "run_dir": str(self.path),
            "stop_reason": stop_reason,
            "error": fatal or None,
            # A run that met its target is a success even if some role crashed on the way.
            "failed": bool(fatal) and target.target_time is None,
            "error_log_tail": fatal_tail or None,
            "reached_target": target.target_time is not None,
            "target_return": self.cfg.stop.eval_return,
            "seconds_to_target": target.target_time,
            "target_reached_at": target.target_reached_at,
            "env_steps_to_target": target.target_steps,
            "wall_time": wall_time,
            "seconds_to_first_env_step": first_env_step,
            "env_steps": row.get("env_steps", 0),
            "updates": row.get("updates", 0),
            "experience": agg.experience(),
            "wire": agg.wire(),
            "stop_rule": target.describe(),
            # The mean that met the stop rule; best and last are single evaluations, and a
            # best at the target alone is not a solved task.
            "confirming_eval_return": target.confirming_return,
            "best_eval_return": max(e["mean"] for e in evals) if evals else None,
            "last_eval_return": evals[-1]["mean"] if evals else None,
            "final_eval_return": evals[-1]["mean"] if evals else None,  # = last, for old readers
            "evaluations": len(evals),
            "evals_dropped": evals_dropped,
            # Metrics under no planned role's id, and training figures past the tag bound.
            "metrics_dropped": metrics_dropped,
            "train_figures_dropped": agg.train_dropped,
            "weights_version": version,
            "model": str(self.path / "model.pt") if version is not None else None,
            "restarts": restarts,
            "roles": roles,
            # Each role's counters as its last heartbeat had them (what the learner closed on).
            "heartbeats": agg.last_heartbeats(),
            # The whole run, across `zrl run` and each `--resume`:
            "segment": len(self.earlier) + 1,
            "total_wall_time": round(earlier_wall + wall_time, 2),
            "resumed_at_env_steps": agg.env_steps_offset,  # 0 for a first segment
            "segments": self.earlier,
        }
