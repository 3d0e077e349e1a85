"""The ranks of a learner group as threads of the test's process (as ``zrl run --inproc``
runs learners): :func:`run_ranks`."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_ranks(run: Callable[[int], None], ranks: int = 2, timeout: float = 300.0) -> None:
    """``run(rank)`` for every rank, each in a thread of its own (a group's collectives block
    until every rank joins them), waited for up to ``timeout`` seconds in all: the first error
    a rank raised is raised here, and a rank still running fails the test."""
    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            run(rank)
        except BaseException as exc:  # noqa: BLE001 - raised again by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
