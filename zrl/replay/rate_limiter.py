"""Sample-to-insert ratio limiter with Reverb's ``SampleToInsertRatio`` semantics.

Why: in distributed off-policy RL the learner and the actors run at independent speeds. If
the learner samples far faster than actors insert, it overfits a stale buffer; if actors
insert far faster, data is wasted. The limiter pins the long-run ratio
``samples / inserts`` to ``samples_per_insert`` within a slack of ``error_buffer`` samples by
telling the server which side has to wait.

Definitions (all counts are items, not calls)::

    offset   = samples_per_insert * min_size_to_sample
    min_diff = offset - error_buffer
    max_diff = offset + error_buffer
    diff     = inserts * samples_per_insert - samples

* Sampling ``n`` items is allowed iff ``size >= min_size_to_sample`` and
  ``inserts * samples_per_insert - (samples + n) >= min_diff``.
* Inserting is allowed iff ``size < min_size_to_sample`` (warm-up is never throttled) or
  ``(inserts + 1) * samples_per_insert - samples <= max_diff``.

The ``offset`` term is Reverb's: the first ``min_size_to_sample`` inserts happen before any
sampling can, so they are not counted against the ratio.

A batch insert of ``n`` items is judged by its *first* item only (the ``+ 1`` above), not by
``inserts + n``. A batch whose ``n * samples_per_insert`` exceeds the ``2 * error_buffer``
window could otherwise never be admitted, deadlocking actors that send whole rollouts.
The price is a temporary overshoot of ``diff`` by at most ``(n - 1) * samples_per_insert``,
which the learner then works off before the next insert is admitted.

``samples_per_insert <= 0`` disables the ratio: only the ``min_size_to_sample`` gate applies.
"""

from __future__ import annotations

import math
from typing import Any

from zrl.replay.checks import check_int


class RateLimiter:
    """Decides whether a replay server may serve an insert or a sample right now.

    The limiter keeps its own ``inserts``/``samples`` counters (advanced by ``on_insert`` /
    ``on_sample``) while ``size`` is passed in by the caller, because a FIFO or
    capacity-bounded table's size is not derivable from the counters.
    """

    def __init__(
        self, min_size_to_sample: int, samples_per_insert: float, error_buffer: float
    ) -> None:
        self.min_size_to_sample = check_int("min_size_to_sample", min_size_to_sample, 1)
        spi = float(samples_per_insert)
        if not math.isfinite(spi):
            raise ValueError(f"samples_per_insert must be finite, got {samples_per_insert}")
        eb = float(error_buffer)
        if not (math.isfinite(eb) and eb >= 0):
            raise ValueError(f"error_buffer must be finite and >= 0, got {error_buffer}")
        if spi > 0 and eb < max(1.0, spi):
            # Same check as Reverb: a window narrower than one insert's worth of samples
            # (or one sample) can block both sides forever.
            raise ValueError(
                f"error_buffer must be >= max(1.0, samples_per_insert)={max(1.0, spi)} "
                f"or inserts/samples can deadlock, got {error_buffer}"
            )
        self.samples_per_insert = spi
        self.error_buffer = eb
        offset = spi * self.min_size_to_sample if spi > 0 else 0.0
        self.min_diff = offset - eb
        self.max_diff = offset + eb
        self.inserts = 0
        self.samples = 0

    @property
    def ratio_enabled(self) -> bool:
        return self.samples_per_insert > 0

    # ------------------------------------------------------------------ checks
    def can_insert(self, n: int, size: int) -> bool:
        """Whether a batch of ``n`` items may be inserted now (judged by its first item)."""
        check_int("n", n, 1)
        if not self.ratio_enabled or size < self.min_size_to_sample:
            return True
        diff_after_first = (self.inserts + 1) * self.samples_per_insert - self.samples
        return diff_after_first <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        """Whether ``n`` items may be sampled now."""
        return self.why_blocked(n, size) is None

    def why_blocked(self, n: int, size: int) -> str | None:
        """Reason sampling ``n`` items is blocked, or None if it is allowed.

        Meant for logs/status pages, where "learner idle" is otherwise hard to diagnose.
        """
        check_int("n", n, 1)
        if size < self.min_size_to_sample:
            return f"replay has {size} items, needs {self.min_size_to_sample} to start sampling"
        if not self.ratio_enabled:
            return None
        spi = self.samples_per_insert
        if self.inserts * spi - (self.samples + n) >= self.min_diff:
            return None
        # Ratio over the inserts that happened after warm-up, the quantity Reverb controls.
        counted = max(self.inserts - self.min_size_to_sample, 1)
        ratio = (self.samples + n) / counted
        needed = math.ceil((self.samples + n + self.min_diff) / spi) - self.inserts
        return (
            f"samples/insert ratio {ratio:.1f} above target {spi:g} +- {self.error_buffer:g} "
            f"samples ({self.samples} sampled + {n} requested vs {self.inserts} inserted); "
            f"needs {max(needed, 1)} more inserts"
        )

    # ------------------------------------------------------------------ bookkeeping
    def on_insert(self, n: int) -> None:
        self.inserts += check_int("n", n, 0)

    def on_sample(self, n: int) -> None:
        self.samples += check_int("n", n, 0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "error_buffer": self.error_buffer,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters; the configuration stays as constructed so a resumed run may
        retune the ratio without the checkpoint overriding it."""
        inserts, samples = int(state["inserts"]), int(state["samples"])
        if inserts < 0 or samples < 0:
            raise ValueError(f"counters must be >= 0, got inserts={inserts}, samples={samples}")
        self.inserts = inserts
        self.samples = samples

    def __repr__(self) -> str:
        return (
            f"RateLimiter(min_size_to_sample={self.min_size_to_sample}, "
            f"samples_per_insert={self.samples_per_insert:g}, "
            f"error_buffer={self.error_buffer:g}, inserts={self.inserts}, samples={self.samples})"
        )
