"""``Evaluator``: greedy episodes on fresh envs with the latest weights, on a schedule.

It evaluates the config's ``evaluator_policy(index)``: the default policy, or in a population
ranked by evaluations (``pbt.fitness: evaluation``) evaluator i's member ``member_<i>``, whose
weights stream it follows; its heartbeat (``policy``, ``evaluated_version``,
``recent_returns``) is what the ``pbt`` role ranks the members by.

Sockets:

- SUB ``weights`` (``policy/<member>/weights`` for a member) plus one GET_WEIGHTS at start
  (late join).
- PUB ``eval`` (topic bus): one EVAL result per evaluation {weights_version, mean,
  std, min, max, episodes, confirming; a turn-based game's ``<opponent>_{win,draw,loss}_rate``
  per eval opponent, and per seat (``<opponent>_first_win_rate``, ..., ``_second_...``); for
  an algorithm with a search player (``Algorithm.search_player``: alphazero) the same of
  that player as ``search_<opponent>_...``; where the game is small enough
  (``evaluator.exploitability``), ``exploitability``, ``exploitability_first``/``_second`` and
  ``losing_lines`` of the greedy policy (and ``search_exploitability``, ... of the search
  player)}; the supervisor records it and checks the stop rule.

The heartbeat carries the evaluation running now (``evaluating``: its weights version and
how long it has run; the head records one the stop cut short) and the means of the latest
evaluations (``recent_returns``), their
exploitability (``recent_exploitability``) and whether they met ``stop.eval_at_least`` /
``eval_at_most`` (``recent_bounds_met``): the supervisor stops on evaluations only once
the evaluator's own heartbeat, which no other peer can forge, reports them too. With
``stop.confirm: fresh`` an evaluation at the targets (``stop.eval_return``,
``stop.exploitability``, the column bounds) is followed at once by a confirming one of
``stop.eval_episodes`` episodes on new seeds with the same weights (and the exploitability
searched again).

Files (no socket): before it publishes an evaluation, the weights it evaluated go to its
checkpoint directory if that is its best evaluation yet (``<id>.best.pt``) or if it met the
stop rule (``<id>.met-<version>.pt``), for the head's ``model.pt`` and ``model_best.pt``
(``zrl.roles.evaluated_weights``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from zrl.algos.registry import get_algorithm
from zrl.envs.multiagent.envs import TurnBasedVectorEnv, fixed_opponents
from zrl.envs.multiagent.games import board_game
from zrl.envs.multiagent.search import exploitability
from zrl.nets.wire import model_to_arrays
from zrl.roles.base import Role
from zrl.roles.evaluated_weights import EvaluatedKeeper
from zrl.roles.evaluation import (
    exploitability_fields,
    exploitability_game,
    greedy_exploitability,
    greedy_returns,
    outcome_rates,
    seat_outcome_rates,
)
from zrl.roles.weights import WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.utils.runtime import limit_torch_threads

# Means of the latest evaluations in the heartbeat: enough for any sensible stop.eval_window
# even when a few evaluations come between two of the supervisor's status reads.
RECENT_RETURNS = 32


class EvaluationStopped(Exception):
    """The role was asked to stop during an evaluation."""


class Evaluator(Role):
    role = "evaluator"

    def setup(self) -> None:
        limit_torch_threads(1)
        probe = self.make_envs(num_envs=1)
        self.model = self.make_model(probe.single_observation_space, probe.single_action_space)
        # Turn-based games are played against each of the fixed opponents; the first one's
        # mean return is the evaluation's return.
        turn_based = isinstance(probe, TurnBasedVectorEnv)
        self.opponents: list[str | None] = (
            list(self.config.env.multiagent.eval_opponents) if turn_based else [None]
        )
        probe.close()
        self.model.eval()
        # An algorithm that plays with search (alphazero) is evaluated with it too, against
        # the same opponents, beside its greedy policy.
        self.searcher: Any = None
        algorithm = get_algorithm(self.config.algo)
        game = board_game(self.config.env.id.partition("/")[2]) if turn_based else None
        make = algorithm.search_player if algorithm.searches else None
        if make is not None and game is not None:
            self.searcher = make(self.model, self.config, game, self.config.seed + 3)
        # The exploitability of the greedy policy, where the game is small enough to search.
        self.game = exploitability_game(self.config.evaluator.exploitability, self.config.env.id)
        self.policy = self.config.evaluator_policy(self.index or 0)
        self.weights = WeightsFollower(self, self.model, policy=self.policy)
        self.publisher = self.open_publisher(P.EVAL_TOPIC)
        self.evaluated_version = 0
        self.next_eval = time.monotonic()
        self.evaluations = 0
        self.confirmations = 0
        self.last: dict[str, Any] = {}
        self.in_flight: tuple[int, float] | None = None
        """The evaluation running now: (weights version, when it started)."""
        self.recent_returns: list[float] = []
        self.recent_exploitability: list[float | None] = []  # aligned with recent_returns
        self.recent_bounds: list[bool] = []  # stop.eval_at_least/_at_most met, aligned
        self.confirming_return: float | None = None
        self.confirming_exploitability: float | None = None
        self.confirming_bounds: bool | None = None
        self.kept = EvaluatedKeeper(
            self.checkpoint_file, self.config.stop, self.config.broker.max_message_bytes
        )
        self.weights.fetch_latest()

    def step(self) -> None:
        self.weights.update()
        now = time.monotonic()
        # ``==``, not ``<=``: after a params restart from scratch the follower goes back to v1.
        if self.weights.version == self.evaluated_version or now < self.next_eval:
            self.stop_event.wait(0.05)
            return
        self.next_eval = now + self.config.evaluator.interval
        version = self.weights.version
        if not self._evaluate(
            version, self.config.evaluator.episodes, self.config.seed + 1_000_003 + self.evaluations
        ):
            return  # the role is stopping
        self.evaluated_version = version
        self.evaluations += 1
        if self.config.stop.confirm == "fresh" and self._at_target():
            # Far from the seeds of the regular evaluations, which count up by one.
            seed = self.config.seed + 7_000_003 + 100_003 * self.confirmations
            self.confirmations += 1
            self.log.info(
                "weights v%d met the stop rule's targets: confirming on %d fresh episodes",
                version,
                self.config.stop.eval_episodes,
            )
            if not self._evaluate(version, self.config.stop.eval_episodes, seed, confirming=True):
                return
            self.confirming_return = round(self.last["mean"], 2)
            self.confirming_exploitability = self.last.get("exploitability")
            self.confirming_bounds = self.recent_bounds[-1]  # the confirming evaluation's

    def _at_target(self) -> bool:
        """Whether the latest evaluation reaches the stop rule's targets (eval_return,
        exploitability, the column bounds: those set), so that ``confirm: fresh`` confirms
        it."""
        stop, last = self.config.stop, self.last
        if not stop.on_evaluations:
            return False
        if stop.eval_return is not None and last["mean"] < stop.eval_return:
            return False
        if stop.has_bounds and not stop.bounds_met(last):
            return False
        found = last.get("exploitability")
        return stop.exploitability is None or (found is not None and found <= stop.exploitability)

    def make_eval_envs(self, num_envs: int, opponent: str | None = None, seed: int = 0) -> Any:
        """Envs for evaluation: Atari games whole (no episodic life) and unclipped rewards,
        so the returns are true game scores; a turn-based game against ``opponent``, whose
        random draws follow ``seed`` (the evaluation's)."""
        envs = self.make_envs(num_envs, evaluation=True)
        if opponent is not None:
            envs.opponents = fixed_opponents(envs, opponent, seed=seed)
            envs.opponents.between_searches = self.tick_or_stop  # through long searches
        return envs

    def tick_or_stop(self) -> None:
        """Heartbeat within an evaluation, and end it once the role is asked to stop: a
        connect four evaluation with search runs for minutes, longer than a stop waits."""
        self.tick()
        if self.stop_event.is_set():
            raise EvaluationStopped

    def _evaluate(self, version: int, episodes: int, seed: int, confirming: bool = False) -> bool:
        """Evaluate weights ``version``; False when the role's stop cut it short (then
        nothing of it is recorded; the head has its heartbeat's ``evaluating``)."""
        self.in_flight = (version, time.monotonic())
        try:
            self._run_evaluation(version, episodes, seed, confirming)
        except EvaluationStopped:
            self.log.info("evaluation of weights v%d cut short by the stop", version)
            return False
        finally:
            self.in_flight = None
        return True

    def _run_evaluation(self, version: int, episodes: int, seed: int, confirming: bool) -> None:
        started = time.monotonic()
        against: dict[str, float] = {}
        with torch.no_grad():
            for i, opponent in enumerate(self.opponents):

                def make_envs(n: int, opponent: str | None = opponent) -> Any:
                    return self.make_eval_envs(n, opponent, seed)

                scores = greedy_returns(
                    self.model, make_envs, episodes, seed=seed, on_step=self.tick_or_stop
                )
                if i == 0:
                    returns = scores
                if opponent is not None:
                    rates = {**outcome_rates(scores), **seat_outcome_rates(scores)}
                    against.update({f"{opponent}_{k}": round(v, 4) for k, v in rates.items()})
                if opponent is not None and self.searcher is not None:
                    scores = greedy_returns(
                        self.searcher, make_envs, episodes, seed=seed, on_step=self.tick_or_stop
                    )
                    rates = {**outcome_rates(scores), **seat_outcome_rates(scores)}
                    against.update(
                        {f"search_{opponent}_{k}": round(v, 4) for k, v in rates.items()}
                    )
        self.last = {
            "weights_version": version,
            "mean": float(np.mean(returns)),
            "std": float(np.std(returns)),
            "min": float(np.min(returns)),
            "max": float(np.max(returns)),
            "episodes": len(returns),
            "seconds": round(time.monotonic() - started, 3),
            "confirming": confirming,
            **against,
        }
        if self.game is not None:
            started_search = time.monotonic()
            with torch.no_grad():
                found = greedy_exploitability(self.model, self.game)
            self.last.update(exploitability_fields(found))
            if self.searcher is not None:  # the search player's, which the stop rule ignores
                with torch.no_grad():
                    searched = exploitability(self.game, self.searcher.actions)
                fields = exploitability_fields(searched)
                self.last.update({f"search_{k}": v for k, v in fields.items()})
            self.last["seconds"] = round(time.monotonic() - started, 3)
            self.log.debug(
                "exploitability of v%d: %s in %.2f s",
                version,
                found,
                time.monotonic() - started_search,
            )
        self.recent_returns = [
            *self.recent_returns[-(RECENT_RETURNS - 1) :],
            round(self.last["mean"], 2),
        ]
        self.recent_exploitability = [
            *self.recent_exploitability[-(RECENT_RETURNS - 1) :],
            self.last.get("exploitability"),
        ]
        self.recent_bounds = [
            *self.recent_bounds[-(RECENT_RETURNS - 1) :],
            self.config.stop.bounds_met(self.last),
        ]
        self.log.info(
            "%s of weights v%d: %.1f +- %.1f over %d episodes%s",
            "confirming eval" if confirming else "eval",
            version,
            self.last["mean"],
            self.last["std"],
            len(returns),
            "".join(
                f", {k} {v:.2f}"
                for k, v in against.items()
                if (k.endswith("win_rate") or k.endswith("loss_rate"))
                and "_first_" not in k
                and "_second_" not in k
            )
            + (
                f", exploitability {self.last['exploitability']:g} "
                f"({self.last['losing_lines']} losing lines)"
                if "exploitability" in self.last
                else ""
            ),
        )
        # Before the result goes out: once the head hears of it, the file is there to take.
        self.kept.on_eval(
            version,
            self.last["mean"],
            len(returns),
            confirming,
            lambda: model_to_arrays(self.model),
            self.last.get("exploitability"),
            self.recent_bounds[-1],
        )
        self.publisher.send(
            P.Message(P.METRICS, meta={"kind": "eval", **self.last}),
            topic=P.EVAL_TOPIC,
            block=False,
        )

    def heartbeat_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "evaluations": self.evaluations,
            "weights_version": self.weights.version,
            "evaluated_version": self.evaluated_version,
        }
        if self.policy != M.DEFAULT_POLICY:
            info["policy"] = self.policy
        if self.last:
            info["eval_return"] = round(self.last["mean"], 2)
            info["recent_returns"] = list(self.recent_returns)
            if self.game is not None:
                info["exploitability"] = self.last.get("exploitability")
                info["recent_exploitability"] = list(self.recent_exploitability)
            if self.config.stop.has_bounds:
                info["recent_bounds_met"] = list(self.recent_bounds)
        if self.in_flight is not None:  # the head records it if the run stops meanwhile
            version, started = self.in_flight
            info["evaluating"] = {
                "weights_version": version,
                "for_s": round(time.monotonic() - started, 1),
            }
        if self.confirming_return is not None:
            info["confirming_return"] = self.confirming_return
            if self.game is not None:
                info["confirming_exploitability"] = self.confirming_exploitability
            if self.config.stop.has_bounds:
                info["confirming_bounds_met"] = self.confirming_bounds
        return info
