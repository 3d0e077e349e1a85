"""Process set-up shared by every ``zrl start`` process: logging, signals, threads, heap."""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
import threading
from collections.abc import Callable

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def install_stop_signals(on_stop: Callable[[], None]) -> None:
    """SIGINT/SIGTERM request a clean stop; a second signal exits at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    hits = {"n": 0}

    def handler(signum: int, _frame: object) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise SystemExit(128 + signum)
        logging.getLogger("zrl").info("signal %d: stopping", signum)
        on_stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def limit_torch_threads(n: int) -> None:
    """Many roles share few cores: one intra-op thread each avoids oversubscription."""
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set in this process (in-process mode)


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_freed_memory(mb: int | None) -> bool:
    """Have glibc's malloc serve big blocks from the heap and keep up to ``mb`` MB of freed
    memory mapped for reuse. Returns whether it took effect (not on another libc, not with
    ``mb`` None).

    By default glibc maps every block above its mmap threshold (128 KiB up to 32 MiB) afresh
    and unmaps it on free, so a learner that allocates the same large tensors every step (a
    Pong batch of 1024 stacks is 119 MB in float32, its activations more) pays a page fault
    for every 4 KiB of them each step: a third of a CPU learner's step on Pong. Process-wide:
    call it from a role's own process, not from a thread of another program."""
    if mb is None or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, int(mb) * 2**20))


def actor_seed(run_seed: int, index: int) -> int:
    """Env and exploration seed of actor ``index``: distinct per actor, fixed per run."""
    return int(run_seed) * 10_007 + 1_000 * (index + 1)
