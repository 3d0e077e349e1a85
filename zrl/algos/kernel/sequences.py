"""Cutting each env's stream of steps into R2D2's fixed-length sequences, on the actor (R2D2's,
and recurrent QMIX's team sequences).

Sequences are ``L`` steps (``r2d2.sequence_length``) and start every ``L - burn_in`` steps,
so neighbours overlap by ``burn_in`` and the trained parts (the steps after the burn-in)
tile every episode exactly once. They never cross an episode boundary:

- the first sequence of an episode starts ``burn_in`` steps before it, padded in front: its
  burn-in is padding (``mask`` False), the state is zeroed at the episode's first step
  (``first``), and its trained part starts at that step;
- at an episode's end the sequence under way is padded at its end, and sent only if it holds
  steps no earlier sequence trained on.

Each sequence carries ``L + 1`` observations: the last is the observation after its last
step (the next step's, or the episode's final observation), from which n-step targets
bootstrap, and the recurrent state the actor had before its position 0 (zeros when that is
padding). Steps arrive one trajectory at a time; a sequence is complete only when the step
after it arrives, so each env keeps the steps of its sequences under way between trajectories.
On frame stacks a sequence travels with each of its frames once (:meth:`Sequences.arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zrl.codecs.frames import frames_of


@dataclass
class Sequences:
    """``N`` sequences of ``L`` steps (the SEQUENCES message's arrays, and the actor's Q-values
    ``q [N, L + 1, A]`` for the initial priorities, which are not sent)."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    mask: np.ndarray
    first: np.ndarray
    state: np.ndarray
    q: np.ndarray
    weights_version: np.ndarray
    """``[N]`` int64: the oldest weights version that acted in each sequence's real steps."""

    def __len__(self) -> int:
        return len(self.action)

    def arrays(self, priority: np.ndarray, frames: bool = False) -> dict[str, np.ndarray]:
        """The arrays of a ``sequences`` TRAJECTORY; ``frames`` (uint8 frame stacks): of a
        ``frame_sequences`` one, each sequence's ``obs [L + 1, k, H, W]`` sent as its
        ``frames [L + k, H, W]`` (``zrl.codecs.frames.frames_of``; the frames of the burn-in
        overlap go in both sequences that hold it)."""
        if frames:
            arrays = self.arrays(priority)
            del arrays["obs"]
            return {"frames": frames_of(self.obs[:, :-1], self.obs[:, -1]), **arrays}
        return {
            "obs": self.obs,
            "action": self.action,
            "reward": self.reward,
            "terminated": self.terminated,
            "mask": self.mask,
            "first": self.first,
            "state": self.state,
            "priority": priority.astype(np.float32),
            "weights_version": self.weights_version,
        }


@dataclass
class _Step:
    obs: np.ndarray
    action: int
    reward: float
    terminated: bool
    state: np.ndarray
    q: np.ndarray
    version: int  # the weights version that acted


@dataclass
class _Episode:
    """One env's episode under way: the steps from ``offset`` on (the earlier ones are in
    sequences already sent) and the episode step where the next sequence starts."""

    start: int
    offset: int = 0
    steps: list[_Step] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.offset + len(self.steps)


class SequenceCutter:
    def __init__(
        self,
        num_envs: int,
        length: int,
        burn_in: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        state_size: int,
        num_actions: int,
    ) -> None:
        if not 0 <= burn_in < length:
            raise ValueError(f"burn_in must be in [0, sequence_length), got {burn_in}, {length}")
        self.length, self.burn_in, self.period = length, burn_in, length - burn_in
        self.obs_shape, self.obs_dtype = obs_shape, np.dtype(obs_dtype)
        self.state_size, self.num_actions = state_size, num_actions
        self.episodes: list[_Episode | None] = [None] * num_envs
        self.discarded = 0
        """Episodes dropped unfinished (all envs were reset after an env error)."""

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        valid: np.ndarray,
        first: np.ndarray,
        state: np.ndarray,
        q: np.ndarray,
        version: int = 0,
    ) -> Sequences:
        """The steps of one trajectory, ``[E, T, ...]`` as the actor recorded them (``first``:
        the policy zeroed the state before this step; ``state``: the state before each step;
        ``q``: the Q-values it acted on; ``version``: the weights version that acted) -> the
        sequences they completed."""
        built: list[dict[str, np.ndarray]] = []
        E, T = valid.shape
        for e in range(E):
            for t in range(T):
                episode = self.episodes[e]
                if first[e, t]:
                    if episode is not None and episode.steps:
                        self.discarded += 1  # restarted without an end: no final observation
                    episode = self.episodes[e] = _Episode(start=-self.burn_in)
                if not valid[e, t]:
                    # This step only reset the env: its observation is the final one of the
                    # episode that ended at the step before.
                    if episode is not None:
                        if episode.length > episode.start + self.burn_in:
                            built.append(self.build(episode, obs[e, t], q[e, t], end=True))
                        self.episodes[e] = None
                    continue
                if episode is None:
                    continue  # the rest of an episode whose start this cutter never saw
                if episode.length == episode.start + self.length:
                    built.append(self.build(episode, obs[e, t], q[e, t], end=False))
                    episode.start += self.period
                    drop = max(0, episode.start - episode.offset)
                    del episode.steps[:drop]
                    episode.offset += drop
                episode.steps.append(
                    _Step(
                        obs[e, t],
                        int(action[e, t]),
                        float(reward[e, t]),
                        bool(terminated[e, t]),
                        state[e, t],
                        q[e, t],
                        version,
                    )
                )
        return self.stack(built)

    def build(
        self, episode: _Episode, next_obs: np.ndarray, next_q: np.ndarray, end: bool
    ) -> dict[str, np.ndarray]:
        """The sequence starting at episode step ``episode.start``, followed by ``next_obs``
        (the next step's observation, or the final one at an episode's ``end``)."""
        L = self.length
        seq = {
            "obs": np.zeros((L + 1, *self.obs_shape), self.obs_dtype),
            "action": np.zeros(L, np.int64),
            "reward": np.zeros(L, np.float32),
            "terminated": np.zeros(L, bool),
            "mask": np.zeros(L, bool),
            "first": np.zeros(L + 1, bool),
            "state": np.zeros(self.state_size, np.float32),
            "q": np.zeros((L + 1, self.num_actions), np.float32),
        }
        versions = []
        for j in range(L):
            i = episode.start + j  # the episode step at position j
            if i < 0:
                continue
            if i >= episode.length:
                break
            step = episode.steps[i - episode.offset]
            seq["obs"][j], seq["q"][j] = step.obs, step.q
            seq["action"][j], seq["reward"][j] = step.action, step.reward
            seq["terminated"][j], seq["mask"][j] = step.terminated, True
            seq["first"][j] = i == 0
            versions.append(step.version)
        # The oldest policy in it: its lag is what the oldest of its steps saw.
        seq["weights_version"] = np.array(min(versions), np.int64)
        last = min(L, episode.length - episode.start)  # the position after the last real step
        seq["obs"][last], seq["q"][last] = next_obs, next_q
        if episode.start >= 0:
            seq["state"][:] = episode.steps[episode.start - episode.offset].state
        return seq

    def stack(self, built: list[dict[str, np.ndarray]]) -> Sequences:
        L, n = self.length, len(built)
        if n == 0:
            return Sequences(
                obs=np.zeros((0, L + 1, *self.obs_shape), self.obs_dtype),
                action=np.zeros((0, L), np.int64),
                reward=np.zeros((0, L), np.float32),
                terminated=np.zeros((0, L), bool),
                mask=np.zeros((0, L), bool),
                first=np.zeros((0, L + 1), bool),
                state=np.zeros((0, self.state_size), np.float32),
                q=np.zeros((0, L + 1, self.num_actions), np.float32),
                weights_version=np.zeros(0, np.int64),
            )
        return Sequences(**{k: np.stack([s[k] for s in built]) for k in built[0]})
