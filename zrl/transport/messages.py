"""Every zrl message kind: who sends it to whom, on which socket, its metadata and arrays.

This docstring is the contract; ``docs/protocol.md`` section 4 says the same at more length.
Framing and the checks every message passes are in :mod:`zrl.transport.protocol`; the array
schemas of the data kinds are the :class:`Schema` constants below, checked by
:func:`zrl.transport.schema.validate`; the experience ones are three items (transitions,
unrolls, sequences) in the variants of a few options, :func:`experience_schema`. Dims:
``E`` envs, ``T`` time steps, ``O`` observation shape (all trailing axes), ``A`` action width
(continuous), ``B`` batch rows, ``N`` updated keys, ``S`` stored frames, ``P`` a sequence's
observation positions (its steps + 1), ``R`` the recurrent state's width. "Registry" is the
broker's ROUTER (roles talk to it through a DEALER); streams pass the broker's PULL/PUSH
devices, topics its XSUB/XPUB bus; rpc goes straight to a server's own ROUTER (found with
LOOKUP).

Registry (role DEALER <-> broker ROUTER):

- ``hello``: role -> broker. Meta ``role`` str, ``id`` str|None (the id to keep),
  ``index`` int|None, ``host`` str, ``pid`` int, ``rpc`` str (own rpc endpoint or ""),
  ``instance`` str (random, per role object: HELLOs it repeats get one id), ``agent`` str|None
  (the host agent that started it), ``zrl_version`` str. No arrays.
- ``welcome``: broker -> role. Meta ``id``, ``spec`` (resolved config or None),
  ``endpoints`` (name -> address), ``ipc_endpoints`` (the same names on ipc://, empty
  unless a tcp broker has ``broker.ipc``), ``host`` (the broker's ``hostname`` and
  ``boot_id``: a role with the same pair may use the ipc ones), ``streams``, ``heartbeat_interval``,
  ``heartbeat_timeout``, ``max_message_bytes``, ``max_topic_message_bytes``, ``zrl_version``,
  ``broker_started``, ``secure`` bool, ``factories`` (references), ``agent`` (the host agent
  that heartbeats for the role, or None: the registry decides). Array ``factories``
  (pickled factories, uint8 ``[bytes]``) only when the factories need pickling.
- ``refused``: broker -> role. Meta ``reason`` str; ``protocol`` int on a protocol version
  mismatch; ``stopped`` true when the experiment has stopped (the role ends cleanly). No
  arrays.
- ``heartbeat``: role -> broker, or a role registered under a host agent -> the agent's ipc
  ROUTER. Meta ``id``, ``seq`` (counts up from 1 per role: the ack echoes it), ``state``,
  ``loop`` (the turns of the role's loop so far), ``stats`` (channel counters), ``info`` (the
  role's figures); one from the role's heartbeat thread (its loop held) has ``id``, ``seq``,
  ``state`` and ``loop`` alone;
  a host agent's own adds ``roles`` (at most ``MAX_REPORTED_ROLES`` reports ``{id, state,
  loop, stats, info}`` or ``{id, state, loop}``, for the roles registered under it). No
  arrays.
- ``heartbeat_ack``: broker -> role (agent -> its role). Meta ``seq``: the heartbeat's (a
  positive int, echoed only when it is one); ``stop`` str (why) once the head
  has stopped the experiment: the role stops; ``unknown`` (to an agent's ``roles``): the ids
  not taken. No arrays.
- ``unknown_role``: broker -> role (a heartbeat from an id it does not know), agent -> its
  role (an id in the broker's ``unknown``). Meta ``id``.
- ``bye``: role -> broker, at stop. Meta ``id``, ``stats``. No arrays.
- ``lookup``: anyone -> broker (throwaway DEALER). Meta ``role``. No arrays.
- ``lookup_reply``: broker -> asker. Meta ``role``, ``services`` ``[{id, rpc, host}]``.
- ``status``: anyone -> broker (throwaway DEALER). Meta (all optional) ``after`` ([role, id]
  of the last row of the previous page), ``host``/``role`` (those rows only), ``id`` (that
  role's whole row alone). No arrays.
- ``status_reply``: broker -> asker. Meta ``roles`` (one page of rows, at most
  ``STATUS_PAGE_BYTES``; a listing's rows carry the info that fits, ``truncated`` marking a
  cut one), ``more`` and ``last`` (ask again with ``after`` = ``last``), ``broker``.
- ``stop_run``: head -> broker (throwaway DEALER). Meta ``token`` str (the broker's stop
  token), ``reason`` str; answered with ``stop_run`` (meta ``reason``) or ``refused``. No arrays.
- ``error``: defined, not sent by any role in this version.

Data paths:

- ``trajectory``: actor -> one replay shard, PUSH stream ``experience``; on-policy actor ->
  replay FIFO (impala, appo, stream ``experience``) or every PPO learner (PUB topic ``rollouts/``).
  Meta ``weights_version`` (the version the steps acted with, :func:`trajectory_version`),
  ``actor`` (index), ``env_steps``. Arrays: :data:`TRANSITIONS` (apex_dqn;
  :data:`FRAME_TRANSITIONS` for frame stacks; qmix's team transitions, one row per game: ``O``
  the game's slot observations side by side, the joint action, ``zrl.replay.layout``),
  :data:`CONTINUOUS_TRANSITIONS` (apex_ddpg, sac),
  :data:`SEQUENCES` (r2d2; :data:`FRAME_SEQUENCES` for frame stacks), :data:`UNROLL` (impala,
  appo, ppo; :data:`FRAME_UNROLL` for impala, appo and ppo on frame stacks) or
  :data:`RECURRENT_UNROLL` (impala, appo and ppo with ``model.core``;
  :data:`RECURRENT_FRAME_UNROLL` for impala and appo on frame stacks) or
  :data:`CONTINUOUS_UNROLL` (impala, appo and ppo on Box actions) or :data:`TURN_UNROLL` (ppo on
  a turn-based game played from both seats), or :data:`SEARCH_SAMPLES` (alphazero: the
  moves of finished self-play games, with the search's visit distributions, on topic
  ``rollouts/`` to every learner).
- ``batch``: replay shard -> one learner, PUSH stream ``batches``. Meta ``shard`` (replay
  id), ``table_size``. Arrays: :data:`TRANSITION_BATCH` (apex_dqn; qmix's of teams),
  :data:`CONTINUOUS_TRANSITION_BATCH`
  , :data:`UNROLL_BATCH` (impala, appo, from a FIFO table; :data:`FRAME_UNROLL_BATCH` on frame
  stacks), :data:`RECURRENT_UNROLL_BATCH` (impala, appo with ``model.core``;
  :data:`RECURRENT_FRAME_UNROLL_BATCH` on frame stacks), :data:`CONTINUOUS_UNROLL_BATCH`
  (impala, appo on Box actions) or :data:`SEQUENCE_BATCH` (r2d2;
  :data:`FRAME_SEQUENCE_BATCH` on frame stacks). Every batch carries
  each item's ``weights_version`` (:data:`UNKNOWN_VERSION` where the shard does not know it):
  learners report the policy lag from it.
- ``priorities``: learner -> the shard that sampled, PUB topic ``priorities/<shard id>/``.
  No meta. Arrays: :data:`PRIORITIES`.
- ``ack``: replay shard -> actor on topic ``acks/<actor id>/`` (meta ``seq`` of the
  trajectory, ``inserted``, ``incarnation``: see :func:`incarnation`); learner -> shard on
  topic ``batch-acks/<shard id>/`` (meta ``seq`` of the batch); params -> learner on the rpc
  ROUTER (meta ``version``). No arrays.
- ``incarnation``: replay shard -> every actor, PUB topic ``incarnations/<shard id>/``, once
  a second. Meta ``incarnation``. No arrays. An actor whose window is full of trajectories
  a restarted shard lost sends nothing, so it hears no ack of the new incarnation: this is
  how it learns of the restart anyway.
- ``weights``: learner -> params over rpc (meta ``updates``, ``min_version``, the
  algorithm's integers, ``policy`` and ``resets`` for a named policy); params -> everyone on
  PUB topic ``weights`` (``policy_topic``) and as the answer to ``get_weights`` (meta
  ``version`` plus the learner's integers, ``policy``). Arrays: the model's
  state_dict, parameter name -> array (model-dependent: checked by ``load_arrays`` and the
  params server, not a schema here).
- ``get_weights``: actor/evaluator (late join), supervisor (final model), league -> params
  rpc, throwaway DEALER. Meta ``policy`` (absent: the default). No arrays; answered with
  ``weights`` or ``no_weights``.
- ``no_weights``: params -> asker (nothing stored yet). Meta ``policy`` for a named one.
- ``reset``: league -> params rpc (DEALER). Meta ``policy``, ``resets`` (how many times the
  league reset it): params returns the count in the ``control`` it answers that policy's
  learner, which restarts from its initial weights. Not answered. No arrays.
- ``exploit``: pbt -> params rpc (DEALER). Meta ``policy``, ``source`` (two PBT members),
  ``seq``, ``hyperparameters`` (checked by ``zrl.roles.pbt.exploit_instruction``): params
  returns the newest in the ``control`` it answers that member's learner (``exploit``), which
  copies the source's checkpoint and sets them. Not answered. No arrays.
- ``get_control``: learner -> params rpc, once a second in a run with a league or PBT. Meta
  ``policy``. No arrays; answered with ``control``.
- ``control``: params -> learner. Meta ``policy``, ``resets`` (absent: 0) and ``exploit``
  (absent: none) of that policy. No arrays.
- ``metrics``: every role -> topic ``metrics`` (meta ``id``, ``role``, ``time``, the role's
  heartbeat info, ``train``); evaluator -> topic ``eval`` (meta ``kind`` = "eval",
  ``weights_version``, ``mean``, ``std``, ``min``, ``max``, ``episodes``, ``seconds``). No
  arrays.
- ``end_of_stream``: defined, not sent by any role in this version.
- ``gradients``: A3C worker -> params, PUSH stream ``gradients`` (meta ``weights_version``,
  ``actor``, ``env_steps``, ``samples``, loss parts). Arrays: one float32 gradient per
  parameter name, the parameter's shape (model-dependent, not a schema here). (DD-PPO's
  learners average their gradients over a ``torch.distributed`` group, not on the wire.)
- ``match``: actor -> the league's rpc (DEALER). Meta ``count`` (1..``MAX_MATCHES``): opponents
  for that many episodes, ``policy`` (the learning player it acts for; absent: main);
  answered with ``matches``. No arrays.
- ``matches``: league -> actor. Meta ``opponents``: member names (``main``, ``main@<version>``,
  ``random``, ``scripted``), at most ``MAX_MATCHES``. No arrays.
- ``results``: actor -> the league's rpc. Meta ``opponents`` (names) and ``outcomes`` (+1 win,
  0 draw, -1 loss of the learning player), the same length, at most ``MAX_RESULTS``;
  ``policy`` as in ``match``. Not answered. No arrays.
- ``get_snapshot``: actor -> the league's rpc. Meta ``id`` (a snapshot's name); answered with
  ``weights`` (meta ``id``, ``version``; arrays as for params) or ``no_weights``.
- ``infer``: actor -> an inference role's rpc (DEALER; ``zrl.roles.inference``). Meta
  ``method`` (one of :data:`INFER_METHODS`), ``seq`` (the actor's request number, echoed).
  Arrays: :data:`INFER_OBS` (``forward``, ``policy_logits``) or :data:`INFER_STEP` (``step``
  of a recurrent model), checked against the server's config and env spaces, at most
  :func:`max_infer_rows` rows; answered with ``inferred``.
- ``inferred``: inference role -> the actor that asked. Meta ``seq`` (the request's),
  ``weights_version`` (the version that computed it). Arrays ``out0``, ``out1``, ...: the
  method's outputs (one, or each of the tuple it returned), float32, B rows each
  (model-dependent: checked by :func:`inferred_outputs`, not a schema).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from zrl.transport import protocol as P
from zrl.transport.schema import OBS, Array, Schema, schema

MAX_VERSION = P.MAX_SEQ
"""The largest weights version a WEIGHTS message may carry (every version is a sequence)."""

UNKNOWN_VERSION = -1
"""The ``weights_version`` of a replay item whose producing policy is unknown: a trajectory
that carried none, or an item restored from a snapshot written before items had versions.
Learners leave such items out of the policy lag."""


def trajectory_version(meta: Mapping[str, Any], required: bool = False) -> int:
    """The ``weights_version`` of a TRAJECTORY: an int in [0, MAX_VERSION] (0: the initial
    weights, before the actor received any). Missing: :data:`UNKNOWN_VERSION`, or
    ProtocolError when ``required``; anything else is a ProtocolError."""
    version = meta.get("weights_version")
    if version is None and not required:
        return UNKNOWN_VERSION
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_VERSION:
        raise P.ProtocolError(
            f"trajectory weights_version {str(version)[:40]!r} is not an int in [0, {MAX_VERSION}]"
        )
    return version


def weights_version(meta: Mapping[str, Any]) -> int | None:
    """The ``version`` of a WEIGHTS message if it is an integer in [1, MAX_VERSION], else None."""
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        return None
    return version if 1 <= version <= MAX_VERSION else None


MAX_HEARTBEAT_SEQ = 2**63 - 1
"""A role's heartbeats count up from 1; msgpack's signed 64 bits bound them."""


def heartbeat_seq(meta: Mapping[str, Any]) -> int | None:
    """The ``seq`` of a HEARTBEAT, or the one its HEARTBEAT_ACK echoes, if it is an int in
    [1, MAX_HEARTBEAT_SEQ], else None: the broker and a host agent echo only such a seq, and
    a role counts only such an echo."""
    seq = meta.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        return None
    return seq if 1 <= seq <= MAX_HEARTBEAT_SEQ else None


INCARNATION_BITS = 63
"""A replay shard's incarnation is a random int in [0, 2**63): msgpack's signed 64 bits."""


def new_incarnation() -> int:
    """A fresh incarnation for a replay shard that starts. Random rather than time + pid: a
    restarted process in a container may get the same pid, and a clock can step back."""
    return secrets.randbits(INCARNATION_BITS)


def incarnation(meta: Mapping[str, Any]) -> int:
    """The ``incarnation`` of a replay shard's ``ack`` or ``incarnation`` message: which start
    of the shard sent it. Every start picks a new one (:func:`new_incarnation`), so an actor
    that hears another incarnation from a shard id it knows learns that the shard restarted
    and lost what it had not acknowledged. ProtocolError unless an int in [0, 2**63)."""
    value = meta.get("incarnation")
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 0 <= value < 2**INCARNATION_BITS
    ):
        raise P.ProtocolError(f"incarnation {str(value)[:40]!r} is not an int in [0, 2**63)")
    return value


OBS_DTYPES = ("float32", "uint8")
"""Observations travel as float32, or as uint8 (images: frames stay uint8 up to the learner's
device, where the model scales them)."""


def obs_dtype(space: Any) -> np.dtype:
    """The dtype an observation space's observations travel in: uint8 for image spaces
    (frames stay uint8 up to the learner's device, where the model scales them), else float32."""
    return np.dtype(np.uint8) if getattr(space, "dtype", None) == np.uint8 else np.dtype(np.float32)


def obs_shape(space: Any) -> tuple[int, ...]:
    """The observation dim ``O`` of an observation space: its shape for uint8 images, the flat
    width ``(n,)`` otherwise."""
    shape = tuple(int(n) for n in getattr(space, "shape", None) or ())
    return shape if obs_dtype(space) == np.uint8 else (int(np.prod(shape, dtype=np.int64)),)


def as_obs(obs: Any, num_envs: int, dtype: np.dtype) -> np.ndarray:
    """A vector env's observations as they travel: ``[E, *shape]`` uint8 frames, or
    ``[E, O]`` float32 (vector observations flattened)."""
    arr = np.asarray(obs, dtype=dtype)
    return arr if dtype == np.uint8 else arr.reshape(num_envs, -1)


_OBS = Array(OBS_DTYPES, ("E", "T", OBS), finite=True)
_ACTION = Array("int64", ("E", "T"))
_STEP_F32 = Array("float32", ("E", "T"), finite=True)
_STEP_BOOL = Array("bool", ("E", "T"))
_OUTCOMES = {
    "reward": _STEP_F32,
    "terminated": _STEP_BOOL,
    "truncated": _STEP_BOOL,
    "valid": _STEP_BOOL,
}
"""What each env step returned, as every trajectory of T steps of E envs carries it (``valid``:
False for the step after an episode end, which only reset the env)."""

SEARCH_SAMPLES = schema(
    P.TRAJECTORY,
    "search_samples",
    "alphazero actor -> alphazero learners (PUB topic rollouts/): B moves of finished self-play "
    "games, each with the search's visit distribution and the game's outcome for its mover.",
    obs=Array("float32", ("B", OBS), finite=True),
    policy=Array("float32", ("B", "A"), finite=True),
    value=Array("float32", ("B",), finite=True),
)
"""``policy [B, A]``: the root's visit counts normalised (0 on illegal moves); ``value [B]``:
+1 the mover of that position won the game, 0 draw, -1 lost. B may be 0 (no game ended in
the trajectory). The learner checks the distributions and outcomes too
(``zrl.algos.alphazero.update``)."""
_ROW_F32 = Array("float32", ("B",), finite=True)
_KEY = Array("int64", ("B",))
_VERSION = Array("int64", ("B",))
"""Each item's weights version (:data:`UNKNOWN_VERSION` where not known)."""

# --- experience: three items, each in the variants of a few options ---------------------------

Item = Literal["transitions", "unroll", "sequences"]
_ITEMS: dict[str, dict[str, Array]] = {
    "transitions": {
        "obs": _OBS,
        "action": _ACTION,
        **_OUTCOMES,
        "next_obs": _OBS,
        "priority": _STEP_F32,
    },
    "unroll": {
        "obs": _OBS,
        "action": _ACTION,
        "logp": _STEP_F32,
        **_OUTCOMES,
        "bootstrap_obs": Array(OBS_DTYPES, ("E", OBS), finite=True),
    },
    "sequences": {
        "obs": Array(OBS_DTYPES, ("E", "P", OBS), finite=True),
        "action": Array("int64", ("E", "T")),
        "reward": _STEP_F32,
        "terminated": _STEP_BOOL,
        "mask": _STEP_BOOL,
        "first": Array("bool", ("E", "P")),
        "state": Array("float32", ("E", "R"), finite=True),
        "priority": Array("float32", ("E",), finite=True),
        "weights_version": Array("int64", ("E",)),
    },
}
"""Each item's TRAJECTORY arrays in its plain variant (discrete actions, whole observations)."""
_FRAMES = Array("uint8", ("E", "S", OBS))
"""Frame stacks each frame once (``zrl.codecs.frames``), in place of every stacked array."""
_STACKED = ("obs", "next_obs", "bootstrap_obs")
_RECURRENT = {"state": Array("float32", ("E", "R"), finite=True), "first": _STEP_BOOL}
"""What a recurrent unroll adds: the state step 0 acted from, the steps where an episode starts."""
_TURNS = {"passes": _STEP_BOOL}
"""What a turn-based game played from both seats adds to an unroll."""
_EXPERIENCE: dict[tuple[str, bool, bool, bool, bool, bool], Schema] = {}
"""Every experience schema of the protocol by (item, batch, frames, recurrent, continuous,
turns): the variants that exist, no others."""


def _rows(arrays: Mapping[str, Array], drop: tuple[str, ...] = ()) -> dict[str, Array]:
    """A TRAJECTORY's arrays as a BATCH carries them: a shard stores each env's unroll (or
    each sequence) as one item, so a sampled batch has the same arrays with dim E become B."""
    return {
        name: Array(a.dtype, tuple("B" if d == "E" else d for d in a.dims), a.finite)
        for name, a in arrays.items()
        if name not in drop
    }


def _experience(
    item: Item,
    doc: str,
    *,
    batch: bool = False,
    frames: bool = False,
    recurrent: bool = False,
    continuous: bool = False,
    turns: bool = False,
) -> Schema:
    """The schema of ``item`` with the options given, derived from the item's plain arrays:
    ``continuous`` makes the action float32 with a dim ``A``, ``frames`` puts ``frames`` first
    in place of the stacked observations, ``recurrent`` and ``turns`` add their arrays, and a
    ``batch`` is what a replay shard samples of such trajectories. Named by its options
    (``recurrent_frame_unroll_batch``) and registered for :func:`experience_schema`."""
    arrays = dict(_ITEMS[item])
    if continuous:
        action = arrays["action"]
        arrays["action"] = Array("float32", (*action.dims, "A"), finite=True)
    if frames:
        arrays = {"frames": _FRAMES, **{k: v for k, v in arrays.items() if k not in _STACKED}}
    extras = {**(_RECURRENT if recurrent else {}), **(_TURNS if turns else {})}
    if not batch:
        arrays.update(extras)
    elif item == "transitions":  # n-step transitions, their stacks whole (a shard rebuilds them)
        action = arrays["action"]
        arrays = {
            "obs": Array(OBS_DTYPES, ("B", OBS), finite=True),
            "action": Array(action.dtype, ("B", *action.dims[2:]), action.finite),
            "reward": _ROW_F32,
            "discount": _ROW_F32,
            "next_obs": Array(OBS_DTYPES, ("B", OBS), finite=True),
            "weights_version": _VERSION,
            "weight": _ROW_F32,
            "key": _KEY,
        }
    elif item == "unroll":  # a FIFO's weights are all 1: not checked finite
        arrays = {
            **_rows(arrays),
            "weights_version": _VERSION,
            "weight": Array("float32", ("B",)),
            "key": _KEY,
            **_rows(extras),
        }
    else:
        arrays = {**_rows(arrays, drop=("priority",)), "weight": _ROW_F32, "key": _KEY}
    prefix = "recurrent_" * recurrent + "turn_" * turns + "frame_" * frames
    prefix += "continuous_" * continuous
    name = prefix + (f"{item.removesuffix('s')}_batch" if batch else item)
    found = schema(P.BATCH if batch else P.TRAJECTORY, name, doc, **arrays)
    _EXPERIENCE[item, batch, frames, recurrent, continuous, turns] = found
    return found


def experience_schema(
    item: Item,
    *,
    batch: bool = False,
    frames: bool = False,
    recurrent: bool = False,
    continuous: bool = False,
    turns: bool = False,
) -> Schema:
    """The schema of ``item`` (a TRAJECTORY, or with ``batch`` the BATCH a shard samples of
    it) on uint8 frame stacks (``frames``), from a recurrent model (``recurrent``, unrolls),
    with Box actions (``continuous``) or from both seats of a turn-based game (``turns``, PPO
    unrolls). ValueError for a combination the protocol has no schema for (Box actions are
    feed-forward over flat observations; a shard samples frame transitions as whole stacks)."""
    found = _EXPERIENCE.get((item, batch, frames, recurrent, continuous, turns))
    if found is None:
        flags = {"frames": frames, "recurrent": recurrent, "continuous": continuous, "turns": turns}
        options = " and ".join(name for name, on in flags.items() if on) or "no options"
        raise ValueError(f"no {item} {'batch' if batch else 'trajectory'} schema with {options}")
    return found


TRANSITIONS = _experience(
    "transitions",
    "Ape-X DQN actor -> replay: T steps of E envs, discrete actions, initial priorities.",
)
FRAME_TRANSITIONS = _experience(
    "transitions",
    "Ape-X DQN actor on frame stacks -> replay: the transitions layout with each frame once.",
    frames=True,
)
"""``frames [E, S, H, W]`` with ``S = T + k`` for stacks of ``k``: the k frames of the first
observation, then the newest frame of each later one (the last is the final observation's).
The replay server rebuilds the stacks (``zrl.replay.frames``); 1/8 of the transitions' bytes."""
CONTINUOUS_TRANSITIONS = _experience(
    "transitions",
    "apex_ddpg/sac actor -> replay: the transitions layout with float32 [E, T, A] actions.",
    continuous=True,
)
UNROLL = _experience(
    "unroll",
    "impala/ppo actor -> replay FIFO or PPO learners: T steps of E envs, behaviour log-probs.",
)
FRAME_UNROLL = _experience(
    "unroll",
    "impala/appo/ppo actor on frame stacks -> replay FIFO or PPO learners: the unroll layout "
    "with each frame once.",
    frames=True,
)
"""``frames [E, S, H, W]`` with ``S = T + k`` for stacks of ``k`` (the wire format of
:data:`FRAME_TRANSITIONS`): obs_0..obs_{T-1} and ``bootstrap_obs`` (obs_T) in a quarter of the
bytes for k = 4. The learner rebuilds the stacks on its device (``zrl.codecs.frames``)."""
CONTINUOUS_UNROLL = _experience(
    "unroll",
    "impala/appo/ppo actor with Box actions -> replay FIFO or PPO learners: the unroll layout "
    "with float32 [E, T, A] actions.",
    continuous=True,
)
"""The Gaussian policy's unroll (``zrl.nets.gaussian``): ``action`` is the sample whose
log-density ``logp`` is, before the actor clipped it to the Box for the env (it may lie
outside the bounds)."""
TURN_UNROLL = _experience(
    "unroll",
    "ppo actor on a turn-based game played from both seats (env.multiagent.self_play_seats: "
    "both) -> PPO learners: the unroll layout and whether the turn passed after each step.",
    turns=True,
)
"""``passes[e, t]``: after step ``t`` the slot moves for the other seat, so GAE negates the
values after it (``zrl.algos.kernel.returns.rollout_gae``)."""
TRANSITION_BATCH = _experience(
    "transitions",
    "replay -> Ape-X DQN learner: B n-step transitions, importance weights, table keys and "
    "the weights version each transition was collected with.",
    batch=True,
)
CONTINUOUS_TRANSITION_BATCH = _experience(
    "transitions",
    "replay -> apex_ddpg/sac learner: the transition batch with float32 [B, A] actions.",
    batch=True,
    continuous=True,
)
UNROLL_BATCH = _experience(
    "unroll",
    "replay FIFO -> IMPALA learner: B whole unrolls with the weights version of each.",
    batch=True,
)
FRAME_UNROLL_BATCH = _experience(
    "unroll",
    "replay FIFO -> IMPALA/APPO learner on frame stacks: B whole frame unrolls.",
    batch=True,
    frames=True,
)
"""What a FIFO shard stores of each :data:`FRAME_UNROLL` row, sampled: ``frames [B, S, H, W]``
in place of ``obs`` and ``bootstrap_obs``."""
CONTINUOUS_UNROLL_BATCH = _experience(
    "unroll",
    "replay FIFO -> IMPALA/APPO learner with Box actions: the unroll batch with float32 "
    "[B, T, A] actions.",
    batch=True,
    continuous=True,
)
SEQUENCES = _experience(
    "sequences",
    "R2D2 actor -> replay: E fixed-length sequences the actor cut, each with the recurrent "
    "state it started from.",
)
"""Sequences of ``T`` steps (``r2d2.sequence_length``), ``E`` of them (possibly 0): ``obs`` has
``P = T + 1`` positions, the last the observation after the last step (what its n-step targets
bootstrap from). ``mask`` marks real steps (padding before an episode's start and after its
end is False); ``first`` the positions where an episode starts (the state is zeroed before
them); ``state`` the recurrent state before position 0; ``priority`` the initial priority;
``weights_version`` the oldest weights version that acted in its real steps (a sequence can
span trajectories, so the message's one version is not enough)."""
SEQUENCE_BATCH = _experience(
    "sequences",
    "replay -> R2D2 learner: B sequences, importance weights, table keys and weights versions.",
    batch=True,
)
FRAME_SEQUENCES = _experience(
    "sequences",
    "R2D2 actor on frame stacks -> replay: the sequences layout with each frame once per sequence.",
    frames=True,
)
"""``frames [E, S, H, W]`` with ``S = T + k`` for stacks of ``k``: the k frames of the
sequence's position 0, then the newest frame of positions 1..T (``zrl.codecs.frames.frames_of``
of its ``obs``), in place of ``obs [E, T + 1, k, H, W]``. Each sequence carries its own
frames, so overlapping sequences repeat the frames of their overlap (``r2d2.burn_in`` steps).
The learner rebuilds the stacks on its device from ``first`` and ``mask``
(``zrl.codecs.frames.sequence_stacks_from_frames``): padding positions are zero stacks, as the
actor's."""
FRAME_SEQUENCE_BATCH = _experience(
    "sequences",
    "replay -> R2D2 learner on frame stacks: B frame sequences, importance weights, table "
    "keys and weights versions.",
    batch=True,
    frames=True,
)
"""What a shard stores of each :data:`FRAME_SEQUENCES` row, sampled: ``frames [B, S, H, W]``
in place of ``obs``."""
RECURRENT_UNROLL = _experience(
    "unroll",
    "recurrent impala/appo/ppo actor -> replay FIFO or PPO learners: the unroll, the recurrent "
    "state before its first step and the steps where an episode starts.",
    recurrent=True,
)
"""``state`` is the recurrent state step 0 acted from; ``first[e, t]`` is True where the actor
zeroed the state before step t (an episode starts there: ``first[:, t + 1] == ~valid[:, t]``).
A learner unrolling ``model.unroll(obs, state, first)`` computes what the actor computed."""
RECURRENT_UNROLL_BATCH = _experience(
    "unroll",
    "replay FIFO -> recurrent IMPALA/APPO learner: the unroll batch with each unroll's "
    "recurrent state and episode starts.",
    batch=True,
    recurrent=True,
)
"""What a FIFO shard stores of each :data:`RECURRENT_UNROLL` row, sampled: ``state [B, R]`` and
``first [B, T]`` as the actor recorded them (the same convention)."""
RECURRENT_FRAME_UNROLL = _experience(
    "unroll",
    "recurrent impala/appo actor on frame stacks -> replay FIFO: the frame unroll, the "
    "recurrent state before its first step and the steps where an episode starts.",
    frames=True,
    recurrent=True,
)
""":data:`RECURRENT_UNROLL` with each frame once: ``frames [E, T + k, H, W]`` (as
:data:`FRAME_UNROLL`) in place of ``obs`` and ``bootstrap_obs``."""
RECURRENT_FRAME_UNROLL_BATCH = _experience(
    "unroll",
    "replay FIFO -> recurrent IMPALA/APPO learner on frame stacks: the frame unroll batch with "
    "each unroll's recurrent state and episode starts.",
    batch=True,
    frames=True,
    recurrent=True,
)
"""What a FIFO shard stores of each :data:`RECURRENT_FRAME_UNROLL` row, sampled; the learner
rebuilds ``obs`` and ``bootstrap_obs`` on its device (``zrl.codecs.frames``)."""
PRIORITIES = schema(
    P.PRIORITIES,
    "priorities",
    "learner -> the replay shard that sampled: new priorities of N of its keys.",
    key=Array("int64", ("N",)),
    priority=Array("float32", ("N",), finite=True),
)

MAX_MATCHES = 256
MAX_RESULTS = 4096


def member_name(value: Any) -> str:
    """A league member's name from a message; ProtocolError unless a short string."""
    if not isinstance(value, str) or not 0 < len(value) <= P.MAX_NAME_CHARS:
        raise P.ProtocolError(f"league member name {str(value)[:40]!r} is not a short string")
    return value


DEFAULT_POLICY = "main"
"""The weights stream (policy) of a run with one learning policy; a run with several (a league
with exploiters) names the others, and each has its own versions, learners and actors."""


def policy_topic(topic: str, policy: str) -> str:
    """``topic`` of one policy's stream: the default policy's is ``topic`` itself (so a run
    with one policy speaks as before); another's is ``policy/<name>/<topic>``, which no
    subscription to a default topic prefix-matches."""
    return topic if policy == DEFAULT_POLICY else f"policy/{policy}/{topic}"


POLICY_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""A policy (weights stream) name: it lands in topics and metric names."""


def policy_name(meta: Mapping[str, Any]) -> str:
    """The ``policy`` of a message (``weights``, ``get_weights``, ``reset``, ``match``,
    ``results``, an ``ack`` of weights): the default policy when absent; ProtocolError unless
    a name of the form ``[a-z][a-z0-9_]{0,63}``."""
    name = meta.get("policy", DEFAULT_POLICY)
    if not isinstance(name, str) or not POLICY_NAME.fullmatch(name):
        raise P.ProtocolError(f"policy {str(name)[:40]!r} is not a name [a-z][a-z0-9_]{{0,63}}")
    return name


def policy_meta(policy: str) -> dict[str, str]:
    """The meta that names ``policy`` on the wire: none for the default policy, so a run with
    one policy sends what it always sent."""
    return {} if policy == DEFAULT_POLICY else {"policy": policy}


def reset_count(meta: Mapping[str, Any]) -> int:
    """The ``resets`` of a ``reset`` (or of an ``ack`` of weights): how many times the league
    has reset the policy so far, an int in [0, MAX_VERSION]."""
    count = meta.get("resets", 0)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_VERSION:
        raise P.ProtocolError(f"resets {count!r} is not an int in [0, 2**53]")
    return count


def match_count(meta: Mapping[str, Any]) -> int:
    """The ``count`` of a ``match`` request."""
    count = meta.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_MATCHES:
        raise P.ProtocolError(f"match count {count!r} is not an int in [1, {MAX_MATCHES}]")
    return count


def match_opponents(meta: Mapping[str, Any]) -> list[str]:
    """The ``opponents`` of a ``matches`` answer."""
    names = meta.get("opponents")
    if not isinstance(names, list) or not 0 < len(names) <= MAX_MATCHES:
        raise P.ProtocolError(f"matches without a list of 1 to {MAX_MATCHES} opponents")
    return [member_name(n) for n in names]


def league_results(meta: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(opponent, outcome) pairs of a ``results`` message."""
    names, outcomes = meta.get("opponents"), meta.get("outcomes")
    if not isinstance(names, list) or not isinstance(outcomes, list) or len(names) != len(outcomes):
        raise P.ProtocolError("results need lists opponents and outcomes of the same length")
    if len(names) > MAX_RESULTS:
        raise P.ProtocolError(f"results of {len(names)} games, more than {MAX_RESULTS}")
    out = []
    for name, outcome in zip(names, outcomes, strict=True):
        if outcome not in (-1, 0, 1) or isinstance(outcome, bool):
            raise P.ProtocolError(f"outcome {outcome!r} is not -1, 0 or 1")
        out.append((member_name(name), int(outcome)))
    return out


# --- inference (actor <-> inference role) ----------------------------------------------------

INFER_OBS = schema(
    P.INFER,
    "infer_obs",
    "actor -> inference role: the observations of B envs for a feed-forward method.",
    obs=Array(OBS_DTYPES, ("B", OBS), finite=True),
)
INFER_STEP = schema(
    P.INFER,
    "infer_step",
    "actor -> inference role: observations and recurrent states of B envs for ``step``.",
    obs=Array(OBS_DTYPES, ("B", OBS), finite=True),
    state=Array("float32", ("B", "R"), finite=True),
)
INFER_METHODS: dict[str, Schema] = {
    "forward": INFER_OBS,
    "policy_logits": INFER_OBS,
    "step": INFER_STEP,
}
"""The model methods an actor may ask an inference role to run, and their arrays. Which of them
a server runs is the model's: one its model lacks is refused."""
MAX_INFER_OUTPUTS = 8
"""Arrays an ``inferred`` reply may carry."""


def max_infer_rows(num_envs: int, trajectory_length: int) -> int:
    """The most rows one ``infer`` may carry: an actor asks for at most its envs' observations
    of one trajectory and the one after (Ape-X's priorities of a whole trajectory)."""
    return num_envs * (trajectory_length + 1)


def infer_request(meta: Mapping[str, Any]) -> tuple[str, int]:
    """The ``method`` and ``seq`` of an ``infer``; ProtocolError when either is bad."""
    method = meta.get("method")
    if not isinstance(method, str) or method not in INFER_METHODS:
        raise P.ProtocolError(
            f"infer method {str(method)[:40]!r} is not one of {sorted(INFER_METHODS)}"
        )
    seq = meta.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= P.MAX_SEQ:
        raise P.ProtocolError(f"infer seq {str(seq)[:40]!r} is not an int in [0, {P.MAX_SEQ}]")
    return method, seq


def inferred_outputs(msg: P.Message, rows: int) -> tuple[int, list[np.ndarray]]:
    """The ``weights_version`` and output arrays of an ``inferred`` reply to a request of
    ``rows`` rows: ``out0``..``out{n-1}`` (1 to :data:`MAX_INFER_OUTPUTS`), float32, ``rows``
    rows each, finite. ProtocolError otherwise."""
    version = trajectory_version(msg.meta, required=True)
    n = len(msg.arrays)
    names = [f"out{i}" for i in range(n)]
    if not 1 <= n <= MAX_INFER_OUTPUTS or sorted(msg.arrays) != sorted(names):
        raise P.ProtocolError(
            f"inferred carries arrays {sorted(msg.arrays)[:MAX_INFER_OUTPUTS]}, expected "
            f"out0..out{{n-1}} with n from 1 to {MAX_INFER_OUTPUTS}"
        )
    outputs = [msg.arrays[name] for name in names]
    for name, out in zip(names, outputs, strict=True):
        if out.dtype != np.float32 or out.ndim < 1 or out.shape[0] != rows:
            raise P.ProtocolError(
                f"inferred array {name!r} is {out.dtype} {out.shape}, expected float32 with "
                f"{rows} rows"
            )
        if not np.isfinite(out).all():
            raise P.ProtocolError(f"inferred array {name!r} holds NaN or inf")
    return version, outputs


SCHEMAS: dict[str, Schema] = {
    s.name: s
    for s in (
        TRANSITIONS,
        FRAME_TRANSITIONS,
        CONTINUOUS_TRANSITIONS,
        UNROLL,
        TRANSITION_BATCH,
        CONTINUOUS_TRANSITION_BATCH,
        UNROLL_BATCH,
        CONTINUOUS_UNROLL,
        CONTINUOUS_UNROLL_BATCH,
        TURN_UNROLL,
        SEARCH_SAMPLES,
        FRAME_UNROLL,
        FRAME_UNROLL_BATCH,
        SEQUENCES,
        SEQUENCE_BATCH,
        FRAME_SEQUENCES,
        FRAME_SEQUENCE_BATCH,
        RECURRENT_UNROLL,
        RECURRENT_UNROLL_BATCH,
        RECURRENT_FRAME_UNROLL,
        RECURRENT_FRAME_UNROLL_BATCH,
        PRIORITIES,
        INFER_OBS,
        INFER_STEP,
    )
}
