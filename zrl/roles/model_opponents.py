"""The opponents an actor's model plays: the learning policy's current weights (``self``),
another learning policy's current weights (``live``: a league's main agent for its main
exploiters), any other weights by name (league snapshots), and the best response to the
learning policy's current greedy policy (``best_response``, tic-tac-toe), besides the fixed
random, scripted and search players.

A model opponent samples its moves from its policy (masked logits), as the learning policy
does while it collects, so self-play meets a varied opponent rather than one deterministic line.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn

from zrl.config.multiagent import BEST_RESPONSE, FIXED_PLAYERS
from zrl.envs.multiagent.opponents import MAX_SOLVED_SQUARES, FixedOpponents, UnknownOpponentError
from zrl.envs.multiagent.search import BestResponse, PerfectPlayer, best_response
from zrl.nets.discrete import greedy_actions, policy_logits, sample_categorical
from zrl.nets.recurrent import is_recurrent
from zrl.nets.wire import load_arrays

BEST_RESPONSE_REFRESH_S = 1.0
"""How often the best response is searched again against the current weights (a search of
tic-tac-toe asks the policy about 200-550 positions in one batch: tens of milliseconds)."""
CACHED_MODELS = 16
"""Snapshot networks an actor keeps loaded (the least recently used one is reloaded with the
next snapshot's weights: a network is built at most this many times)."""


class Matchmaker(Protocol):
    """Where episodes' opponents come from (the league's client in an actor)."""

    def choose(self) -> str: ...

    def finished(self, name: str, outcome: int) -> None: ...

    def weights(self, name: str) -> Mapping[str, np.ndarray] | None:
        """The weights of the snapshot ``name`` (None: not available)."""


@dataclass(eq=False)
class ModelOpponents:
    """``self``, named snapshots and the fixed players; opponents chosen by ``matchmaker``
    (a league) or always ``fixed.opponent``."""

    fixed: FixedOpponents
    model: nn.Module
    build: Callable[[], nn.Module]
    matchmaker: Matchmaker | None = None
    # Other learning policies at their newest weights (a league's main agent, against a
    # main exploiter): models the caller keeps current, never cached here by name.
    live: Callable[[str], nn.Module | None] | None = None
    models: OrderedDict[str, nn.Module] = field(default_factory=OrderedDict, init=False)
    responder: BestResponse | None = field(default=None, init=False)
    responded_at: float = field(default=-float("inf"), init=False)
    perfect: PerfectPlayer | None = field(default=None, init=False)

    def choose(self) -> str:
        return self.fixed.opponent if self.matchmaker is None else self.matchmaker.choose()

    def finished(self, name: str, outcome: int) -> None:
        self.fixed.finished(name, outcome)
        if self.matchmaker is not None:
            self.matchmaker.finished(name, outcome)

    def act(self, name: str, obs: np.ndarray) -> np.ndarray:
        if name in FIXED_PLAYERS:
            return self.fixed.act(name, obs)
        if name == BEST_RESPONSE:
            responder = self.best_response()
            own, _ = self.fixed.space.split(obs)
            rng = self.fixed.rng
            return np.array([responder.action(own[i], rng) for i in range(len(obs))])
        live = None if self.live is None or name == "self" else self.live(name)
        if name == "self":
            model = self.model
        else:
            model = live if live is not None else self.snapshot(name)
        with torch.no_grad():
            logp = torch.log_softmax(policy_logits(model, torch.from_numpy(obs)), dim=1).numpy()
        # Gumbel-max, as the learning policy samples its own moves.
        actions, _ = sample_categorical(logp, self.fixed.rng.gumbel(size=logp.shape))
        return actions

    def best_response(self) -> BestResponse:
        """The best response to ``model``'s greedy policy, searched again when the last search
        is ``BEST_RESPONSE_REFRESH_S`` old (the weights move on in between)."""
        now = time.monotonic()
        if self.responder is not None and now - self.responded_at < BEST_RESPONSE_REFRESH_S:
            return self.responder
        game = self.fixed.game
        if game is None or game.rows * game.cols > MAX_SOLVED_SQUARES:
            raise UnknownOpponentError(
                f"{BEST_RESPONSE}: needs a game small enough to search exhaustively (tic-tac-toe)"
            )
        if is_recurrent(self.model):
            raise UnknownOpponentError(
                f"{BEST_RESPONSE}: the model is recurrent; its moves are no function of the "
                "position"
            )
        if self.perfect is None:  # keeps what it solved across searches
            self.perfect = PerfectPlayer(game)
        model = self.model

        def policy(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return greedy_actions(model, torch.from_numpy(obs)).numpy()

        self.responder = best_response(game, policy, self.perfect)
        self.responded_at = now
        return self.responder

    def snapshot(self, name: str) -> nn.Module:
        """The network of snapshot ``name``, built and loaded on first use."""
        model = self.models.get(name)
        if model is not None:
            self.models.move_to_end(name)
            return model
        arrays = None if self.matchmaker is None else self.matchmaker.weights(name)
        if arrays is None:
            raise KeyError(f"no weights for opponent {name!r}")
        if len(self.models) >= CACHED_MODELS:
            # Reuse the least recently used network: loading weights costs a fraction of
            # building one (a profile of a tic-tac-toe league found rebuilding at 20-28 % of
            # an actor's collection time).
            model = self.models.popitem(last=False)[1]
        else:
            model = self.build()
        load_arrays(model, arrays)
        model.eval()
        self.models[name] = model
        return model
