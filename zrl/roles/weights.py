"""Following the parameter server: the newest weights from the topic bus, and late join.

Used by every role that acts with the current policy (actors, the evaluator). A follower
follows one policy's stream (``M.DEFAULT_POLICY`` unless named: a league's exploiters each
have one). Sockets: SUB on topic ``weights`` (``policy/<name>/weights`` for a named policy;
a message naming another policy is dropped), to the broker's topic bus or, for a role a host
agent started, to the agent's weights relay over ipc (``RoleSockets.open_weights_subscriber``,
``zrl.run.weights_relay``: the raw frames of the bus, one copy per host; checked here as the
bus's are, the relay trusted no more than the broker); a throwaway DEALER to the params rpc
endpoint (found with LOOKUP "params") for GET_WEIGHTS: once when a late joiner starts, and
again to resynchronise (below). The registry's LOOKUP answer also names the sender ids that
may publish weights.

Which weights are adopted (anything else is dropped and counted on the ``weights``
channel, never fatal):

- WEIGHTS on the bus only from a sender id the broker lists as a live params role
  (LOOKUP "params", asked again on an unknown ``params-*`` id at most once per
  ``PARAMS_LOOKUP_INTERVAL_S``, so a flood of forged ids cannot turn into a LOOKUP
  per message; other ids are dropped without asking).
- Only finite values that fit the model (:func:`zrl.nets.wire.load_arrays`).
- From the bus, a version at most ``MAX_VERSION_STEP`` ahead of the current one. A
  larger jump is not adopted from the bus: it triggers a resync, a GET_WEIGHTS to the
  params rpc endpoint the broker names, whose answer is adopted at whatever version it
  has. That one rule sets the baseline of a follower that starts (or meets a params
  server resumed at v50,000), and follows a params server that restarted (higher or,
  from scratch, lower): a bus version below the current one also asks for a resync.
  Resyncs happen at most once per ``RESYNC_INTERVAL_S``, except one: when the version held
  was adopted from the bus as a jump (more than one past the one before) and a lower one
  follows, the jump was likely forged and the lower one real, so the resync goes at once
  (at most once per ``FAST_RESYNC_INTERVAL_S``): forged in-range weights last until the
  next real version, not until the next slow resync.

Without keys, a process that can reach the broker can still publish well-formed, finite
weights under the real params id and within the step: they are adopted until the next
resync or real version. See docs/security.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from torch import nn

from zrl.nets.wire import load_arrays
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.roles.params import MAX_VERSION_STEP
from zrl.roles.params_client import request_latest_weights
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.messages import weights_version

PARAMS_ID_PREFIX = "params-"
PARAMS_LOOKUP_INTERVAL_S = 1.0
RESYNC_INTERVAL_S = 5.0
FAST_RESYNC_INTERVAL_S = 0.25
RESYNC_TIMEOUT_S = 1.0

log = logging.getLogger(__name__)


class WeightsFollower:
    """Keeps a model at the newest weights version the parameter server published or served."""

    def __init__(
        self, role: Role, model: nn.Module | None = None, policy: str = M.DEFAULT_POLICY
    ) -> None:
        self.role = role
        self.model = model
        self.policy = policy
        topic = M.policy_topic(P.WEIGHTS_TOPIC, policy)
        self.sub = role.open_weights_subscriber([topic], "weights")
        self.meta: dict[str, Any] = {}  # of the weights adopted last
        self.version = 0
        self.params_ids: set[str] = set()
        self._next_lookup = 0.0
        self._next_resync = 0.0
        self._last_resync = -FAST_RESYNC_INTERVAL_S
        self.resyncs = 0
        # The version held came from the bus more than one past the one before, and the
        # params rpc has not confirmed it since (see the module docstring).
        self.unconfirmed_jump = False
        self.resync_due = False  # a lower or far version was seen; params not asked yet

    def _refresh_params(self, timeout: float = RESYNC_TIMEOUT_S) -> list[dict[str, Any]]:
        """LOOKUP "params" (rate-limited); the services found, remembering their ids."""
        now = time.monotonic()
        if now < self._next_lookup:
            return []
        self._next_lookup = now + PARAMS_LOOKUP_INTERVAL_S
        try:
            answer = self.role.lookup("params", timeout=timeout)
        except RoleError as exc:  # broker away for now: keep the ids we knew
            log.debug("params lookup failed: %s", exc)
            return []
        services = [
            s
            for s in (answer if isinstance(answer, list) else [])
            if isinstance(s, dict)
            and isinstance(s.get("id"), str)
            and isinstance(s.get("rpc"), str)
            and s["rpc"]
        ]
        if services:
            self.params_ids = {s["id"] for s in services}
        return services

    def from_params(self, sender: str) -> bool:
        """Whether ``sender`` is a params role the broker lists (asking again on a miss)."""
        if not sender.startswith(PARAMS_ID_PREFIX):
            return False  # no params role has such an id: not worth a LOOKUP
        if sender not in self.params_ids:
            self._refresh_params()
        return sender in self.params_ids

    def _apply(self, msg: P.Message, version: int) -> bool:
        """Load ``msg`` into the model; weights that do not fit are dropped, never fatal."""
        assert self.model is not None
        try:
            load_arrays(self.model, msg.arrays)
        except ValueError as exc:
            self.sub.drop(msg.sender or "?", f"weights v{version} refused: {exc}")
            return False
        self.version = version
        return True

    def update(self) -> bool:
        """Drain the subscription without blocking and apply the newest acceptable version
        (see the module docstring). True when the model changed."""
        candidates: list[tuple[int, P.Message]] = []
        jumps: list[tuple[int, str]] = []
        behind = False
        while True:
            got = self.sub.recv(block=False)
            if got is None:
                break
            msg = got[1]
            sender = msg.sender or "?"
            if msg.kind != P.WEIGHTS:
                self.sub.drop(sender, f"{msg.kind!r} on the weights topic")
                continue
            if not self.from_params(sender):
                self.sub.drop(sender, f"weights from {sender!r}, not a registered params role")
                continue
            version = weights_version(msg.meta)
            if msg.meta.get("policy", M.DEFAULT_POLICY) != self.policy:
                self.sub.drop(sender, f"weights of policy {msg.meta.get('policy')!r}")
            elif version is None:
                self.sub.drop(
                    sender, f"weights version {msg.meta.get('version')!r} is not in [1, 2**53]"
                )
            elif version - self.version > MAX_VERSION_STEP:
                jumps.append((version, sender))
            elif version > self.version:
                candidates.append((version, msg))
            else:
                # Older than ours: a late joiner's backlog, or a params server that restarted
                # from scratch (or we adopted a forgery). The params rpc tells which.
                behind = behind or version < self.version
        # Newest first; fall back to an older one if the newest does not fit.
        for version, msg in sorted(candidates, key=lambda c: c[0], reverse=True):
            before = self.version
            if self._apply(msg, version):
                self.meta = dict(msg.meta)
                self.unconfirmed_jump = version > before + 1
                return True
        # A resync the interval holds back stays due: the next update asks once it may.
        self.resync_due = self.resync_due or bool(jumps or behind)
        changed = self.resync_due and self.resync(at_once=self.unconfirmed_jump)
        for version, sender in jumps:
            if version > self.version:  # the params server itself did not confirm it
                self.sub.drop(
                    sender,
                    f"weights v{version} jump more than {MAX_VERSION_STEP} versions past "
                    f"v{self.version}, and the params rpc does not confirm it",
                )
        return changed

    def resync(self, at_once: bool = False) -> bool:
        """GET_WEIGHTS from the params rpc the broker names, at most once per
        ``RESYNC_INTERVAL_S`` (``at_once``: per ``FAST_RESYNC_INTERVAL_S``); its answer is
        adopted at any version. True when applied."""
        now = time.monotonic()
        if now < (self._last_resync + FAST_RESYNC_INTERVAL_S if at_once else self._next_resync):
            return False
        self._next_resync = now + RESYNC_INTERVAL_S
        self._last_resync = now
        self.resync_due = False
        self.resyncs += 1
        return self.fetch_latest(timeout=RESYNC_TIMEOUT_S)

    def fetch_latest(self, timeout: float = 2.0) -> bool:
        """Ask the parameter server directly (late join, resync); True when weights were applied.

        The direct answer is authoritative: it is adopted whenever its version differs from
        ours, lower included (the server restarted from scratch)."""
        self._next_lookup = 0.0  # this one LOOKUP is not the flood the rate limit is for
        services = self._refresh_params(timeout)
        msg = request_latest_weights(
            self.role.ctx,
            services,
            self.role.max_message_bytes,
            timeout,
            self.role.keys,
            self.policy,
        )
        if msg is None or msg.kind != P.WEIGHTS:
            return False
        version = weights_version(msg.meta)
        if version is None:
            self.sub.drop(msg.sender or "?", "served weights without a version in [1, 2**53]")
            return False
        if version == self.version:
            self.unconfirmed_jump = False
            return False
        if version < self.version:
            log.warning(
                "the parameter server is at weights v%d, behind our v%d (it restarted?): "
                "following it",
                version,
                self.version,
            )
        if not self._apply(msg, version):
            return False
        self.meta = dict(msg.meta)
        self.unconfirmed_jump = False
        return True
