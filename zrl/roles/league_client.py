"""``LeagueClient``: an actor's line to the league role (``zrl.roles.league``).

Socket: one DEALER to the league's rpc ROUTER (found with LOOKUP "league", looked up again
when it goes quiet), under a random routing id whose digest the actor's heartbeat shows
(``rpc_keys``, ``zrl.roles.rpc_identity``): the league takes RESULTS only from a connection a
planned actor's registry entry vouches for. A heartbeat showing a new key is acknowledged
before the connection is used. MATCH asks for the opponents of the next ``MATCH_BATCH``
episodes before the queue runs dry, so an episode start rarely waits; RESULTS carries the
outcomes of finished episodes, at least every ``RESULTS_INTERVAL_S``; GET_SNAPSHOT fetches a
snapshot's weights the first time an opponent names it (they never change, so they are kept).

MATCH and RESULTS name the learning player the actor acts for (``policy``; absent for the main
agent). An opponent that is another learning player at its current weights (the main agent,
for a main exploiter) is played with the actor's ``live`` model of it (``Actor.live_opponent``).

A snapshot's weights are asked for (one GET_SNAPSHOT in flight at a time) as soon as its
name is in the queue, so they have usually come by the time an episode meets it.

When the league does not answer within ``WAIT_S``, the episode is played against the current
weights (self-play) and counted in ``fallbacks``, and the league counts as quiet
(``league_timeouts``): until it answers again, episodes that find no opponent or no weights
ready fall back at once instead of waiting ``WAIT_S`` each (a slow or restarting league holds no
actor back; waiting per episode once left the main agent's actor a tenth of its peers' steps). A
request unanswered for ``RECONNECT_S`` makes the client look the league up again. A snapshot
or live player whose weights cannot be had is replaced the same way, so the env never meets
an opponent it cannot play.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from zrl.config.multiagent import REFERENCE_PLAYERS
from zrl.roles.base import Role
from zrl.roles.errors import RoleError
from zrl.roles.rpc_identity import ClientKeys
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel

MATCH_BATCH = 64
WAIT_S = 1.0  # the longest an episode start waits for the league, and only while it answers
RECONNECT_S = 5.0  # a request unanswered this long: look the league up again
RESULTS_INTERVAL_S = 0.5
LOOKUP_INTERVAL_S = 2.0
KEPT_SNAPSHOTS = 64
SELF = "self"  # the opponents' name of the actor's own weights; the league names its player


class LeagueClient:
    """The actor's :class:`~zrl.roles.model_opponents.Matchmaker` backed by the league."""

    def __init__(
        self,
        role: Role,
        player: str = M.DEFAULT_POLICY,
        live: Callable[[str], Any] | None = None,
    ) -> None:
        self.role = role
        self.player = player
        self.live = live
        self.channel: Channel | None = None
        self.queue: deque[str] = deque()
        self.asked = False
        self.asked_at = 0.0  # when the MATCH in flight (``asked``) left
        self.fetching: tuple[str, float] | None = None  # the GET_SNAPSHOT in flight, and when
        self.quiet = False  # a wait for the league timed out and it has not answered since
        self.timeouts = 0
        self.results: list[tuple[str, int]] = []
        self.next_flush = 0.0
        self.next_lookup = 0.0
        self.snapshots: OrderedDict[str, Mapping[str, np.ndarray]] = OrderedDict()
        self.missing: set[str] = set()
        self.fallbacks = 0
        self.games = 0
        self.rpc_keys = ClientKeys()  # our league connection's routing id, shown in heartbeats

    # --- the socket ---------------------------------------------------------------------

    def _connect(self) -> Channel | None:
        if self.channel is not None:
            return self.channel
        now = time.monotonic()
        if now < self.next_lookup:
            return None
        self.next_lookup = now + LOOKUP_INTERVAL_S
        try:
            services = self.role.lookup("league", timeout=1.0)
        except RoleError:
            return None
        endpoints = [
            s["rpc"] for s in services if isinstance(s, dict) and isinstance(s.get("rpc"), str)
        ]
        endpoints = [e for e in endpoints if e]
        if not endpoints:
            return None
        # The role's own socket and channel: its keys and message limits, closed with it.
        self.channel = self.role.connect_rpc(
            endpoints[0], self.rpc_keys.renew("league"), "league", rcvtimeo_ms=100
        )
        self.role.heartbeat_now()  # the league asks the registry who holds this connection
        return self.channel

    def _reconnect(self) -> None:
        """The league went quiet: forget the socket, look it up again next time."""
        if self.channel is not None:
            self.role.close_channel(self.channel)
        self.channel = None
        self.asked = False
        self.fetching = None

    def _timed_out(self) -> None:
        """A wait for the league ended without its answer: no more waiting until it answers
        (the request stays in flight; ``_check_in_flight`` gives up on it later)."""
        self.quiet = True
        self.timeouts += 1

    def _check_in_flight(self) -> None:
        """Reconnect when a MATCH or GET_SNAPSHOT has gone unanswered for ``RECONNECT_S``."""
        sent = [self.asked_at] if self.asked else []
        if self.fetching is not None:
            sent.append(self.fetching[1])
        if sent and time.monotonic() - min(sent) >= RECONNECT_S:
            self._reconnect()

    def _receive(self, wait_s: float = 0.0) -> P.Message | None:
        """One answer from the league (MATCHES go to the queue, snapshots to the cache)."""
        channel = self._connect()
        if channel is None or not channel.sock.poll(int(wait_s * 1000)):
            return None
        got = channel.recv(block=False)
        if got is None:
            return None
        msg = got[1]
        self.quiet = False
        try:
            if msg.kind == P.MATCHES:
                self.queue.extend(M.match_opponents(msg.meta))
                self.asked = False
            elif msg.kind == P.WEIGHTS:
                name = M.member_name(msg.meta.get("id"))
                self._fetched(name)
                self._keep_snapshot(name, msg.arrays)
            elif msg.kind == P.NO_WEIGHTS:
                name = M.member_name(msg.meta.get("id"))
                self._fetched(name)
                self.missing.add(name)
            else:
                raise P.ProtocolError(f"{msg.kind!r} from the league")
        except P.ProtocolError as exc:
            channel.drop(msg.sender or "?", str(exc))
        return msg

    def _fetched(self, name: str) -> None:
        if self.fetching is not None and self.fetching[0] == name:
            self.fetching = None

    def _fetch(self, name: str) -> bool:
        """Ask for snapshot ``name``'s weights unless they are here, known missing or already
        asked for; False when it cannot be asked now (another fetch in flight, no league)."""
        if name in self.snapshots or name in self.missing:
            return True
        if self.fetching is not None:
            return self.fetching[0] == name
        channel = self._connect()
        if channel is None or not channel.send(P.Message(P.GET_SNAPSHOT, meta={"id": name})):
            return False
        self.fetching = (name, time.monotonic())
        return True

    def _prefetch(self) -> None:
        """Ask for the weights of the first queued snapshot not held yet (the next episodes'
        opponents), unless a fetch is in flight."""
        for name in self.queue:
            if "@" in name and name not in self.snapshots and name not in self.missing:
                self._fetch(name)
                return

    def _keep_snapshot(self, name: str, arrays: Mapping[str, np.ndarray]) -> None:
        if not arrays or not all(np.all(np.isfinite(a)) for a in arrays.values()):
            raise P.ProtocolError(f"snapshot {name} without finite weights")
        self.snapshots[name] = arrays
        while len(self.snapshots) > KEPT_SNAPSHOTS:
            self.snapshots.popitem(last=False)

    def _drain(self) -> None:
        while self._receive() is not None:
            pass

    # --- Matchmaker -----------------------------------------------------------------------

    def choose(self) -> str:
        self._drain()
        self._check_in_flight()
        self._prefetch()
        self._flush()
        if len(self.queue) < MATCH_BATCH // 2 and not self.asked:
            channel = self._connect()
            if channel is not None and channel.send(
                P.Message(P.MATCH, meta={"count": MATCH_BATCH, **M.policy_meta(self.player)})
            ):
                self.asked = True
                self.asked_at = time.monotonic()
        if not self.queue and not self.quiet:
            deadline = time.monotonic() + WAIT_S
            while not self.queue and time.monotonic() < deadline:
                self._receive(wait_s=0.05)
            if not self.queue:
                self._timed_out()
        if not self.queue:
            self.fallbacks += 1
            return SELF
        name = self.queue.popleft()
        self.games += 1
        if name == self.player:
            return SELF
        if "@" not in name and name not in REFERENCE_PLAYERS:  # another learning player, live
            if self.live is None or self.live(name) is None:
                self.fallbacks += 1
                return SELF
            return name
        if name not in REFERENCE_PLAYERS and self.weights(name) is None:
            self.fallbacks += 1
            return SELF
        return name

    def finished(self, name: str, outcome: int) -> None:
        self.results.append((self.player if name == SELF else name, outcome))

    def weights(self, name: str) -> Mapping[str, np.ndarray] | None:
        if name in self.snapshots:
            self.snapshots.move_to_end(name)
            return self.snapshots[name]
        if name in self.missing:
            return None
        deadline = time.monotonic() + WAIT_S
        while not self._fetch(name):  # the fetch in flight first (answers come in order)
            if self.quiet or self.channel is None or time.monotonic() >= deadline:
                return None
            self._receive(wait_s=0.05)
        while name not in self.snapshots and name not in self.missing:
            if self.quiet or time.monotonic() >= deadline:
                if not self.quiet:
                    self._timed_out()
                return None
            self._receive(wait_s=0.05)
        return self.snapshots.get(name)

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.results or (not force and now < self.next_flush):
            return
        self.next_flush = now + RESULTS_INTERVAL_S
        channel = self._connect()
        if channel is not None:
            batch = self.results[: M.MAX_RESULTS]
            meta = {
                "opponents": [n for n, _ in batch],
                "outcomes": [o for _, o in batch],
                **M.policy_meta(self.player),
            }
            if channel.send(P.Message(P.RESULTS, meta=meta)):
                del self.results[: len(batch)]
        # Kept until the league is back, at most one message's worth: the oldest go first.
        if len(self.results) > M.MAX_RESULTS:
            del self.results[: len(self.results) - M.MAX_RESULTS]

    def close(self) -> None:
        """Send the results still kept, giving them a moment to leave before the socket
        closes (the role closes its other sockets at once)."""
        self._flush(force=True)
        if self.channel is not None:
            self.role.close_channel(self.channel, linger_ms=200)
            self.channel = None

    def heartbeat_info(self) -> dict[str, Any]:
        return {
            "league_games": self.games,
            "league_fallbacks": self.fallbacks,
            "league_timeouts": self.timeouts,
            **self.rpc_keys.info(),
        }
