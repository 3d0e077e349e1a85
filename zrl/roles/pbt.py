"""``PBTRole``: population-based training of PPO (``zrl start pbt``, ``roles.pbt: 1``).

The population is ``pbt.members`` policies ``member_<i>``, each with its own learner and
actors (``ExperimentConfig.policies``). Every ``pbt.ready_interval_s`` the role ranks the
members by their fitness: with ``pbt.fitness: training`` the mean training episode return of
those whose actors have finished ``pbt.min_episodes`` episodes (the mean of their actors'
heartbeat ``episode_return``; an actor's member is the config's ``actor_policy(index)``,
never its heartbeat's word); with ``pbt.fitness: evaluation`` the latest greedy evaluation of
each member by its evaluator (evaluator i evaluates ``member_<i>``, the config's
``evaluator_policy``), counted only once it evaluated weights newer than those the member's
learner held when it confirmed its last exploit. Then, by
``zrl.league.pbt.exploit_pairs``, each member of the bottom ``pbt.exploit_fraction`` copies
one of the top: EXPLOIT, its learner loads the better member's newest checkpoint (weights
and optimizer state, exactly as saved); EXPLORE, its hyperparameters become the better
member's, perturbed or resampled within the bounds (``zrl.league.pbt.explore``). A member
exploited in a round sits out the next one (its fitness is still the old weights').

Sockets:

- DEALER -> the parameter server's rpc (LOOKUP "params"): EXPLOIT {policy (the worse
  member), source (the better one), seq, hyperparameters} (not answered). params keeps the
  newest per member and hands it to that member's learner in the CONTROL it answers that
  learner's GET_CONTROL (``zrl.roles.learner``), which applies it once (``seq`` above the
  one it applied) and publishes its new weights as a new version at once. The DEALER
  connects under a random routing id whose digest the heartbeat shows (``rpc_keys``):
  params takes EXPLOIT only from the planned pbt role's connection; the learner then checks
  the instruction against the config again (``exploit_instruction``).
- throwaway DEALERs -> broker (STATUS of the actors or evaluators and of the learners,
  ``status_rows``).

Record: ``<checkpoint.dir>/pbt-0.csv`` (``checkpoint.dir`` is RUN_DIR/checkpoints under
``zrl run``): one row per exploit (time, member, source, both fitnesses, the hyperparameters
before and after); ``pbt-0.json`` the members' current hyperparameters and the last seq
(a restart goes on from them). The heartbeat and training figures carry each member's
fitness and hyperparameters (``member_<i>_fitness``, ``member_<i>_lr``, ...).
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zrl.config.experiment import ExperimentConfig
from zrl.league.pbt import exploit_pairs, explore
from zrl.roles.base import Role, index_of_id
from zrl.roles.errors import RoleError
from zrl.roles.rpc_identity import ClientKeys, status_rows
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.utils.durable import atomic_write_text

LINEAGE_FIELDS = (
    "time",
    "member",
    "source",
    "member_fitness",
    "source_fitness",
    "old_hyperparameters",
    "new_hyperparameters",
    "seq",
)
"""The columns of ``pbt-0.csv`` (hyperparameters as JSON objects)."""
EXPLOIT_REPEAT_S = 1.0
"""An EXPLOIT a learner has not confirmed (its heartbeat's ``pbt_seq``) goes again this often."""


def short_name(hyperparameter: str) -> str:
    """``learner.lr`` -> ``lr``: the metric name of a hyperparameter."""
    return hyperparameter.rsplit(".", 1)[-1]


def exploit_instruction(meta: Any, cfg: ExperimentConfig) -> dict[str, Any]:
    """An EXPLOIT's meta, checked against the config: ``policy`` and ``source`` two different
    members, ``seq`` an int in [1, 2**53], ``hyperparameters`` the configured ones, each a
    finite float within its bounds. Returns it (its policy among the keys); ProtocolError
    otherwise. Both params (on receipt) and the learner (in the CONTROL) check it."""
    if not isinstance(meta, dict):
        raise P.ProtocolError("exploit instruction is not a map")
    members = cfg.policies if cfg.pbt.members else []
    policy, source, seq = meta.get("policy"), meta.get("source"), meta.get("seq")
    if policy not in members or source not in members or policy == source:
        raise P.ProtocolError(
            f"exploit of {str(policy)[:40]!r} from {str(source)[:40]!r}: not two of {members}"
        )
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= M.MAX_VERSION:
        raise P.ProtocolError(f"exploit seq {str(seq)[:40]!r} is not an int in [1, 2**53]")
    hp = meta.get("hyperparameters")
    bounds = cfg.pbt.hyperparameters
    if not isinstance(hp, dict) or set(hp) != set(bounds):
        raise P.ProtocolError(f"exploit hyperparameters are not {sorted(bounds)}")
    for name, value in hp.items():
        b = bounds[name]
        ok = isinstance(value, float | int) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not b.low <= value <= b.high:
            raise P.ProtocolError(
                f"exploit {name} {str(value)[:40]} is not a number in [{b.low}, {b.high}]"
            )
    return {
        "policy": policy,
        "source": source,
        "seq": seq,
        "hyperparameters": {k: float(v) for k, v in hp.items()},
    }


def planned_infos(rows: list[dict], role: str, planned: int) -> Iterator[tuple[int, dict]]:
    """``(index, heartbeat info)`` of the live STATUS rows of ``role`` whose index the config
    plans (below ``planned``)."""
    for row in rows:
        index = index_of_id(row.get("id"), role)
        info = row.get("info")
        if index is None or index >= planned or row.get("state") in ("dead", "stopped"):
            continue
        if isinstance(info, dict):
            yield index, info


def member_fitness(rows: list[dict], cfg: ExperimentConfig, min_episodes: int) -> dict[str, float]:
    """Each member's fitness from the actors' STATUS rows: the mean ``episode_return`` of its
    live planned actors (by the config's ``actor_policy`` of the row's index), for members
    whose actors finished ``min_episodes`` episodes together."""
    returns: dict[str, list[float]] = {}
    episodes: dict[str, int] = {}
    for index, info in planned_infos(rows, "actor", max(1, cfg.roles.count("actors"))):
        member = cfg.actor_policy(index)
        ret, count = info.get("episode_return"), info.get("episodes")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            episodes[member] = episodes.get(member, 0) + count
        if isinstance(ret, int | float) and not isinstance(ret, bool) and math.isfinite(ret):
            returns.setdefault(member, []).append(float(ret))
    return {
        m: sum(r) / len(r) for m, r in returns.items() if r and episodes.get(m, 0) >= min_episodes
    }


def evaluated_fitness(
    rows: list[dict], cfg: ExperimentConfig, floors: dict[str, int]
) -> dict[str, float]:
    """Each member's fitness from the evaluators' STATUS rows (``pbt.fitness: evaluation``):
    the mean return of its live planned evaluator's latest evaluation (the member by the
    config's ``evaluator_policy`` of the row's index), for members whose evaluator evaluated a
    weights version above ``floors[member]`` (the version its learner held when it confirmed
    its last exploit: older weights are not the member's now)."""
    out: dict[str, float] = {}
    for index, info in planned_infos(rows, "evaluator", cfg.roles.count("evaluator")):
        member = cfg.evaluator_policy(index)
        ret, version = info.get("eval_return"), info.get("evaluated_version")
        if not isinstance(version, int) or isinstance(version, bool):
            continue
        if version <= floors.get(member, 0):
            continue
        if isinstance(ret, int | float) and not isinstance(ret, bool) and math.isfinite(ret):
            out[member] = float(ret)
    return out


class PBTRole(Role):
    role = "pbt"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.params: Any = None  # DEALER to params for EXPLOIT, opened on the first one
        self.rpc_keys = ClientKeys()
        self.rng = random.Random()
        self.hyperparameters: dict[str, dict[str, float]] = {}
        self.fitness: dict[str, float] = {}
        self.seq = 0
        self.exploits = 0
        self.rounds = 0
        self.next_round = 0.0
        self.next_send = 0.0
        self.sat_out: set[str] = set()  # exploited last round: not ranked this one
        self.pending: dict[str, dict[str, Any]] = {}  # member -> EXPLOIT not yet confirmed
        self.floors: dict[str, int] = {}
        """``pbt.fitness: evaluation``: per member, the weights version its learner held when
        it confirmed its last exploit; only evaluations of newer weights rank it."""
        self.state_path: Path | None = None
        self.lineage_path: Path | None = None

    def setup(self) -> None:
        cfg = self.config
        if not cfg.pbt.members:
            raise RoleError("the pbt role needs pbt.members >= 2 in the config")
        self.rng = random.Random(cfg.seed * 1_000_003 + 17)
        start = {name: cfg.hyperparameter(name) for name in cfg.pbt.hyperparameters}
        self.hyperparameters = {m: dict(start) for m in cfg.policies}
        self.state_path = self.checkpoint_file(".json")
        self.lineage_path = self.checkpoint_file(".csv")
        self.load_state()
        self.next_round = time.monotonic() + cfg.pbt.ready_interval_s

    # --- state -----------------------------------------------------------------------------

    def load_state(self) -> None:
        """Resume the members' hyperparameters and the seq from ``pbt-0.json`` if there is one
        (values outside the bounds or for other members are ignored)."""
        if self.state_path is None or not self.state_path.is_file():
            return
        try:
            state = json.loads(self.state_path.read_text())
            self.seq = int(state["seq"])
            for member, hp in state["hyperparameters"].items():
                if member in self.hyperparameters:
                    for name, b in self.config.pbt.hyperparameters.items():
                        value = float(hp[name])
                        if b.low <= value <= b.high:
                            self.hyperparameters[member][name] = value
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RoleError(f"{self.state_path} is not a pbt state ({exc}); move it away") from None
        self.log.info("resumed PBT from %s: seq %d", self.state_path, self.seq)

    def save_state(self) -> None:
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        state = {"seq": self.seq, "hyperparameters": self.hyperparameters}
        atomic_write_text(self.state_path, json.dumps(state, indent=1))

    def record(self, row: dict[str, Any]) -> None:
        """One exploit to the lineage CSV (header first)."""
        if self.lineage_path is None:
            return
        self.lineage_path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.lineage_path.is_file()
        with self.lineage_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=LINEAGE_FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(row)

    # --- rounds ----------------------------------------------------------------------------

    def step(self) -> None:
        now = time.monotonic()
        if now >= self.next_round:
            self.next_round = now + self.config.pbt.ready_interval_s
            self.run_round()
        if self.pending and now >= self.next_send:
            self.next_send = now + EXPLOIT_REPEAT_S
            self.confirm_and_resend()
        self.stop_event.wait(0.05)

    def run_round(self) -> None:
        """Rank the members with enough episodes (not those exploited last round) and send an
        EXPLOIT for each pair of ``exploit_pairs`` whose source has a checkpoint."""
        cfg = self.config
        learners = self.learner_infos()
        if cfg.pbt.fitness == "evaluation":
            rows = status_rows(self.ctx, self.broker, self.keys, ("evaluator",))
            self.fitness = evaluated_fitness(rows, cfg, self.floors)
        else:
            rows = status_rows(self.ctx, self.broker, self.keys, ("actor",))
            self.fitness = member_fitness(rows, cfg, cfg.pbt.min_episodes)
        self.rounds += 1
        ranked = {m: f for m, f in self.fitness.items() if m not in self.sat_out}
        self.sat_out = set()
        for worse, better in exploit_pairs(ranked, cfg.pbt.exploit_fraction, self.rng):
            if int(learners.get(better, {}).get("checkpoints", 0) or 0) < 1:
                self.log.info("%s has no checkpoint yet: %s keeps its weights", better, worse)
                continue
            self.exploit(worse, better)
        self.save_state()

    def learner_infos(self) -> dict[str, dict[str, Any]]:
        """Each member's learner heartbeat info (by the config's ``learner_policy`` of the
        row's index): its first learner's, the one that hears exploits and publishes (a DD-PPO
        group's learner 0)."""
        out: dict[str, dict[str, Any]] = {}
        for row in status_rows(self.ctx, self.broker, self.keys, ("learner",)):
            index = index_of_id(row.get("id"), "learner")
            info = row.get("info")
            if index is None or index >= self.config.roles.learners or not isinstance(info, dict):
                continue
            if self.config.learner_rank(index) != 0:
                continue
            out[self.config.learner_policy(index)] = info
        return out

    def exploit(self, worse: str, better: str) -> None:
        """Decide ``worse``'s new hyperparameters, record the lineage and send the EXPLOIT."""
        pbt = self.config.pbt
        bounds = {k: (b.low, b.high) for k, b in pbt.hyperparameters.items()}
        old = dict(self.hyperparameters[worse])
        new = explore(
            self.hyperparameters[better], bounds, pbt.perturb, pbt.resample_probability, self.rng
        )
        self.seq += 1
        self.hyperparameters[worse] = new
        instruction = {"policy": worse, "source": better, "seq": self.seq, "hyperparameters": new}
        self.pending[worse] = instruction
        self.sat_out.add(worse)
        self.exploits += 1
        self.record(
            {
                "time": round(time.time(), 3),
                "member": worse,
                "source": better,
                "member_fitness": round(self.fitness[worse], 4),
                "source_fitness": round(self.fitness[better], 4),
                "old_hyperparameters": json.dumps(old),
                "new_hyperparameters": json.dumps(new),
                "seq": self.seq,
            }
        )
        self.log.info(
            "exploit: %s (%.2f) <- %s (%.2f); %s -> %s",
            worse,
            self.fitness[worse],
            better,
            self.fitness[better],
            old,
            new,
        )
        self.send(instruction)

    def confirm_and_resend(self) -> None:
        """Drop the instructions the learners confirmed (heartbeat ``pbt_seq``); send the rest
        again (params or the learner may have restarted)."""
        learners = self.learner_infos()
        for member, instruction in list(self.pending.items()):
            info = learners.get(member, {})
            applied = info.get("pbt_seq")
            if isinstance(applied, int) and applied >= instruction["seq"]:
                del self.pending[member]
                version = info.get("weights_version")
                if isinstance(version, int) and not isinstance(version, bool):
                    self.floors[member] = version
            else:
                self.send(instruction)

    def send(self, instruction: dict[str, Any]) -> None:
        if self.params is None:
            connected = self.connect_identified("params", self.rpc_keys, sndhwm=16)
            if connected is None:
                return
            self.params = connected[0]
        meta = {**instruction, **M.policy_meta(instruction["policy"])}
        self.params.send(P.Message(P.EXPLOIT, meta=meta), block=False)

    def teardown(self) -> None:
        self.save_state()

    # --- reports ---------------------------------------------------------------------------

    def train_info(self) -> dict[str, float]:
        out: dict[str, float] = {"exploits": float(self.exploits)}
        for member, hp in self.hyperparameters.items():
            for name, value in hp.items():
                out[f"{member}_{short_name(name)}"] = value
            if member in self.fitness:
                out[f"{member}_fitness"] = self.fitness[member]
        return out

    def heartbeat_info(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "exploits": self.exploits,
            "pending": sorted(self.pending),
            "members": {
                m: {
                    **{short_name(k): float(f"{v:.4g}") for k, v in hp.items()},
                    **({"fitness": round(self.fitness[m], 2)} if m in self.fitness else {}),
                }
                for m, hp in self.hyperparameters.items()
            },
            **self.rpc_keys.info(),
        }
