"""``LeagueRole``: the self-play league (``zrl start league``): the population of the learning
player, its frozen snapshots and the fixed opponents; it picks each actor episode's opponent
and takes the snapshots (the rules are ``zrl.league``).

Sockets:

- ROUTER ``rpc`` (own endpoint, found with LOOKUP "league"): MATCH {count} from an actor ->
  MATCHES {opponents}; RESULTS {opponents, outcomes} from an actor (not answered): the
  payoff table and Elo ratings; GET_SNAPSHOT {id} -> WEIGHTS {id, version} with the
  snapshot's arrays (or NO_WEIGHTS for a name it does not hold).
- SUB ``weights`` (topic bus) plus GET_WEIGHTS at start (``zrl.roles.weights``): the learning
  policy's newest weights, which a snapshot freezes when ``zrl.league.League`` says (main's
  win rate over the snapshots reached ``league.snapshot_win_rate``, or
  ``league.snapshot_interval_s`` passed).

Checkpoint (``<checkpoint.dir>/league.json`` and ``league_snapshots.npz``, written every
``checkpoint.interval`` and on stop, atomically): the payoff, Elo ratings, counters and the
snapshots' weights; a restart resumes them. Results come from actors and are trusted as far
as their form: a peer that can reach the league can bias its payoff (see the README's
security section).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

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


class LatestArrays(WeightsFollower):
    """A weights follower that keeps the newest arrays instead of loading them into a model
    (the league builds no network: it only stores and serves weights)."""

    def __init__(self, role: Role) -> None:
        super().__init__(role)
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

    def bind(self) -> None:
        self.rpc = self.bind_rpc()

    def setup(self) -> None:
        cfg = self.config
        self.league = League(cfg.league, seed=cfg.seed)
        self.weights = LatestArrays(self)
        if cfg.checkpoint.dir:
            self.checkpoint_dir = Path(cfg.checkpoint.dir)
            self.next_checkpoint = time.monotonic() + cfg.checkpoint.interval
            self.load_checkpoint()
        self.weights.fetch_latest()

    # --- snapshots ------------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Freeze the newest weights when the league's rule says so."""
        if not self.weights.arrays:
            return
        reason = self.league.snapshot_reason()
        if reason is None:
            return
        win_rate = self.league.main_win_rate()
        name = self.league.add_snapshot(self.weights.version)
        if name not in self.snapshots:
            self.snapshots[name] = self.weights.arrays
            self.log.info(
                "snapshot %s (%s: main's win rate over the snapshots %.2f, Elo %.0f); %d in the league",
                name, reason, win_rate, self.league.elo.rating(MAIN),
                len(self.league.snapshots),
            )  # fmt: skip
        for evicted in set(self.snapshots) - set(self.league.snapshots):
            del self.snapshots[evicted]

    @property
    def versions(self) -> dict[str, int]:
        """The weights version of every snapshot held (its name records it)."""
        return {name: snapshot_version(name) for name in self.snapshots}

    # --- requests -------------------------------------------------------------------------

    def step(self) -> None:
        self.weights.update()
        self.maybe_snapshot()
        if self.checkpoint_dir is not None and time.monotonic() >= self.next_checkpoint:
            self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
            self.save_checkpoint()
        self.serve_requests(self.rpc, 50)

    def on_request(self, ident: bytes, msg: P.Message) -> None:
        if msg.kind == P.MATCH:
            count = M.match_count(msg.meta)
            opponents = [self.league.choose_opponent() for _ in range(count)]
            self.matches_served += count
            self.rpc.send(
                P.Message(P.MATCHES, meta={"opponents": opponents}), to=ident, block=False
            )
        elif msg.kind == P.RESULTS:
            for opponent, outcome in M.league_results(msg.meta):
                self.league.record(opponent, outcome)
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
        return {
            "games": int(info["games"]),
            "snapshots": int(info["snapshots"]),
            "main_win_rate": round(info["main_win_rate"], 3),
            "elo_main": round(info["elo_main"], 1),
            "elo_top": {name: round(r, 1) for name, r in ratings[:5]},
            "matches_served": self.matches_served,
            "weights_version": self.weights.version,
        }
