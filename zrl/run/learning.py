"""Whether a run learned: a run whose learners' weights never reached the actors failed, even
when every process stayed up (issue 27: one forged WEIGHTS once locked params for a whole run
and the summary said ``failed: false``).

No sockets: :func:`did_not_learn` reads the registry's last rows (each role's heartbeat info).
The head calls it when the run stops; a reason fails the run (``summary.json`` ``failed:
true`` and ``error``, exit code 1) unless the run met its target.

A learner's weights did not reach params when:

- it sent at least ``MIN_SENT`` WEIGHTS and params acknowledged at most one of them (the
  first is the initial weights: a run that never got past them did not learn), or
- it trained ``MIN_INTERVALS`` publish intervals and params' version of its policy is still
  at most 1.

Learners that never publish (DD-PPO's followers) and algorithms without learners (A3C, whose
params owns the weights) are not judged.
"""

from __future__ import annotations

from typing import Any

from zrl.config.experiment import ExperimentConfig
from zrl.transport import messages as M

MIN_SENT = 3
MIN_INTERVALS = 3


def _count(info: dict[str, Any], key: str) -> int:
    value = info.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def did_not_learn(cfg: ExperimentConfig, rows: list[dict[str, Any]]) -> str | None:
    """Why the run did not learn, from the run's own registry rows (``rows``: the head's
    last STATUS, this run's planned roles only), or None."""
    params = next((r for r in rows if r.get("role") == "params"), None)
    params_info = params.get("info") if isinstance(params, dict) else None
    for row in rows:
        info = row.get("info")
        if row.get("role") != "learner" or not isinstance(info, dict):
            continue
        sent, acked = _count(info, "weights_sent"), _count(info, "weights_acked")
        updates = _count(info, "updates")
        if sent == 0:
            continue  # a learner that does not publish
        rid = row.get("id")
        if sent >= MIN_SENT and acked <= 1:
            return (
                f"{rid} did not learn: params acknowledged {acked} of the {sent} weights it "
                f"sent ({updates} updates), so its updates never reached the actors; see "
                "weights_refused in params' status"
            )
        policy = info.get("policy", M.DEFAULT_POLICY)
        key = "weights_version" if policy == M.DEFAULT_POLICY else f"weights_version_{policy}"
        version = _count(params_info, key) if isinstance(params_info, dict) else None
        trained = updates >= MIN_INTERVALS * cfg.learner.publish_interval
        if trained and version is not None and version <= 1:
            return (
                f"params' weights version of {policy!r} stayed at v{version} while {rid} "
                f"trained {updates} updates: the run did not learn"
            )
    return None
