"""``LeagueRole``: the self-play league (``zrl start league``): the learning players (the main
agent, and ``league.main_exploiters`` / ``league.league_exploiters`` exploiters), their frozen
snapshots and the fixed opponents; it picks each actor episode's opponent, takes the
snapshots and resets exploiters (the rules are ``zrl.league``).

Sockets:

- ROUTER ``rpc`` (own endpoint, found with LOOKUP "league"): MATCH {count, policy} from an
  actor -> MATCHES {opponents} for that learning player; RESULTS {opponents, outcomes,
  policy} from an actor (not answered): the payoff table and Elo ratings; GET_SNAPSHOT {id}
  -> WEIGHTS {id, version} with the snapshot's arrays (or NO_WEIGHTS for a name it does not
  hold).
- SUB ``weights`` (topic bus, one per learning player: ``M.policy_topic``) plus GET_WEIGHTS
  at start (``zrl.roles.weights``): each player's newest weights, which a snapshot freezes
  when ``zrl.league.League`` says (a win rate reached ``league.snapshot_win_rate``, or
  ``league.snapshot_interval_s`` passed).
- DEALER -> the parameter server's rpc (LOOKUP "params"), only with exploiters: RESET
  {policy, resets} after an exploiter's snapshot when the league resets it, repeated every
  ``RESET_REPEAT_S`` until that player's weights stream carries the count (its learner
  restarted from its initial weights). No snapshot of a player is taken meanwhile.

Checkpoint (``<checkpoint.dir>/league.json`` and ``league_snapshots.npz``, written every
``checkpoint.interval`` and on stop, atomically): the payoff, Elo ratings, counters, each
player's snapshot clock and resets, and the snapshots' weights; a restart resumes them. Results come from actors and are trusted as far
as their form: a peer that can reach the league can bias its payoff (see the README's
security section).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zrl.durable import atomic_write, atomic_write_text
from zrl.league import MAIN, League, snapshot_version
from zrl.roles.base import Role
from zrl.roles.weights import WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P

STATE_FILE = "league.json"
SNAPSHOTS_FILE = "league_snapshots.npz"
TRACKED_SNAPSHOTS = 8  # newest snapshots whose Elo goes into the training metrics
SEPARATOR = "/"  # between a snapshot's id and a parameter name in the npz file
RESET_REPEAT_S = 1.0  # a RESET not yet seen on the player's stream is sent again


class LatestArrays(WeightsFollower):
    """A weights follower that keeps the newest arrays instead of loading them into a model
    (the league builds no network: it only stores and serves weights)."""

    def __init__(self, role: Role, policy: str = MAIN) -> None:
        super().__init__(role, policy=policy)
        self.arrays: dict[str, np.ndarray] = {}

    def _apply(self, msg: P.Message, version: int) -> bool:
        if not msg.arrays or not all(np.all(np.isfinite(a)) for a in msg.arrays.values()):
            self.sub._drop(msg.sender or "?", f"weights v{version} empty or not finite")
            return False
        self.arrays = {k: np.array(v) for k, v in msg.arrays.items()}
        self.version = version
        return True


class LeagueRole(Role):
    role = "league"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.snapshots: dict[str, dict[str, np.ndarray]] = {}
        self.matches_served = 0
        self.checkpoint_dir: Path | None = None
        self.next_checkpoint = 0.0
        self.followers: dict[str, LatestArrays] = {}
        self.params: Any = None  # DEALER to params for RESET, opened on the first one
        self.next_reset = 0.0

    def bind(self) -> None:
        self.rpc = self.bind_rpc()

    def setup(self) -> None:
        cfg = self.config
        self.league = League(cfg.league, seed=cfg.seed)
        self.followers = {p: LatestArrays(self, p) for p in self.league.players}
        self.weights = self.followers[MAIN]
        if cfg.checkpoint.dir:
            self.checkpoint_dir = Path(cfg.checkpoint.dir)
            self.next_checkpoint = time.monotonic() + cfg.checkpoint.interval
            self.load_checkpoint()
        for follower in self.followers.values():
            follower.fetch_latest()

    # --- snapshots ------------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Freeze each learning player's newest weights when the league's rule says so, and
        reset an exploiter when it says so."""
        for player, follower in self.followers.items():
            if follower.arrays and not self.reset_pending(player):
                self.snapshot(player, follower)

    def snapshot(self, player: str, follower: LatestArrays) -> None:
        reason = self.league.snapshot_reason(player)
        if reason is None:
            return
        win_rate = self.league.win_rate(player)
        name = self.league.add_snapshot(follower.version, player)
        if name in self.snapshots:
            return  # the weights did not move since: only the clock restarted, no reset
        self.snapshots[name] = follower.arrays
        self.log.info(
            "snapshot %s (%s: %s's win rate %.2f, Elo %.0f); %d in the league",
            name, reason, player, win_rate, self.league.elo.rating(player),
            len(self.league.snapshots),
        )  # fmt: skip
        for evicted in set(self.snapshots) - set(self.league.snapshots):
            del self.snapshots[evicted]
        if self.league.reset_after_snapshot(player):
            self.log.info("%s restarts from its initial weights (reset %d)",
                          player, self.league.resets[player])  # fmt: skip
            self.next_reset = 0.0

    def reset_pending(self, player: str) -> bool:
        """Whether the league reset ``player`` and its weights stream does not show it yet.

        A stream that shows more resets than the league counts (a league restarted without
        its checkpoint) sets the count: the next reset must be a number its learner has not
        applied yet, or the learner would take it for one it has."""
        shown = self.followers[player].meta.get("resets", 0)
        if not isinstance(shown, int):
            return False
        if shown > self.league.resets[player]:
            self.league.resets[player] = shown
        return shown < self.league.resets[player]

    def send_resets(self) -> None:
        """RESET to params for every player whose reset its stream does not show yet (the
        first at once, then every RESET_REPEAT_S: a params or learner restart loses none)."""
        now = time.monotonic()
        pending = [p for p in self.league.players if self.reset_pending(p)]
        if not pending or now < self.next_reset:
            return
        self.next_reset = now + RESET_REPEAT_S
        if self.params is None:
            services = self.lookup("params", timeout=1.0)
            if not services:
                return
            sock = self._sock(zmq.DEALER, sndhwm=16, sndtimeo_ms=0)
            sock.connect(services[0]["rpc"])
            self.params = self._channel(sock, "params-rpc")
        for player in pending:
            meta = {"resets": self.league.resets[player], **M.policy_meta(player)}
            self.params.send(P.Message(P.RESET, meta=meta), block=False)

    @property
    def versions(self) -> dict[str, int]:
        """The weights version of every snapshot held (its name records it)."""
        return {name: snapshot_version(name) for name in self.snapshots}

    # --- requests -------------------------------------------------------------------------

    def step(self) -> None:
        for follower in self.followers.values():
            follower.update()
        self.maybe_snapshot()
        self.send_resets()
        if self.checkpoint_dir is not None and time.monotonic() >= self.next_checkpoint:
            self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
            self.save_checkpoint()
        self.serve_requests(self.rpc, 50)

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.MATCH:
            count = M.match_count(msg.meta)
            player = self.player(msg.meta)
            opponents = [self.league.choose_opponent(player) for _ in range(count)]
            self.matches_served += count
            self.rpc.send(
                P.Message(P.MATCHES, meta={"opponents": opponents}), to=ident, block=False
            )
        elif msg.kind == P.RESULTS:
            player = self.player(msg.meta)
            for opponent, outcome in M.league_results(msg.meta):
                self.league.record(opponent, outcome, player=player)
        elif msg.kind == P.GET_SNAPSHOT:
            name = M.member_name(msg.meta.get("id"))
            arrays = self.snapshots.get(name)
            if arrays is None:
                self.rpc.send(P.Message(P.NO_WEIGHTS, meta={"id": name}), to=ident, block=False)
            else:
                meta = {"id": name, "version": snapshot_version(name)}
                self.rpc.send(P.Message(P.WEIGHTS, meta=meta, arrays=arrays), to=ident, block=False)
        else:
            raise P.ProtocolError(f"the league does not serve {msg.kind!r}")

    def player(self, meta: dict[str, Any]) -> str:
        """The learning player a MATCH or RESULTS names (``policy``); ProtocolError unless one
        of the league's."""
        player = M.policy_name(meta)
        if player not in self.followers:
            raise P.ProtocolError(f"{player!r} is not a learning player of {self.league.players}")
        return player

    # --- checkpoint -----------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        assert self.checkpoint_dir is not None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {"league": self.league.state_dict()}
        arrays = {
            f"{name}{SEPARATOR}{key}": value
            for name, weights in self.snapshots.items()
            for key, value in weights.items()
        }
        # Snapshots first: the state never names a snapshot the disk may not hold.
        with atomic_write(self.checkpoint_dir / SNAPSHOTS_FILE) as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        atomic_write_text(self.checkpoint_dir / STATE_FILE, json.dumps(state))

    def load_checkpoint(self) -> None:
        assert self.checkpoint_dir is not None
        path, npz = self.checkpoint_dir / STATE_FILE, self.checkpoint_dir / SNAPSHOTS_FILE
        if not path.is_file() or not npz.is_file():
            return
        state = json.loads(path.read_text())
        self.league.load_state_dict(state["league"])
        with np.load(npz, allow_pickle=False) as stored:
            for key in stored.files:
                name, _, param = key.partition(SEPARATOR)
                self.snapshots.setdefault(name, {})[param] = stored[key]
        self.log.info(
            "resumed the league from %s: %d games, %d snapshots",
            self.checkpoint_dir, self.league.games, len(self.snapshots),
        )  # fmt: skip

    def teardown(self) -> None:
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        info = self.league.info()
        self.log.info(
            "%s: %d games (%d self-play), %d snapshots, main's Elo %.0f",
            self.id, info["games"], info["self_play_games"], info["snapshots"], info["elo_main"],
        )  # fmt: skip

    # --- reports --------------------------------------------------------------------------

    def train_info(self) -> dict[str, float]:
        """The league's figures and the Elo ratings of main, the fixed opponents and the
        newest snapshots (metric names are ``[a-z][a-z0-9_]*``: ``main@120`` -> ``elo_main_120``)."""
        out = self.league.info()
        for name in self.league.snapshots[-TRACKED_SNAPSHOTS:]:
            out[f"elo_{name.replace('@', '_')}"] = self.league.elo.rating(name)
        return out

    def heartbeat_info(self) -> dict[str, Any]:
        info = self.league.info()
        ratings = sorted(self.league.elo.ratings().items(), key=lambda kv: -kv[1])
        out: dict[str, Any] = {
            "games": int(info["games"]),
            "snapshots": int(info["snapshots"]),
            "main_win_rate": round(info["main_win_rate"], 3),
            "elo_main": round(info["elo_main"], 1),
            "elo_top": {name: round(r, 1) for name, r in ratings[:5]},
            "matches_served": self.matches_served,
            "weights_version": self.weights.version,
        }
        if len(self.league.players) > 1:
            # Each learning player's win rate (by its snapshot rule), Elo, snapshots, resets.
            out["players"] = {
                p: {
                    "win_rate": round(self.league.win_rate(p), 3),
                    "elo": round(self.league.elo.rating(p), 1),
                    "snapshots": len(self.league.snapshots_of(p)),
                    "resets": self.league.resets[p],
                    "games": self.league.player_games[p],
                    "weights_version": self.followers[p].version,
                }
                for p in self.league.players
            }
        return out
