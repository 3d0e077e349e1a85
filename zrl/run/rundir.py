"""The run directory of ``zrl run``: what a run starts from, and what it ends with::

    RUN_DIR/config.yaml      the resolved config       RUN_DIR/seeds.json     per-actor seeds
    RUN_DIR/logs/<id>.log    one log per role          RUN_DIR/progress.csv   one row a second
    RUN_DIR/eval.csv         every evaluation          RUN_DIR/tensorboard/   event files
    RUN_DIR/model.pt         the weights that met      RUN_DIR/summary.json   how it ended
                             the stop rule (else the   RUN_DIR/model_best.pt  best evaluated
                             best evaluated)           RUN_DIR/model_last.pt  final weights

plus ``factories.pkl`` (a script's pickled factories), ``keys/`` (the run's own keys, see
``BrokerAccess.use_run_keys``), ``checkpoints/`` and ``remote_commands.txt``. The CSV and
TensorBoard files are ``zrl.run.metrics.MetricsWriter``'s.

config.yaml keeps a ``checkpoint.dir`` inside the run directory relative to it (``checkpoints``),
and a relative one read back from there (``--resume``) is relative to the run directory: a copy
of a run directory resumes from, and writes to, its own checkpoints, never the original's.

``model.pt`` is the weights version that met the stop rule, which the run's evaluator kept in
its checkpoint directory (``zrl.roles.evaluated_weights``); when those cannot be had (an
evaluator on another host keeps them there), or the run never met its rule, the best evaluated
weights; else the final ones. summary.json names which (``model_source``, ``model_note``) and
each file's weights version and evaluation return (``models``).

Sockets: throwaway DEALERs for the LOOKUP of the params server and the final GET_WEIGHTS
(``model_last.pt``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from zrl.config.experiment import ExperimentConfig, config_to_yaml
from zrl.config.factories import FACTORIES_FILE, Factories
from zrl.roles.errors import RoleError
from zrl.roles.evaluated_weights import (
    BEST_SUFFIX,
    Evaluated,
    met_suffix,
    read_evaluated,
    same_layout,
)
from zrl.roles.registry_client import registry_request
from zrl.roles.trust import RUN_CHECKPOINTS
from zrl.run.aggregator import Aggregator, number
from zrl.run.metrics import read_csv
from zrl.run.placement import BrokerAccess
from zrl.run.roster import Roster
from zrl.run.stop_rule import StopRule
from zrl.transport import protocol as P
from zrl.utils.durable import atomic_write

log = logging.getLogger("zrl.supervisor")  # the name its log lines have always had

OWN_CHECKPOINTS = RUN_CHECKPOINTS
"""A run's own checkpoint directory, in its run directory (config.yaml names it so; a role
on another host names its own after the run directory: ``zrl.roles.trust.run_name``)."""
RUN_MARKS = ("config.yaml", "summary.json", "progress.csv")
"""Files a run writes in its run directory: one there means the directory holds a run."""
LOG_TAIL_LINES = 15  # of a crashed role's log, shown in the terminal

# What summary.json says about the whole run rather than about one segment of it (a `zrl run`
# and each `--resume` of it is a segment).
ACROSS_SEGMENTS = ("segment", "segments", "total_wall_time", "resumed_at_env_steps")
UNFINISHED_SEGMENT = "this segment wrote no summary.json (it was killed, or its machine went down)"
EVALUATOR_ID = re.compile(r"evaluator-[0-9]{1,6}")


@dataclass
class SavedModels:
    """What the run saved: which weights ``model.pt`` holds (``source``: confirmed, best or
    last), in words (``note``), and each file's weights version and evaluation return."""

    source: str
    note: str
    model: dict[str, Any]
    best: dict[str, Any] | None
    last: dict[str, Any]

    def files(self) -> dict[str, dict[str, Any] | None]:
        """summary.json's ``models``: each file's weights version and evaluation return."""
        return {
            "model.pt": {"source": self.source, **self.model},
            "model_best.pt": self.best,
            "model_last.pt": self.last,
        }


def _figures(kept: Evaluated) -> dict[str, Any]:
    ret = None if kept.eval_return is None else round(kept.eval_return, 2)
    return {"weights_version": kept.version, "eval_return": ret}


def _named(kept: Evaluated) -> str:
    ret = "never evaluated" if kept.eval_return is None else f"eval return {kept.eval_return:.2f}"
    return f"v{kept.version}, {ret}"


def choose_model(
    *,
    confirmed: Evaluated | None,
    best: Evaluated | None,
    last: Evaluated,
    rule: bool,
    met: bool,
    met_version: int | None,
    why_not: str = "",
) -> SavedModels:
    """Which weights ``model.pt`` holds: those that met the stop rule (``confirmed``; ``met``:
    the rule was met, with weights version ``met_version``), else the best evaluated, else
    the last; ``rule``: whether the run had a target on evaluations; ``why_not``: why the
    weights that met it (or any evaluated ones) could not be had."""
    because = f" ({why_not})" if why_not else ""
    if met:
        missed = f"not those that met the stop rule (v{met_version}), which could not be had"
    elif rule:
        missed = "the run never met its stop rule"
    else:
        missed = "the run had no stop rule on evaluations"
    if confirmed is not None:
        source, chosen = "confirmed", confirmed
        note = f"model.pt: the weights that met the stop rule ({_named(confirmed)})"
    elif best is not None:
        source, chosen = "best", best
        note = f"model.pt: the best evaluated weights ({_named(best)}); {missed}"
        note += because if met else ""
    else:
        source, chosen = "last", last
        gone = missed if met else "no evaluated weights could be had"
        note = f"model.pt: the final weights ({_named(last)}); {gone}{because}"
    return SavedModels(
        source=source,
        note=note,
        model=_figures(chosen),
        best=_figures(best) if best is not None else None,
        last=_figures(last),
    )


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


class RunDirTaken(ValueError):
    """A new run was given a run directory that holds a run already."""


def refuse_taken(path: Path, resume: str = "zrl run --resume") -> None:
    """``RunDirTaken`` when ``path`` holds a run already (one of ``RUN_MARKS``): a new run
    there would overwrite its config.yaml and summary.json and resume from checkpoints of
    another experiment. The message names the directory and the two ways on: ``resume``
    (the command that continues it) or another directory."""
    held = [name for name in RUN_MARKS if (path / name).is_file()]
    if held:
        raise RunDirTaken(
            f"the run directory {path} already holds a run ({', '.join(held)}): continue it "
            f"with `{resume} {path}`, or give a new run another --run-dir (nothing in {path} "
            "was changed)"
        )


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

    def save_models(
        self,
        ctx: zmq.Context,
        access: BrokerAccess,
        is_ours: Callable[[Any], bool],
        target: StopRule,
        evals: list[dict[str, Any]],
        timeout: float = 5.0,
        write: Callable[[Evaluated, StopRule], SavedModels | None] | None = None,
    ) -> SavedModels | None:
        """``model.pt``, ``model_best.pt`` and ``model_last.pt`` (``write``, by default
        ``write_models``), the last being the latest weights of this run's params server
        (``is_ours`` tells a registered id of this run from any other, ``timeout`` bounds its
        answer); None if no weights came from params."""
        from zrl.roles.params_client import request_latest_weights

        try:
            services = registry_request(
                ctx,
                access.broker_addr,
                P.Message(P.LOOKUP, meta={"role": "params"}),
                min(2.0, timeout),
                access.keys,
            ).meta.get("services", [])
        except RoleError:
            return None
        # Only our own params server: another registered 'params' role could serve anything.
        services = [s for s in services if isinstance(s, dict) and is_ours(s.get("id"))]
        msg = request_latest_weights(
            ctx, services, self.cfg.broker.max_message_bytes, timeout, access.keys
        )
        if msg is None:
            return None
        version = int(msg.meta.get("version", 0))
        # The last weights' own evaluation, if an evaluator got to them.
        returns = [e["mean"] for e in evals if e.get("weights_version") == version]
        last = Evaluated(version, dict(msg.arrays), returns[-1] if returns else None)
        return (write or self.write_models)(last, target)

    def write_models(self, last: Evaluated, target: StopRule) -> SavedModels:
        """``model_last.pt`` (``last``: the final weights), ``model_best.pt`` (the best single
        evaluation's weights, from the evaluators' best files) and ``model.pt``: the weights
        that met the stop rule (the evaluator's ``met`` file of the confirmed version), else
        the best evaluated, else the last; ``SavedModels.note`` says which, and why."""
        folder = Path(self.cfg.checkpoint.dir) if self.cfg.checkpoint.dir else None
        max_bytes = self.cfg.broker.max_message_bytes
        misses: list[str] = []  # why a file was not taken, in the order asked

        def kept(name: str) -> Evaluated | None:
            if folder is None:
                misses.append("the run has no checkpoint.dir")
                return None
            try:
                got = read_evaluated(folder / name, max_bytes)
            except ValueError as exc:
                misses.append(str(exc))
                return None
            unfit = same_layout(got.weights, last.weights)
            if unfit is not None:
                misses.append(f"{folder / name} does not fit the run's weights: {unfit}")
                return None
            return got

        best: Evaluated | None = None
        for i in range(self.cfg.roles.count("evaluator")):
            found = kept(f"evaluator-{i}{BEST_SUFFIX}")
            if found is not None and (
                best is None or (found.eval_return or 0.0) > (best.eval_return or 0.0)
            ):
                best = found
        confirmed: Evaluated | None = None
        best_misses = len(misses)
        v, by = target.confirmed_version, target.confirmed_by
        if target.target_time is not None and v is not None and by is not None:
            confirmed = kept(f"{by}{met_suffix(v)}") if EVALUATOR_ID.fullmatch(by) else None
            if confirmed is not None and confirmed.version != v:
                misses.append(f"{by}{met_suffix(v)} holds weights v{confirmed.version}")
                confirmed = None
        saved = choose_model(
            confirmed=confirmed,
            best=best,
            last=last,
            rule=self.cfg.stop.on_evaluations,
            met=target.target_time is not None,
            met_version=v,
            # Why the confirmed weights could not be had, or (none taken) why no file was.
            why_not="; ".join((misses[best_misses:] if best is not None else misses)[:3]),
        )
        self.write_model("model_last.pt", last, "last")
        if best is not None:
            self.write_model("model_best.pt", best, "best")
        chosen = {"confirmed": confirmed, "best": best, "last": last}[saved.source]
        assert chosen is not None
        self.write_model("model.pt", chosen, saved.source)
        return saved

    def write_model(self, name: str, kept: Evaluated, source: str) -> None:
        """One weights set as ``zrl eval`` reads it: the weights, their version and evaluation
        return, which of the run's weights they are (``source``), the config, the factories."""
        import torch

        with atomic_write(self.path / name) as f:
            torch.save(
                {
                    "weights": {k: torch.from_numpy(v.copy()) for k, v in kept.weights.items()},
                    "version": kept.version,
                    "source": source,
                    "eval_return": kept.eval_return,
                    "config": json.dumps(self.cfg.model_dump(mode="json")),
                    "factory_refs": self.factories.references,
                },
                f,
            )

    def summary(
        self,
        row: dict[str, Any],
        saved: SavedModels | None,
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
            # The final weights' version (model_last.pt); model.pt's is in "models".
            "weights_version": saved.last["weights_version"] if saved is not None else None,
            "model": str(self.path / "model.pt") if saved is not None else None,
            # Which weights model.pt holds: confirmed (they met the stop rule), best (the
            # best single evaluation's) or last (the final ones), and why.
            "model_source": saved.source if saved is not None else None,
            "model_note": saved.note if saved is not None else None,
            "models": saved.files() if saved is not None else None,
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
