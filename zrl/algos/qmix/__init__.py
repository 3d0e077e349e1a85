"""QMIX (Rashid et al. 2018): value decomposition for cooperative multi-agent games, with a
monotonic mixing network over per-agent Q-values.

Every agent of a parallel PettingZoo game (``mpe2/simple_spread_v3``) is a slot of the actor,
acting epsilon-greedily on one agent Q-network they share; each game's slots travel as one team
transition through a uniform replay table; the learner trains the agent network and the mixer
(conditioned on the env's global state, ``env.multiagent.central_value``) on the team's TD
error, with target copies of both.

With ``model.core`` (lstm or gru) the agent network is recurrent, as R2D2's: the actors cut
each game's team steps into fixed-length overlapping sequences that keep the agents' states
they started from (``qmix.sequence_length``, ``qmix.burn_in``), the replay shard stores them
as team sequences (``recurrent_wiring``), and the learner unrolls every agent from its stored
state with a burn-in, mixes per step and takes n-step targets over the sequence.

- ``config``: the ``qmix:`` section.
- ``losses``: the pure math (the monotonic mix, joint actions, targets, loss, one update).
- ``model``: the agent network and the mixer (``QMIXModel``), the agents of a game.
- ``policy``: the actor side (``QMIXPolicy``, the team transitions; ``RecurrentQMIXPolicy``,
  the team sequences).
- ``update``: the learner side (``QMIXUpdate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from zrl.algos.api.algorithm import Algorithm, Pieces, Wiring
from zrl.algos.qmix.config import QMIXConfig

if TYPE_CHECKING:
    from zrl.config.experiment import ExperimentConfig


def check_config(cfg: ExperimentConfig) -> None:
    """ValueError naming the key unless the env is a parallel PettingZoo env whose agents all
    map to main, with the global state in the slots."""
    from zrl.config.multiagent import is_multiagent

    env, ma = cfg.env, cfg.env.multiagent
    if not is_multiagent(env.id):
        raise ValueError(
            f"env.id: {env.id!r}: qmix learns cooperative multi-agent games; give a parallel "
            "PettingZoo env (mpe2/simple_spread_v3)"
        )
    if ma.api == "aec":
        raise ValueError(
            "env.multiagent.api: aec: qmix needs every agent to act at once; set api: parallel "
            "(or auto)"
        )
    others = sorted(f"{a}: {p}" for a, p in ma.policy_mapping.items() if p != "main")
    if others:
        raise ValueError(
            f"env.multiagent.policy_mapping: {', '.join(others)}: qmix learns one team, so "
            "every agent must map to main (or leave policy_mapping empty)"
        )
    if not ma.central_value:
        raise ValueError(
            "env.multiagent.central_value: false: qmix's mixer needs the env's global state; "
            "set env.multiagent.central_value: true"
        )
    if cfg.model.encoder not in ("auto", "mlp"):
        raise ValueError(
            f"model.encoder: {cfg.model.encoder}: qmix's agent network is an MLP over the "
            "agent's own observation; set model.encoder: auto"
        )
    if cfg.roles.league:
        raise ValueError("roles.league: qmix's agents are one team, with no opponents to pick")
    if cfg.model.core != "none":
        q = cfg.section(QMIXConfig)
        trained = q.sequence_length - q.burn_in
        if cfg.replay.n_step > trained:
            raise ValueError(
                f"replay.n_step ({cfg.replay.n_step}) must be at most qmix.sequence_length - "
                f"qmix.burn_in ({trained}) with model.core: {cfg.model.core}"
            )


def model_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """The mixer's sizes from ``qmix:``, and the agents of a game (from a probe game)."""
    from zrl.algos.qmix.model import team_size

    q = cfg.section(QMIXConfig)
    return {"agents": team_size(cfg), "embed": q.mixer_embed, "hypernet": q.hypernet_hidden}


def _wiring(item: Literal["transitions", "sequences"]) -> Wiring:
    """Actors -> a uniform replay of team ``item`` -> learners."""
    return Wiring(
        actions="discrete",
        experience="replay",
        replay_item=item,
        replay_tables=("uniform",),
        learner_input="batches",
        team=True,
    )


def pieces() -> Pieces:
    """The heavy pieces (torch), imported when a process first uses one."""
    from zrl.algos.qmix.model import qmix_model_for
    from zrl.algos.qmix.policy import qmix_policy
    from zrl.algos.qmix.update import QMIXUpdate

    return Pieces(policy=qmix_policy, update=QMIXUpdate, model=qmix_model_for)


ALGORITHM = Algorithm(
    name="qmix",
    summary="QMIX: per-agent epsilon-greedy Q (GRU/LSTM: team sequences), monotonic mixer",
    pieces=pieces,
    wiring=_wiring("transitions"),
    recurrent_wiring=_wiring("sequences"),
    recurrent=True,
    sequence_length=lambda cfg: cfg.section(QMIXConfig).sequence_length,
    config={"qmix": QMIXConfig},
    sections=("replay", "learner"),
    data_parallel=True,
    check_config=check_config,
    model_options=model_options,
)
