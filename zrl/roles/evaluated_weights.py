"""Weights an evaluator evaluated, kept in files so that the head can save, at the end of a
run, the weights that met the stop rule (``model.pt``) and the best evaluated ones
(``model_best.pt``), not only the final ones its params server holds (``model_last.pt``).

The evaluator writes them atomically into its checkpoint directory
(``Role.checkpoint_file``), under the run directory unless the config names another::

    <id>.best.pt       the weights of its best single evaluation (kept across its restarts)
    <id>.met-<v>.pt    weights version <v>, whose evaluation met the stop rule by the
                       evaluator's own count (``rule_met``); the latest KEEP_MET of them

Each file is one weights set (what one WEIGHTS message carried) with its version and
evaluation: ``{"weights": {name: tensor}, "version", "eval_return", "episodes",
"confirming"}``, tensors, numbers and booleans only, read back with ``weights_only`` and a
size bound (``read_evaluated``). At most ``1 + KEEP_MET`` such files per evaluator, and the
``met`` ones only once its evaluations reach the target, so a run writes few of them.

The head reads them from its own checkpoint directory (``zrl.run.rundir``): an evaluator on
another host writes them on that host, and the head then falls back to the next weights it
has (best, then last) and says so in summary.json.

No sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zrl.config.sections import StopConfig
from zrl.utils.durable import atomic_write

log = logging.getLogger(__name__)

BEST_SUFFIX = ".best.pt"
UNTRAINED_VERSION = 1
"""Weights versions up to this are the learner's initial weights (v1 is sent before its first
update): an evaluation of them is never kept as the best."""
KEEP_MET = 8
"""Weights sets of evaluations that met the rule kept per evaluator: as many as the head keeps
candidates (``StopRule``), which it confirms within a heartbeat or two of the first."""
FILE_SLACK_BYTES = 1 << 20
"""What torch's container may add to the weights' own bytes in a file."""


def met_suffix(version: int) -> str:
    """The suffix of the file holding weights version ``version`` that met the stop rule."""
    return f".met-{int(version)}.pt"


def rule_met(
    stop: StopConfig,
    means: Sequence[float],
    confirming: bool,
    exploitabilities: Sequence[float | None] = (),
    bounds: Sequence[bool | None] = (),
) -> list[float]:
    """The means that meet the stop rule with the latest evaluation, or [] if it does not.

    ``means`` are one evaluator's evaluation means, oldest first, the latest last (confirming
    ones included); ``confirming``: whether the latest was a confirming evaluation;
    ``exploitabilities``: the same evaluations' exploitability (None: not computed), aligned
    with ``means`` at the end; ``bounds``: whether each met ``eval_at_least`` and
    ``eval_at_most`` (``StopConfig.bounds_met``), aligned the same way. With ``confirm:
    fresh`` only a confirming evaluation meets the rule; with ``confirm: window``, the last
    ``eval_window`` evaluations. Their mean reaches ``eval_return`` (when set), each one's
    exploitability is at most ``exploitability`` (when set) and each one meets the column
    bounds (when set). The head (``StopRule``) and the evaluator count with this same
    function."""
    if not stop.on_evaluations or not means:
        return []
    if stop.confirm == "fresh":
        met = [means[-1]] if confirming else []
    else:
        window = list(means[-stop.eval_window :])
        met = window if len(window) >= stop.eval_window else []
    if not met:
        return []
    if stop.eval_return is not None and sum(met) / len(met) < stop.eval_return:
        return []
    if stop.exploitability is not None:
        found = list(exploitabilities[-len(met) :])
        if len(found) < len(met) or any(e is None or e > stop.exploitability for e in found):
            return []
    if stop.has_bounds:
        held = list(bounds[-len(met) :])
        if len(held) < len(met) or not all(held):
            return []
    return met


@dataclass
class Evaluated:
    """One weights set and what it was evaluated at (``eval_return`` None: never evaluated)."""

    version: int
    weights: dict[str, np.ndarray]
    eval_return: float | None = None
    episodes: int = 0
    confirming: bool = False


def write_evaluated(path: Path, kept: Evaluated) -> None:
    """``kept`` as a file at ``path``, atomically (a reader sees the old file or the new)."""
    import torch  # here: the head reads this module's rules without paying torch's import

    with atomic_write(path) as f:
        torch.save(
            {
                "weights": {k: torch.from_numpy(np.array(v)) for k, v in kept.weights.items()},
                "version": int(kept.version),
                "eval_return": None if kept.eval_return is None else float(kept.eval_return),
                "episodes": int(kept.episodes),
                "confirming": bool(kept.confirming),
            },
            f,
        )


def read_evaluated(path: Path, max_bytes: int) -> Evaluated:
    """The weights set in ``path`` (``write_evaluated``'s); ValueError naming why not: missing,
    larger than ``max_bytes`` (one message's weights) plus ``FILE_SLACK_BYTES``, unreadable."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if size > max_bytes + FILE_SLACK_BYTES:
        raise ValueError(f"{path} holds {size} bytes, more than weights may ({max_bytes})")
    import torch  # here: the head imports torch only once it reads weights, at the end

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        weights = {str(k): v.numpy() for k, v in saved["weights"].items()}
        ret = saved.get("eval_return")
        return Evaluated(
            version=int(saved["version"]),
            weights=weights,
            eval_return=None if ret is None else float(ret),
            episodes=int(saved.get("episodes", 0)),
            confirming=bool(saved.get("confirming", False)),
        )
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or hand-made: say which
        raise ValueError(
            f"{path} is not weights an evaluator kept ({type(exc).__name__})"
        ) from None


def same_layout(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> str | None:
    """Why weights ``a`` do not fit where ``b`` do (other names or shapes), or None."""
    if set(a) != set(b):
        return f"other arrays ({sorted(set(a) ^ set(b))[:4]})"
    for name, array in a.items():
        if array.shape != b[name].shape:
            return f"{name!r} has shape {array.shape}, not {b[name].shape}"
    return None


class EvaluatedKeeper:
    """An evaluator's side: after each evaluation, the weights it evaluated go to its best
    file if it is its best evaluation yet, and to a ``met`` file if it met the stop rule
    (``rule_met`` over this evaluator's own means). ``file_for(suffix)`` is where a file
    goes (``Role.checkpoint_file``; None: nowhere, nothing is kept)."""

    def __init__(
        self, file_for: Callable[[str], Path | None], stop: StopConfig, max_bytes: int
    ) -> None:
        self.file_for = file_for
        self.stop = stop
        self.means: list[float] = []  # the latest eval_window, unrounded as the head gets them
        self.exploitabilities: list[float | None] = []  # theirs, aligned
        self.bounds: list[bool | None] = []  # whether each met the column bounds, aligned
        self.best_return: float | None = None
        self.met_files: list[Path] = []
        best = file_for(BEST_SUFFIX)
        if best is not None and best.is_file():  # a restarted evaluator, a resumed run
            try:
                self.best_return = read_evaluated(best, max_bytes).eval_return
            except ValueError as exc:
                log.warning("%s: starting a new best", exc)
        here = file_for(met_suffix(0))
        if here is not None and here.parent.is_dir():
            stem = here.name.removesuffix(met_suffix(0))
            older = list(here.parent.glob(f"{stem}.met-*.pt"))
            self.met_files = sorted(older, key=lambda p: p.stat().st_mtime)[-KEEP_MET:]

    def on_eval(
        self,
        version: int,
        mean: float,
        episodes: int,
        confirming: bool,
        weights: Callable[[], dict[str, np.ndarray]],
        exploitability: float | None = None,
        bounds: bool | None = None,
    ) -> list[Path]:
        """Keep what this evaluation calls for (``weights()`` is asked at most once); the
        files written. A file that cannot be written is logged, never fatal."""
        keep = max(self.stop.eval_window, 1)
        self.means = [*self.means, mean][-keep:]
        self.exploitabilities = [*self.exploitabilities, exploitability][-keep:]
        self.bounds = [*self.bounds, bounds][-keep:]
        wanted: list[Path] = []
        best = self.file_for(BEST_SUFFIX)
        # The initial weights are never the best: a run without a target saved an untrained
        # policy as model.pt when its first, lucky evaluation scored highest.
        trained = version > UNTRAINED_VERSION
        if best is not None and trained and (self.best_return is None or mean > self.best_return):
            self.best_return = mean
            wanted.append(best)
        met = self.file_for(met_suffix(version))
        if met is not None and rule_met(
            self.stop, self.means, confirming, self.exploitabilities, self.bounds
        ):
            wanted.append(met)
        if not wanted:
            return []
        kept = Evaluated(version, weights(), mean, episodes, confirming)
        written: list[Path] = []
        for path in wanted:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_evaluated(path, kept)
            except OSError as exc:
                log.warning("cannot keep weights v%d in %s: %s", version, path, exc)
                continue
            written.append(path)
            if path is met:
                self._rotate(path)
        return written

    def _rotate(self, path: Path) -> None:
        """Keep the latest KEEP_MET ``met`` files (the same version again replaces its own)."""
        self.met_files = [*(p for p in self.met_files if p != path), path]
        while len(self.met_files) > KEEP_MET:
            self.met_files.pop(0).unlink(missing_ok=True)
