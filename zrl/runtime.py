"""Process set-up shared by every ``zrl start`` process: logging, signals, threads."""

from __future__ import annotations

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


def actor_seed(run_seed: int, index: int) -> int:
    """Env and exploration seed of actor ``index``: distinct per actor, fixed per run."""
    return int(run_seed) * 10_007 + 1_000 * (index + 1)
