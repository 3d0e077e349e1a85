"""``LeagueRole``: the self-play league (``zrl start league``): the learning players (the main
agent, and ``league.main_exploiters`` / ``league.league_exploiters`` exploiters), their frozen
snapshots and the fixed opponents; it picks each actor episode's opponent, takes the
snapshots and resets exploiters (the rules are ``zrl.league``).

Sockets:

- ROUTER ``rpc`` (own endpoint, found with LOOKUP "league"): MATCH {count, policy} from an
  actor -> MATCHES {opponents} for that learning player; RESULTS {opponents, outcomes,
  policy} from an actor (not answered): the payoff table and Elo ratings, taken only from a
  connection a live entry of a planned actor vouches for (``zrl.roles.rpc_identity``; the
  sender table, ``zrl.transport.senders``), at most ``M.MAX_RESULTS`` per message; others are
  dropped and counted (``results_refused``); GET_SNAPSHOT {id} -> WEIGHTS {id, version} with
  the snapshot's arrays (or NO_WEIGHTS for a name it does not hold). Replies are bounded as
  params' are (``REPLY_HWM`` per peer, ``REPLY_TOTAL_BYTES`` per ``REPLY_DRAIN_S`` in all);
  past that they are dropped and counted (``replies_dropped``).
- SUB ``weights`` (topic bus, one per learning player: ``M.policy_topic``): which version
  each player's params stream is at, nothing more: the bus is open to forgers. A snapshot,
  when ``zrl.league.population.League`` says (a win rate reached ``league.snapshot_win_rate``, or
  ``league.snapshot_interval_s`` passed), freezes weights fetched with GET_WEIGHTS from
  params' rpc (the LOOKUP "params" answer), in the layout of the model the config builds for
  the env's spaces; anything else is dropped and counted (``weights_refused``).
- DEALER -> the parameter server's rpc (LOOKUP "params"), only with exploiters: RESET
  {policy, resets} after an exploiter's snapshot when the league resets it, repeated every
  ``RESET_REPEAT_S`` until that player's weights stream carries the count (its learner
  restarted from its initial weights). No snapshot of a player is taken meanwhile. The
  DEALER connects under a random routing id whose digest the league's heartbeat shows
  (``rpc_keys``): params takes RESET only from the planned league's connection.

Checkpoint (``<checkpoint.dir>/league.json`` and ``league_snapshots.npz``, written every
``checkpoint.interval`` and on stop, atomically): the payoff, Elo ratings, counters, each
player's snapshot clock and resets, and the snapshots' weights; a restart resumes them
(snapshots not in the model's layout are left out). Results are trusted as far as their form
once their connection is a planned actor's: without keys, a process that sees the traffic can
still copy a connection's key (see docs/security.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from zrl.config.league import MAIN
from zrl.league.population import League, snapshot_version
from zrl.roles.base import Role, is_planned
from zrl.roles.params import (
    REPLY_DRAIN_S,
    REPLY_HWM,
    REPLY_KERNEL_BUFFER_BYTES,
    REPLY_TOTAL_BYTES,
    Layout,
    layout_of,
    layout_problem,
)
from zrl.roles.params_client import request_latest_weights
from zrl.roles.rpc_identity import (
    ClientKeys,
    RegisteredPeers,
    status_rows,
)
from zrl.roles.weights import RESYNC_TIMEOUT_S, WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.messages import weights_version
from zrl.transport.senders import may_send
from zrl.transport.sockets import ReplyBudget
from zrl.utils.durable import atomic_write, atomic_write_text

STATE_FILE = "league.json"
SNAPSHOTS_FILE = "league_snapshots.npz"
TRACKED_SNAPSHOTS = 8  # newest snapshots whose Elo goes into the training metrics
SEPARATOR = "/"  # between a snapshot's id and a parameter name in the npz file
MAIN_VS_MEMBERS = 24  # pool members (the newest, fixed opponents first) in main_vs
RESET_REPEAT_S = 1.0  # a RESET not yet seen on the player's stream is sent again
FETCH_RETRY_S = 1.0  # a snapshot whose weights params' rpc did not give is tried again then


class LatestArrays(WeightsFollower):
    """A weights follower that builds no network (the league only stores and serves
    weights): the bus tells it the version of a player's stream; ``fetch_confirmed`` takes
    the arrays from params' rpc, in ``layout`` only."""

    def __init__(self, role: Role, layout: Layout, policy: str = MAIN) -> None:
        super().__init__(role, policy=policy)
        self.layout = layout
        self.arrays: dict[str, np.ndarray] = {}  # fetched from params' rpc, at ``confirmed``
        self.confirmed = 0
        self.refused = 0
        self.next_fetch = 0.0

    def problem(self, arrays: dict[str, np.ndarray]) -> str | None:
        problem = layout_problem(arrays, self.layout)
        if problem is None and not all(np.all(np.isfinite(a)) for a in arrays.values()):
            problem = "values not finite"
        return problem

    def _apply(self, msg: P.Message, version: int) -> bool:
        problem = self.problem(msg.arrays)
        if problem is not None:
            self.refused += 1
            self.sub.drop(msg.sender or "?", f"weights v{version} refused: {problem}")
            return False
        self.version = version  # the arrays are not kept: the bus is open to forgers
        return True

    def fetch_confirmed(self) -> bool:
        """The player's newest weights from params' rpc (at most once per ``FETCH_RETRY_S``
        while it fails): True when ``arrays`` hold them, at version ``confirmed``."""
        now = time.monotonic()
        if now < self.next_fetch:
            return False
        self.next_fetch = now + FETCH_RETRY_S
        self._next_lookup = 0.0
        services = self._refresh_params(RESYNC_TIMEOUT_S)
        msg = request_latest_weights(
            self.role.ctx,
            services,
            self.role.max_message_bytes,
            RESYNC_TIMEOUT_S,
            self.role.keys,
            self.policy,
        )
        if msg is None:
            return False
        version = weights_version(msg.meta)
        problem = "no version in [1, 2**53]" if version is None else self.problem(msg.arrays)
        if problem is not None:
            self.refused += 1
            self.sub.drop(msg.sender or "?", f"served weights refused: {problem}")
            return False
        assert version is not None
        self.arrays = {k: np.array(v) for k, v in msg.arrays.items()}
        self.confirmed = self.version = version  # params' word beats the bus's
        self.meta = dict(msg.meta)
        self.next_fetch = 0.0
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
        self.layout: Layout = {}
        self.results_refused = 0
        self.replies_dropped = 0
        # Snapshots are served as they are stored (no copy); replies counted for the total.
        self.reply_budget = ReplyBudget(
            per_peer_bytes=REPLY_TOTAL_BYTES, total_bytes=REPLY_TOTAL_BYTES, drain_s=REPLY_DRAIN_S
        )
        self.rpc_keys = ClientKeys()  # our params connection's routing id, shown in heartbeats
        self.actors = RegisteredPeers(
            "league",
            lambda: status_rows(self.ctx, self.broker, self.keys, ("actor",)),
            self.planned_actor,
        )

    def bind(self) -> None:
        self.rpc = self.bind_rpc(
            sndhwm=REPLY_HWM, kernel_buffer_bytes=REPLY_KERNEL_BUFFER_BYTES, mandatory=True
        )

    def reply(self, ident: bytes, msg: P.Message) -> None:
        """Send ``msg`` to ``ident``; dropped and counted (``replies_dropped``) past the
        peer's queue (``REPLY_HWM``) or the total (``reply_budget``), or when it left."""
        if not self.rpc.reply(msg, ident, self.reply_budget):
            self.replies_dropped += 1

    def setup(self) -> None:
        cfg = self.config
        self.league = League(cfg.league, seed=cfg.seed)
        self.layout = self.model_layout()
        self.followers = {p: LatestArrays(self, self.layout, p) for p in self.league.players}
        self.weights = self.followers[MAIN]
        if cfg.checkpoint.dir:
            self.checkpoint_dir = Path(cfg.checkpoint.dir)
            self.keeps_files_in(self.checkpoint_dir)
            self.next_checkpoint = time.monotonic() + cfg.checkpoint.interval
            self.load_checkpoint()
        for follower in self.followers.values():
            follower.fetch_confirmed()

    def model_layout(self) -> Layout:
        """The names, shapes and dtypes of the model the config builds for the env's spaces:
        every snapshot has them."""
        from zrl.nets.wire import model_to_arrays

        probe = self.make_envs(num_envs=1)  # only for the spaces
        spaces = (probe.single_observation_space, probe.single_action_space)
        probe.close()
        return layout_of(model_to_arrays(self.make_model(*spaces)))

    def planned_actor(self, row: dict) -> bool:
        """Whether a STATUS row is an actor the config plans (they report results)."""
        return is_planned(row, "actor", self.config.roles.count("actors"))

    # --- snapshots ------------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Freeze each learning player's newest weights when the league's rule says so, and
        reset an exploiter when it says so."""
        for player, follower in self.followers.items():
            if follower.version and not self.reset_pending(player):
                self.snapshot(player, follower)

    def snapshot(self, player: str, follower: LatestArrays) -> None:
        reason = self.league.snapshot_reason(player)
        if reason is None:
            return
        # The weights frozen are params' own answer, never what the bus carried.
        if follower.confirmed != follower.version or not follower.arrays:
            if not follower.fetch_confirmed() or self.reset_pending(player):
                return
        win_rate = self.league.win_rate(player)
        name = self.league.add_snapshot(follower.confirmed, player)
        if name in self.snapshots:
            return  # the weights did not move since: only the clock restarted, no reset
        self.snapshots[name] = follower.arrays
        self.log.info(
            "snapshot %s (%s: %s's win rate %.2f, Elo %.0f); %d in the league",
            name,
            reason,
            player,
            win_rate,
            self.league.elo.rating(player),
            len(self.league.snapshots),
        )
        for evicted in set(self.snapshots) - set(self.league.snapshots):
            del self.snapshots[evicted]
        if self.league.reset_after_snapshot(player):
            self.log.info(
                "%s restarts from its initial weights (reset %d)",
                player,
                self.league.resets[player],
            )
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
            connected = self.connect_identified("params", self.rpc_keys, sndhwm=16)
            if connected is None:
                return
            self.params = connected[0]
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
        for ident, msg in self.actors.unpark():
            try:
                self.on_request(ident, msg)
            except P.ProtocolError as exc:
                self.rpc.drop(msg.sender or "?", str(exc))

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.MATCH:
            count = M.match_count(msg.meta)
            player = self.player(msg.meta)
            opponents = [self.league.choose_opponent(player) for _ in range(count)]
            self.matches_served += count
            self.reply(ident, P.Message(P.MATCHES, meta={"opponents": opponents}))
        elif msg.kind == P.RESULTS:
            player = self.player(msg.meta)
            results = M.league_results(msg.meta)
            peer = self.actors.identify(ident)
            if peer is None and self.actors.deferred:
                oldest = self.actors.park(ident, msg)
                if oldest is not None:
                    self.results_refused += 1
                    self.rpc.drop(oldest.sender or "?", "results refused: too many waiting")
                return
            if peer is None or not may_send(msg.kind, peer.role, "rpc:league"):
                self.results_refused += 1
                raise P.ProtocolError("results from a connection no planned actor vouches for")
            for opponent, outcome in results:
                self.league.record(opponent, outcome, player=player)
        elif msg.kind == P.GET_SNAPSHOT:
            name = M.member_name(msg.meta.get("id"))
            arrays = self.snapshots.get(name)
            if arrays is None:
                self.reply(ident, P.Message(P.NO_WEIGHTS, meta={"id": name}))
            else:
                meta = {"id": name, "version": snapshot_version(name)}
                self.reply(ident, P.Message(P.WEIGHTS, meta=meta, arrays=arrays))
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
                if param in self.layout:  # not in the model: never loaded
                    self.snapshots.setdefault(name, {})[param] = stored[key]
        for name in list(self.snapshots):
            problem = layout_problem(self.snapshots[name], self.layout)
            if problem is not None:
                self.log.warning("snapshot %s in %s left out: %s", name, npz, problem)
                del self.snapshots[name]
        self.log.info(
            "resumed the league from %s: %d games, %d snapshots",
            self.checkpoint_dir,
            self.league.games,
            len(self.snapshots),
        )

    def teardown(self) -> None:
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        info = self.league.info()
        self.log.info(
            "%s: %d games (%d self-play), %d snapshots, main's Elo %.0f",
            self.id,
            info["games"],
            info["self_play_games"],
            info["snapshots"],
            info["elo_main"],
        )

    # --- reports --------------------------------------------------------------------------

    def train_info(self) -> dict[str, float]:
        """The league's figures and the Elo ratings of main, the fixed opponents and the
        newest snapshots (metric names are ``[a-z][a-z0-9_]*``: ``main@120`` ->
        ``elo_main_120``)."""
        out = self.league.info()
        for name in self.league.snapshots[-TRACKED_SNAPSHOTS:]:
            out[f"elo_{name.replace('@', '_')}"] = self.league.elo.rating(name)
        return out

    def main_vs_members(self) -> list[str]:
        """The pool members whose win rate the heartbeat's ``main_vs`` gives: the fixed
        opponents, then the newest snapshots, MAIN_VS_MEMBERS in all (the heartbeat is
        bounded)."""
        fixed = self.league.fixed_opponents
        newest = self.league.snapshots[::-1][: max(0, MAIN_VS_MEMBERS - len(fixed))]
        return [*fixed, *newest][:MAIN_VS_MEMBERS]

    def heartbeat_info(self) -> dict[str, Any]:
        info = self.league.info()
        ratings = sorted(self.league.elo.ratings().items(), key=lambda kv: -kv[1])
        out: dict[str, Any] = {
            "games": int(info["games"]),
            "snapshots": int(info["snapshots"]),
            "main_win_rate": round(info["main_win_rate"], 3),
            "elo_main": round(info["elo_main"], 1),
            "elo_top": {name: round(r, 1) for name, r in ratings[:5]},
            # Main's win rate against each pool member (decayed payoff; 0.5: no games yet).
            "main_vs": {
                name: round(self.league.payoff.win_rate(MAIN, name), 3)
                for name in self.main_vs_members()
            },
            "matches_served": self.matches_served,
            "weights_version": self.weights.version,
            "weights_refused": sum(f.refused for f in self.followers.values()),
            "results_refused": self.results_refused,
            "replies_dropped": self.replies_dropped,
            **self.rpc_keys.info(),
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
