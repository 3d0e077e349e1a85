"""Which rollouts form a PPO round (``RoundBuffer``), and the round's samples (``round_tensors``,
or ``recurrent_round_tensors`` for a recurrent actor-critic).

Rollouts of frame stacks (``frame_unroll``: each frame once) become the round of their
stacks, rebuilt by ``round_tensors(..., frames=True)`` before the values and GAE.

A round is one rollout per actor (``roles.actors``). Sync mode: every rollout in a round was
collected with the same weights version (the one the round trains); actors wait for the next
version before collecting again. Async mode: rollouts up to ``ppo.max_lag`` versions old are
used, older ones dropped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from zrl.algos.kernel.returns import rollout_gae
from zrl.algos.kernel.unrolls import unroll_outputs
from zrl.algos.kernel.value_normalizer import ValueNormalizer
from zrl.codecs.frames import stacks_from_frames
from zrl.nets.discrete import ActorCritic
from zrl.nets.gaussian import GaussianActorCritic
from zrl.nets.recurrent import RecurrentActorCritic
from zrl.transport.messages import RECURRENT_UNROLL, experience_schema


@dataclass
class Rollout:
    version: int
    actor: int
    arrays: dict[str, np.ndarray]
    received: float = field(default_factory=time.monotonic)


class RoundBuffer:
    """Rollouts waiting to become a training round.

    sync: rollouts are grouped by weights version; a round is ``round_size`` rollouts of one
    version newer than the last round trained. A rollout of a version already trained (or
    superseded by a newer round) is stale and dropped. If a round stays incomplete for
    ``round_timeout`` seconds (an actor died) it is trained short rather than never.

    async: a round is the first ``round_size`` rollouts at most ``max_lag`` versions behind
    the learner's current version; older rollouts are dropped.
    """

    def __init__(self, mode: str, round_size: int, max_lag: int, round_timeout: float) -> None:
        self.mode = mode
        self.round_size = round_size
        self.max_lag = max_lag
        self.round_timeout = round_timeout
        self.pending: list[Rollout] = []
        self.trained_version = 0  # sync: newest version a round was trained on
        self.stale = 0
        self.short_rounds = 0

    def add(self, rollout: Rollout, current_version: int) -> bool:
        """Keep ``rollout`` if it can still be used; False (and counted) if it is stale."""
        if self._is_stale(rollout.version, current_version):
            self.stale += 1
            return False
        self.pending.append(rollout)
        return True

    def _is_stale(self, version: int, current_version: int) -> bool:
        if self.mode == "sync":
            return version <= self.trained_version
        return current_version - version > self.max_lag

    def take(self, current_version: int, now: float | None = None) -> list[Rollout] | None:
        """The next round, or None while it is not complete."""
        now = time.monotonic() if now is None else now
        before = len(self.pending)
        self.pending = [r for r in self.pending if not self._is_stale(r.version, current_version)]
        self.stale += before - len(self.pending)
        if not self.pending:
            return None
        if self.mode == "async":
            if len(self.pending) < self.round_size:
                return None
            chosen, self.pending = self.pending[: self.round_size], self.pending[self.round_size :]
            return chosen
        newest = max(r.version for r in self.pending)
        chosen = [r for r in self.pending if r.version == newest][: self.round_size]
        waited = now - min(r.received for r in chosen)
        if len(chosen) < self.round_size and waited < self.round_timeout:
            return None
        if len(chosen) < self.round_size:
            self.short_rounds += 1
        self.trained_version = newest
        kept = [r for r in self.pending if r.version > newest]
        # Older versions and extras of this one are superseded: counted, never trained on.
        self.stale += len(self.pending) - len(chosen) - len(kept)
        self.pending = kept
        return sorted(chosen, key=lambda r: r.actor)


def round_tensors(
    model: ActorCritic | GaussianActorCritic,
    rollouts: list[Rollout],
    gamma: float,
    lam: float,
    *,
    frames: bool = False,
    value_normalizer: ValueNormalizer | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """The valid samples of a round, flattened, with old values, GAE advantages and returns
    computed with the current weights (the behaviour weights, in sync mode).

    ``frames``: the rollouts are ``frame_unroll``s (the learner's layout, taken from the
    observation space at setup); their ``obs`` and ``bootstrap_obs`` stacks are rebuilt from
    ``frames [E, T + k, H, W]`` first (``zrl.codecs.frames.stacks_from_frames``, zero padding
    before an episode's first frame, as zrl's Atari envs stack).

    Box actions (``continuous_unroll`` rollouts) keep their action dim: ``action [N, A]``.
    With a ``value_normalizer`` the model's values are normalized ones: GAE runs on them
    denormalized; ``value`` stays as the head gave it and ``return`` is raw.

    On ``device`` (the model's: a GPU learner's) the observations go there once, the values
    come back for GAE (on the host), and every tensor of the round is returned there."""
    device = torch.device(device)
    schema = experience_schema("unroll", frames=frames)
    # A game played from both seats adds passes (TURN_UNROLL): GAE negates across them.
    keys = [*schema.arrays, *(["passes"] if "passes" in rollouts[0].arrays else [])]
    cat = {k: np.concatenate([r.arrays[k] for r in rollouts]) for k in keys}
    E, T = cat["reward"].shape
    if frames:
        stacks, last = stacks_from_frames(
            torch.from_numpy(cat["frames"]).to(device), torch.from_numpy(cat["valid"]).to(device)
        )
    else:
        stacks = torch.from_numpy(cat["obs"]).to(device)
        last = torch.from_numpy(cat["bootstrap_obs"]).to(device)
    with torch.no_grad():
        obs = stacks.reshape(E * T, *stacks.shape[2:])
        head_values = model.value(obs).reshape(E, T)
        head_bootstrap = model.value(last)
        raw_values, raw_bootstrap = head_values, head_bootstrap
        if value_normalizer is not None:
            raw_values = value_normalizer.denormalize(head_values)
            raw_bootstrap = value_normalizer.denormalize(head_bootstrap)
    values = head_values.cpu().numpy()
    bootstrap = raw_bootstrap.cpu().numpy()
    advantages, returns = rollout_gae(
        cat["reward"],
        raw_values.cpu().numpy(),
        cat["terminated"],
        cat["truncated"],
        cat["valid"],
        bootstrap,
        gamma,
        lam,
        passes=cat.get("passes"),
    )
    valid = cat["valid"].reshape(-1)
    host = {
        "action": cat["action"].reshape(E * T, *cat["action"].shape[2:])[valid],
        "logp": cat["logp"].reshape(-1)[valid],
        "value": values.reshape(-1)[valid].astype(np.float32),
        "advantage": advantages.reshape(-1)[valid],
        "return": returns.reshape(-1)[valid],
    }
    out = {k: torch.from_numpy(v).to(device) for k, v in host.items()}
    return {"obs": obs[torch.from_numpy(valid).to(device)], **out}


def recurrent_round_tensors(
    model: RecurrentActorCritic,
    rollouts: list[Rollout],
    gamma: float,
    lam: float,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """The env rows of a round, ``[N, T, ...]`` (N: the rollouts' envs), for a recurrent
    actor-critic: each row keeps its recorded ``state [N, S]`` and resets ``first [N, T]`` so
    the core can be unrolled over it again, and ``valid [N, T]`` marks the steps that enter
    the loss (the reset-only steps stay in the rows: the core steps through them).

    Old values come from ``model.unroll`` from the recorded states with the current weights
    (the actors' values, in sync mode; ``zrl.algos.kernel.unrolls.unroll_outputs``, as IMPALA's and
    APPO's learners). The bootstrap value is one more ``step`` on
    ``bootstrap_obs`` from the state after the last step, zeroed where that step only reset
    the env (``valid[:, -1]`` False): the actor starts an episode at that observation, and
    its next rollout says so in ``first[:, 0]`` (GAE does not use the bootstrap after an
    invalid step, but it stays the value the actor computes). GAE as for feed-forward rounds,
    on the host; every tensor of the round on ``device`` (the model's)."""
    cat = {k: np.concatenate([r.arrays[k] for r in rollouts]) for k in RECURRENT_UNROLL.arrays}
    rows = {k: torch.from_numpy(v).to(device) for k, v in cat.items()}
    obs, state, first = rows["obs"], rows["state"], rows["first"]
    with torch.no_grad():
        _, values, bootstrap = unroll_outputs(model, rows)
    advantages, returns = rollout_gae(
        cat["reward"],
        values.cpu().numpy(),
        cat["terminated"],
        cat["truncated"],
        cat["valid"],
        bootstrap.cpu().numpy(),
        gamma,
        lam,
    )
    return {
        "obs": obs,
        "state": state,
        "first": first,
        "valid": rows["valid"],
        "action": rows["action"],
        "logp": rows["logp"],
        "value": values,
        "advantage": torch.from_numpy(advantages).to(device),
        "return": torch.from_numpy(returns).to(device),
    }
