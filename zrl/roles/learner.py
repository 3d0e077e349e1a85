"""``Learner``: trains the algorithm's update on its input and publishes the weights.

The learner is the same for every algorithm. It owns receiving, batch acks, checkpoints,
publishing and non-finite handling; the algorithm's ``LearnerUpdate`` (``zrl.algos.api``,
built once after WELCOME) validates what arrives and trains on it.

Sockets (the input is the algorithm's ``wiring.learner_input``):

- **batches**: PULL ``batches`` <- replay shards (via the broker): BATCH messages; PUB
  ``batch-acks/<shard>/`` (topic bus): an ACK of every batch as it is received, the credit
  that lets the shard sample another (at most ``replay.prefetch`` in flight); PUB
  ``priorities/<shard>/``: PRIORITIES for the sampled keys, back to the shard that sampled
  them, when the update returns them.
- **rollouts**: SUB ``rollouts/`` (topic bus): every actor's rollouts (PPO).
- Several learners of one policy (``roles.learners > 1``) form a ``torch.distributed`` group
  (``zrl.distributed.learner_group``, docs/algorithms.md); while its collective waits, the
  update takes in (and acks) what arrived through :meth:`Learner.take_input`. Only learner 0
  of a group sends WEIGHTS.
- DEALER -> the parameter server's rpc ROUTER (found with LOOKUP "params"): WEIGHTS every
  ``learner.publish_interval`` updates but at most once per ``learner.publish_every_s``, or at
  once when the update says so, copied off the device meanwhile (``zrl.nets.wire.WeightsCopy``);
  answered with ACK {version}; in a run with a league or PBT also GET_CONTROL {policy} once a
  second, answered with CONTROL {policy, resets, exploit}. It connects under a random routing
  id whose digest the heartbeat shows first (``rpc_keys``, ``zrl.roles.rpc_identity``): params
  takes WEIGHTS and GET_CONTROL only from a connection a live learner entry vouches for.

Learner i trains the learning policy ``config.learner_policy(i)`` (the default one unless a
league has exploiters). A CONTROL may carry more ``resets`` than it has applied
(the league restarts its player: the update goes back to its initial model and optimizer,
versions go on increasing, docs/leagues.md) or the pbt role's newest ``exploit`` of this
member (checked against the config again here: it loads the source member's newest
checkpoint, a checked path under the checkpoint root, keeps its own counters, sets the
hyperparameters and publishes at once, docs/pbt.md).

A message the update rejects is dropped and counted. A NaN/inf loss or gradient drops its
batch before the optimizer step, and ten in a row stop the learner, which keeps its last good
checkpoint (docs/failures.md). On a GPU the update reads nothing back per update: the device
skips a non-finite step and the learner reads its finite flag once the next update is queued
(:meth:`Learner.settle`). Where its time goes (``TIME_PARTS``: waiting, copying, updating,
publishing) is in its heartbeat (docs/running.md).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zrl.algos.api.learner import (
    LearnerServices,
    LearnerSetup,
    LearnerUpdate,
    NonFiniteLossError,
    UpdateResult,
)
from zrl.algos.kernel.batches import resolve_device, wants_channels_last
from zrl.algos.registry import get_algorithm
from zrl.nets.encoders import use_channels_last
from zrl.nets.wire import WeightsCopy
from zrl.roles.base import Role, checked_file
from zrl.roles.errors import RoleError
from zrl.roles.pbt import exploit_instruction
from zrl.roles.registry_client import read_status
from zrl.roles.rpc_identity import ClientKeys
from zrl.roles.trust import load_checkpoint_file
from zrl.roles.weights import WeightsFollower
from zrl.transport import messages as M
from zrl.transport import protocol as P
from zrl.transport.sockets import Channel
from zrl.utils.durable import atomic_write
from zrl.utils.runtime import limit_torch_threads

PARAMS_LOOKUP_INTERVAL_S = 1.0
PARAMS_ACK_TIMEOUT_S = 3.0
# Unacked this long, the weights go again on the same connection (params may have asked the
# registry about it just before our key showed); unacked PARAMS_ACK_TIMEOUT_S: reconnect.
PARAMS_RESEND_S = 1.0
CONTROL_POLL_S = 1.0
"""How often a learner of a run with a league or PBT asks params for its policy's CONTROL."""
MAX_NON_FINITE_IN_A_ROW = 10
MAX_READS_PER_STEP = 256  # rollouts read before training: bounded, so a flood cannot starve us
TIME_PARTS = ("wait", "copy", "update", "publish")
"""Where a learner's time goes: the heartbeat's ``<part>_share`` of each."""


class Learner(Role):
    role = "learner"

    def __init__(self, broker: str, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.device = torch.device("cpu")
        self.params: Channel | None = None
        self.params_endpoint = ""
        self._next_lookup = 0.0
        self._unacked_since: float | None = None
        self._resent = False
        self._next_control = 0.0  # when to send the next GET_CONTROL (ask_control)
        self.updates = 0
        self.samples_trained = 0  # distinct env steps trained on, since this process started
        self.weights_version = 0
        self.last_loss: float | torch.Tensor = float("nan")
        # The update count and weights version of the checkpoint it resumed from (None: afresh).
        self.resumed_from: int | None = None
        self.resumed_version: int | None = None
        # While a checkpoint at the path is not loaded (it could not be): it is kept for the
        # user, never saved over.
        self.checkpoint_unread = False
        self.params_acked = False
        self.diverged = False
        self.non_finite_in_a_row = 0
        self.non_finite_batches = 0  # batches dropped for a NaN/inf loss, in all
        self.checkpoints = 0
        self.checkpoint: Path | None = None
        self.next_checkpoint = 0.0
        self.waiting_since: float | None = time.monotonic()
        self.started = time.monotonic()
        self.batch_acks: Channel | None = None
        self.priority_pub: Channel | None = None
        self.last_sender = "?"  # of the last message received: named when its update fails
        self.policy = M.DEFAULT_POLICY
        self.resets = 0  # the league's resets of our policy applied so far
        self.pbt_seq = 0  # the last PBT exploit applied (zrl.roles.pbt)
        self.pbt_exploits = 0
        self.initial_state: dict[str, Any] = {}
        self.rpc_keys = ClientKeys()  # our params connection's routing id, shown in heartbeats
        self.weights_sent = 0
        self.weights_acked = 0
        self.publish_due = False  # publish_interval updates passed, held by publish_every_s
        self.published_at = -float("inf")  # time.monotonic() of the last WEIGHTS built
        self.weights_copy = WeightsCopy()  # the weights on their way off the device
        self.stepping_since: float | None = None  # the first step, after setup
        self.time_s = dict.fromkeys(TIME_PARTS, 0.0)  # since then
        self.unreported_s = dict.fromkeys(("wait", "copy"), 0.0)  # since the last update
        # The last update checked on the device (UpdateResult.finite) and the sender of its
        # batch: counted (or dropped) once the next update is on its way.
        self.unchecked: tuple[UpdateResult, str] | None = None
        self.taken_in = 0
        """Batches the update's group took in while a collective waited (``take_input``): the
        next steps receive none of their own, one each, so one batch comes in per batch
        trained and none waits behind another."""

    def setup(self) -> None:
        cfg = self.config
        algorithm = get_algorithm(cfg.algo)
        self.policy = cfg.learner_policy(self.index or 0)
        limit_torch_threads(cfg.learner.torch_threads)
        torch.manual_seed(cfg.seed)
        probe = self.make_envs(num_envs=1)  # only for the spaces
        spaces = (probe.single_observation_space, probe.single_action_space)
        probe.close()
        self.open_input(algorithm.wiring.learner_input)
        self.device = resolve_device(cfg.learner.device)
        self.update: LearnerUpdate = self.make_update(spaces)
        if len(cfg.policies) > 1:  # only a league's players are ever reset
            self.initial_state = copy.deepcopy(self.update.state_dict())
        self.checkpoint = self.checkpoint_path()
        self.next_checkpoint = time.monotonic() + cfg.checkpoint.interval
        self.load_checkpoint()
        self.send_weights()  # every actor starts from the learner's (initial or resumed) weights

    def make_update(
        self, spaces: tuple[Any, Any], services: LearnerServices | None = None
    ) -> LearnerUpdate:
        """The algorithm's update of a new model for ``spaces`` (observation, action); the
        learner lends itself as ``services`` unless given others (tests)."""
        update = get_algorithm(self.config.algo).update
        if update is None:
            raise ValueError(f"{self.config.algo} has no learner: set roles.learners: 0")
        return update(
            LearnerSetup(
                config=self.config,
                model=self.learner_model(spaces),
                observation_space=spaces[0],
                action_space=spaces[1],
                index=self.index or 0,
                log=self.log,
                train_stats=self.train_stats,
                services=services or self,
                device=self.device,
            )
        )

    def learner_model(self, spaces: tuple[Any, Any]) -> nn.Module:
        """A new model for ``spaces`` on the learner's device, in ``learner.memory_format``."""
        model = self.make_model(*spaces).to(self.device)
        if wants_channels_last(self.config.learner.memory_format, self.device):
            use_channels_last(model)
        return model

    @property
    def online(self) -> nn.Module:
        return self.update.model

    def open_input(self, learner_input: str) -> None:
        """The learner's input for the algorithm's ``wiring.learner_input``."""
        if learner_input == "rollouts":
            topic = M.policy_topic(P.ROLLOUTS_TOPIC, self.policy)
            self.input = self.open_subscriber([topic], "rollouts", hwm=1000)
            return
        self.input = self.open_pull("batches", hwm=2)
        self.batch_acks = self.open_publisher("batch-acks")
        self.priority_pub = self.open_publisher("priorities")

    def follow_weights(self, model: nn.Module) -> WeightsFollower:
        """For updates that follow another learner's published weights (DD-PPO)."""
        return WeightsFollower(self, model, self.policy)

    def role_info(self, role_id: str) -> dict[str, Any] | None:
        """The heartbeat info of the live role ``role_id`` (DD-PPO: learner 0's group store
        address), from a STATUS of that role; None while it is not registered or not alive."""
        try:
            rows = read_status(self.ctx, self.broker, 1.0, self.keys, role_id=role_id)["roles"]
        except RoleError as exc:
            self.log.debug("STATUS of %s: %s", role_id, exc)
            return None
        row = next((r for r in rows if isinstance(r, dict) and r.get("id") == role_id), None)
        if row is None or row.get("state") in ("dead", "stopped"):
            return None
        info = row.get("info")
        return info if isinstance(info, dict) else None

    # --- parameter server -------------------------------------------------------------

    def _connect_params(self) -> bool:
        if self.params is not None:
            return True
        now = time.monotonic()
        if now < self._next_lookup:
            return False
        self._next_lookup = now + PARAMS_LOOKUP_INTERVAL_S
        connected = self.connect_identified("params", self.rpc_keys, sndhwm=4)
        if connected is None:
            self.log.info("no parameter server registered yet")
            return False
        self.params, self.params_endpoint = connected
        return True

    def send_weights(self) -> None:
        """Publish the current weights: start their copy off the device (``WeightsCopy``:
        on the CPU at once) and send them when it is done (``send_copied_weights``)."""
        if not self.update.may_publish() or not self._connect_params():
            return
        if self.weights_copy.busy:  # the last copy is still on its way: these follow it
            self.publish_due = True
            return
        started = time.monotonic()
        self.publish_due = False
        self.published_at = started
        # min_version: after a resume, versions continue instead of starting again at 1.
        meta = {
            "updates": self.updates,
            "min_version": self.weights_version + 1,
            **self.update.weights_meta(),
            **M.policy_meta(self.policy),
            **({"resets": self.resets} if self.resets else {}),
        }
        self.weights_copy.start(self.online, meta)
        self.send_copied_weights()
        self.time_s["publish"] += time.monotonic() - started

    def send_copied_weights(self, wait: bool = False) -> None:
        """Send the weights whose copy off the device is done (``wait``: wait for it)."""
        copied = self.weights_copy.take(wait)
        if copied is None or self.params is None:
            return
        arrays, meta = copied
        if self.params.send(P.Message(P.WEIGHTS, meta=meta, arrays=arrays), block=False):
            self.weights_sent += 1
            if self._unacked_since is None:
                self._unacked_since = time.monotonic()

    def publish_if_due(self) -> None:
        """Send the weights held back by ``learner.publish_every_s`` once that time passed."""
        every = self.config.learner.publish_every_s
        if self.publish_due and time.monotonic() - self.published_at >= every:
            self.send_weights()

    def read_acks(self) -> None:
        if self.params is None:
            return
        while True:
            got = self.params.recv(block=False)
            if got is None:
                break
            if got[1].kind == P.ACK and isinstance(got[1].meta.get("version"), int):
                self.weights_version = got[1].meta["version"]
                self._unacked_since = None
                self._resent = False
                self.params_acked = True
                self.weights_acked += 1
            elif got[1].kind == P.CONTROL:
                self.on_control(got[1])
        self.ask_control()
        unacked_s = (
            time.monotonic() - self._unacked_since if self._unacked_since is not None else 0.0
        )
        if PARAMS_RESEND_S < unacked_s <= PARAMS_ACK_TIMEOUT_S and not self._resent:
            self._resent = True
            self.send_weights()
        if unacked_s > PARAMS_ACK_TIMEOUT_S:
            # The parameter server restarted elsewhere or died: find it again.
            self.log.warning(
                "parameter server %s stopped answering; looking it up again", self.params_endpoint
            )
            self.close_channel(self.params)
            self.params = None
            self._unacked_since = None
            self._resent = False

    def on_control(self, msg: P.Message) -> None:
        """The league's resets and the pbt role's newest exploit of our policy; a malformed
        count is dropped and counted."""
        try:
            resets = M.reset_count(msg.meta)
        except P.ProtocolError as exc:
            assert self.params is not None
            self.params.drop(msg.sender or "?", str(exc))
            return
        if resets > self.resets:
            self.reset(resets)
        if "exploit" in msg.meta and self.config.pbt.members:
            self.on_exploit(msg.meta["exploit"])

    def ask_control(self) -> None:
        """GET_CONTROL once per ``CONTROL_POLL_S`` in a run whose league or PBT role may
        reset or exploit this learner's policy, once params has acked our weights."""
        if not (self.config.roles.league or self.config.pbt.members) or not self.params_acked:
            return
        now = time.monotonic()
        if self.params is None or now < self._next_control:
            return
        self._next_control = now + CONTROL_POLL_S
        self.params.send(P.Message(P.GET_CONTROL, meta=M.policy_meta(self.policy)), block=False)

    def reset(self, resets: int) -> None:
        """The league reset our player: back to the update's weights and optimizer before its
        first step."""
        if not self.initial_state:
            self.log.warning(
                "reset %d asked of %s, which no league resets: ignored", resets, self.policy
            )
            self.resets = resets
            return
        # Weights and optimizer restart; counters go on (a PPO round already trained stays
        # trained, so rollouts of the weights before the reset are not trained on again).
        counters = {k: v for k, v in self.update.state_dict().items() if isinstance(v, int)}
        self.update.load_state_dict({**copy.deepcopy(self.initial_state), **counters})
        self.resets = resets
        self.log.info(
            "%s reset to its initial weights (reset %d, after weights v%d)",
            self.policy,
            resets,
            self.weights_version,
        )
        self.send_weights()

    def on_exploit(self, meta: Any) -> None:
        """The pbt role's instruction from params' CONTROL: applied once per seq
        (``exploit``); a malformed one is logged and ignored."""
        try:
            instruction = exploit_instruction(meta, self.config)
        except P.ProtocolError as exc:
            self.log.warning("exploit instruction refused: %s", exc)
            return
        if instruction["policy"] != self.policy or instruction["seq"] <= self.pbt_seq:
            return
        self.pbt_seq = instruction["seq"]
        if self.exploit(instruction["source"], instruction["hyperparameters"]):
            self.send_weights()

    def exploit(self, source: str, hyperparameters: dict[str, float]) -> bool:
        """PBT: take the weights and optimizer state of ``source``'s learner's newest
        checkpoint (exactly as saved; this learner's counters stay its own), then set
        ``hyperparameters``. False, with a warning, when there is no such checkpoint or it
        does not fit this learner's model (nothing changed then)."""
        cfg = self.config
        index = next(
            (i for i in range(cfg.roles.learners) if cfg.learner_policy(i) == source), None
        )
        if index is None or cfg.checkpoint.dir is None:
            self.log.warning("exploit of %s: no learner or checkpoint.dir: ignored", source)
            return False
        path = checked_file(cfg.checkpoint.dir, f"learner-{index}.pt", self.files_root)
        if not path.is_file():
            self.log.warning("exploit of %s: %s does not exist: ignored", source, path)
            return False
        setter = getattr(self.update, "set_hyperparameters", None)
        if setter is None:
            self.log.warning("exploit: %s cannot set hyperparameters: ignored", cfg.algo)
            return False
        self.settle()
        own = self.update.state_dict()
        counters = {k: v for k, v in own.items() if isinstance(v, int)}
        kept = copy.deepcopy(own)
        try:
            state = load_checkpoint_file(path)
            self.update.load_state_dict({**state, **counters})
        except (RoleError, RuntimeError, KeyError, ValueError) as exc:
            self.update.load_state_dict(kept)
            self.log.warning("exploit of %s from %s refused: %s", source, path, exc)
            return False
        setter(hyperparameters)
        self.pbt_exploits += 1
        self.log.info(
            "%s exploited %s (%s, its update %s); hyperparameters %s",
            self.policy,
            source,
            path.name,
            state.get("updates"),
            hyperparameters,
        )
        return True

    # --- updates ----------------------------------------------------------------------

    def train(self) -> None:
        """Train on what the update holds; count, publish priorities and weights. A result
        checked on the device waits as ``unchecked`` until the next update was started."""
        try:
            result = self.update.train(self.weights_version)
        except NonFiniteLossError as exc:
            self.settle()
            self.on_non_finite(exc, exc.source or "a batch", self.last_sender)
            return
        except RuntimeError as exc:  # torch rejected the batch: a peer's bug, not ours
            self.settle()
            self.input.drop(self.last_sender, f"the update failed on it: {exc}")
            return
        self.settle()  # the update before: done by now, or soon (this one queued behind it)
        if result is None:
            return
        if result.finite is not None:
            self.unchecked = (result, self.last_sender)
            return
        self.count(result)

    def settle(self) -> None:
        """Count the update whose finiteness the device checked (``UpdateResult.finite``),
        or drop its batch as non-finite: reading the flag waits for that update only."""
        if self.unchecked is None:
            return
        (result, sender), self.unchecked = self.unchecked, None
        assert result.finite is not None
        if bool(result.finite):
            self.count(result)
            return
        loss = float(result.loss)
        self.on_non_finite(NonFiniteLossError(loss, float("nan")), "a batch", sender)

    def count(self, result: UpdateResult) -> None:
        """A finite update: count it, send its priorities, publish the weights when due."""
        self.non_finite_in_a_row = 0
        before = self.updates
        self.updates += result.updates
        self.samples_trained += result.samples
        self.last_loss = result.loss
        if result.priorities is not None and self.priority_pub is not None:
            p = result.priorities
            self.priority_pub.send(
                P.Message(
                    P.PRIORITIES,
                    arrays={
                        "key": np.ascontiguousarray(p.keys),
                        "priority": np.ascontiguousarray(p.priorities, dtype=np.float32),
                    },
                ),
                topic=P.priority_topic(p.shard),
                block=False,
            )
        interval = self.config.learner.publish_interval
        if result.publish:  # the update needs them out now (PPO's next round)
            self.send_weights()
        elif self.updates // interval > before // interval:
            self.publish_due = True
            self.publish_if_due()

    def on_non_finite(self, exc: NonFiniteLossError, source: str, sender: str) -> None:
        """A NaN/inf loss, raised before the optimizer step (or the step skipped on the
        device), so the weights are intact. One such batch (e.g. huge values from a peer,
        ``sender``) is dropped; a run of them means we diverged: stop cleanly, keeping the
        last good checkpoint and published weights."""
        self.non_finite_in_a_row += 1
        self.non_finite_batches += 1
        if self.non_finite_in_a_row < MAX_NON_FINITE_IN_A_ROW:
            self.input.drop(sender, f"{source} gives a {exc}")
            return
        self.diverged = True
        raise RoleError(
            f"{self.id}: {exc} at update {self.updates + 1} on {source}; "
            f"stopping without applying it (published weights v{self.weights_version} intact)"
        ) from None

    # --- checkpoints ------------------------------------------------------------------

    def checkpoint_path(self) -> Path | None:
        return self.checkpoint_file(".pt")

    def save_checkpoint(self) -> None:
        if self.checkpoint is None or self.checkpoint_unread:
            return
        self.settle()  # the counters of the last update, which the device checked
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        state = {
            **self.update.state_dict(),
            "updates": self.updates,
            "samples_trained": self.samples_trained,
            "weights_version": self.weights_version,
            "resets": self.resets,
            "pbt_seq": self.pbt_seq,
            "torch_rng": torch.get_rng_state(),
            "time": time.time(),
        }
        # A crash or a power cut mid-write leaves the old one (see zrl.utils.durable).
        with atomic_write(self.checkpoint) as f:
            torch.save(state, f)
        self.checkpoints += 1

    def load_checkpoint(self) -> None:
        """Resume from ``self.checkpoint`` if there is one. One that cannot be loaded stops
        the role (RoleError naming it; a restart refuses it again, so the run fails rather
        than train afresh) and stays as it is: nothing is saved over it."""
        if self.checkpoint is None or not self.checkpoint.is_file():
            return
        self.checkpoint_unread = True
        state = load_checkpoint_file(self.checkpoint)
        try:
            self.update.load_state_dict(state)
            self.updates = int(state["updates"])
            self.weights_version = int(state["weights_version"])
            self.resets = int(state.get("resets", 0))
            self.pbt_seq = int(state.get("pbt_seq", 0))
            torch.set_rng_state(state["torch_rng"])
        except Exception as exc:  # noqa: BLE001 - whatever does not fit, the file is not ours
            raise RoleError(
                f"{self.checkpoint} is not a checkpoint of this learner "
                f"({type(exc).__name__}: {str(exc)[:200]}); move it away to start afresh"
            ) from None
        self.resumed_from, self.resumed_version = self.updates, self.weights_version
        self.checkpoint_unread = False
        self.log.info(
            "resumed from %s: update %d, weights v%d",
            self.checkpoint,
            self.updates,
            self.weights_version,
        )

    def step(self) -> None:
        if self.checkpoint is not None and time.monotonic() >= self.next_checkpoint:
            self.next_checkpoint = time.monotonic() + self.config.checkpoint.interval
            self.save_checkpoint()
        self.read_acks()
        if not self.params_acked and self._unacked_since is None:
            self.send_weights()  # until the parameter server has our first version
        started = time.monotonic()
        if self.stepping_since is None:
            self.stepping_since = started
        copy_before = self.time_s["copy"]
        received = self.receive()
        trained_from = time.monotonic()
        copied = self.time_s["copy"] - copy_before
        waited = trained_from - started - copied
        self.time_s["wait"] += waited
        self.unreported_s["wait"] += waited
        self.unreported_s["copy"] += copied
        before = self.updates
        published, copying = self.time_s["publish"], self.time_s["copy"]
        self.train()
        # Less what the update's group took in (take_input) and published meanwhile.
        self.time_s["update"] += (
            time.monotonic()
            - trained_from
            - (self.time_s["publish"] - published)
            - (self.time_s["copy"] - copying)
        )
        if self.updates > before:
            self.report_input_time(self.updates - before)
        self.send_copied_weights()
        self.publish_if_due()
        if self.updates > before:
            self.waiting_since = None
        elif not received and self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def receive(self) -> int:
        """Hand what arrived to the update; the number of messages. From replay: one batch
        per step, waiting up to the input's 100 ms receive timeout (the shard samples the next
        meanwhile), or none where ``take_input`` took this step's in already. From the
        rollouts topic: what is queued, at most ``MAX_READS_PER_STEP``, else a 20 ms wait."""
        if self.batch_acks is not None:
            if self.taken_in:  # taken in while the update's group waited: this step's batch
                self.taken_in -= 1
                return 1
            got = self.input.recv()
            if got is None:
                return 0
            self.ack_batch(self.batch_acks, got[1])
            self.hand_over(got[1])
            return 1
        for received in range(MAX_READS_PER_STEP):
            got = self.input.recv(block=False)
            if got is None:
                if received == 0:
                    self.input.sock.poll(20)
                return received
            self.hand_over(got[1])
        return MAX_READS_PER_STEP

    def take_input(self) -> bool:
        """One replay batch that has arrived, acked and handed to the update, without
        waiting (an update's learner group calls it while a collective waits); False when
        none had arrived, or the input is the rollouts topic."""
        if self.batch_acks is None:
            return False
        got = self.input.recv(block=False)
        if got is None:
            return False
        self.ack_batch(self.batch_acks, got[1])
        self.hand_over(got[1])
        self.taken_in += 1
        return True

    def hand_over(self, msg: P.Message) -> None:
        """One message to the update; one it rejects is dropped and counted."""
        self.last_sender = msg.sender or "?"
        started = time.monotonic()
        try:
            self.update.receive(msg, self.weights_version)
        except P.ProtocolError as exc:
            self.input.drop(self.last_sender, str(exc))
        finally:
            self.time_s["copy"] += time.monotonic() - started

    def report_input_time(self, updates: int) -> None:
        """``wait_ms`` and ``copy_ms``: the input's time since the last update, per gradient
        step of this one (comparable with the update's ``update_ms``)."""
        self.train_stats.add(
            **{f"{part}_ms": s * 1e3 / updates for part, s in self.unreported_s.items()}
        )
        self.unreported_s = dict.fromkeys(self.unreported_s, 0.0)

    def time_shares(self) -> dict[str, float]:
        """Each of ``TIME_PARTS`` as a share of the learner's time since its first step, and
        the seconds themselves (``<part>_s``, ``stepping_s``: two heartbeats give the shares
        of the time between them, without the start-up)."""
        if self.stepping_since is None:
            return {}
        total = max(time.monotonic() - self.stepping_since, 1e-9)
        shares = {f"{part}_share": round(s / total, 3) for part, s in self.time_s.items()}
        seconds = {f"{part}_s": round(s, 3) for part, s in self.time_s.items()}
        return {**shares, **seconds, "stepping_s": round(total, 3)}

    @staticmethod
    def ack_batch(batch_acks: Channel, msg: P.Message) -> None:
        """Credit back to the shard: acked on receipt, before training, so the shard samples
        the next batch while this one trains. A malformed batch is acked too: it left the
        pipe all the same."""
        shard = msg.meta.get("shard")
        if isinstance(shard, str) and shard.startswith("replay-"):
            batch_acks.send(
                P.Message(P.ACK, meta={"seq": msg.seq}),
                topic=P.batch_ack_topic(shard),
                block=False,
            )

    def teardown(self) -> None:
        if not self.diverged:
            self.settle()  # the last update checked on the device
        if not self.diverged:
            self.send_copied_weights(wait=True)  # a copy still on its way
        if self.publish_due and not self.diverged:
            self.send_weights()  # held back by publish_every_s: the last updates go out too
            self.send_copied_weights(wait=True)
        # A graceful stop resumes exactly where it stopped; a diverged learner keeps the last
        # good checkpoint instead of overwriting it.
        if self.checkpoint is not None and not self.diverged:
            self.save_checkpoint()
        if self.checkpoint is not None or self.updates:
            summary = self.update.summary()
            if summary:
                self.log.info("%s: %s", self.id, summary)
        self.update.close()

    def train_info(self) -> dict[str, float]:
        return self.update.train_info()

    def heartbeat_info(self) -> dict[str, Any]:
        loss = float(self.last_loss)  # a tensor on the device: read here, once a beat
        info: dict[str, Any] = {
            "updates": self.updates,
            "samples_trained": self.samples_trained,
            "weights_version": self.weights_version,
            "loss": round(loss, 5) if np.isfinite(loss) else None,
            "checkpoints": self.checkpoints,
            "weights_sent": self.weights_sent,
            "weights_acked": self.weights_acked,
            "non_finite_batches": self.non_finite_batches,
            "device": str(self.device),
            **self.rpc_keys.info(),
        }
        if self.resumed_from is not None:
            info["resumed_from"] = self.resumed_from
            info["resumed_version"] = self.resumed_version
        if len(self.config.policies) > 1:
            info["policy"] = self.policy
            info["resets"] = self.resets
        if self.config.pbt.members:
            info["pbt_seq"] = self.pbt_seq
            info["pbt_exploits"] = self.pbt_exploits
            hyperparameters = getattr(self.update, "hyperparameters", None)
            if hyperparameters is not None:
                info["hyperparameters"] = {
                    k.rsplit(".", 1)[-1]: float(f"{v:.4g}") for k, v in hyperparameters().items()
                }
        info.update(self.time_shares())
        if self.waiting_since is not None:
            info["waiting_for_batches_s"] = round(time.monotonic() - self.waiting_since, 1)
        info.update(self.update.heartbeat_info())
        return info
