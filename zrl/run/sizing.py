"""What ``roles.actors: auto`` means: the actors that fill the cores of the head's host.

The head (``zrl run``, ``zrl start broker``) resolves it before anything starts, so the run
directory's config.yaml and the spec every role gets from the broker carry a number.

The rule: the head's host has C cores (those this process may run on, ``machine_size``). The
broker and every other role placed on it take a share of them, rounded up as a whole:

- the broker: half a core;
- a learner on a GPU: half a core (it feeds the GPU); on the CPU: ``learner.torch_threads``;
- a replay shard: half a core;
- params, the evaluator, the league: a quarter of a core each;
- an inference role (``roles.inference``): one core when its device is a GPU (it receives,
  joins and answers every actor's observations), ``inference.torch_threads`` on the CPU.

Actors here = max(1, C - that), each stepping its ``env.num_envs`` envs on its core; the
actors that ``hosts`` place elsewhere come on top. The shares are what a profile of Pong APPO
found on a 16-core GPU host (learner on the GPU 56 % of a core, a replay shard 32 %, params
7 %, the broker 50 %), where 14 actors kept 15 of the 16 cores busy: this rule gives 14 there.

A learner with ``learner.device: auto`` counts as on a GPU when this host shows an NVIDIA GPU
(``/proc/driver/nvidia/gpus``) that ``CUDA_VISIBLE_DEVICES`` does not hide: torch itself is
not imported here, as the head leaves its start-up CPU to the roles.

No sockets, no torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from zrl.config.experiment import ExperimentConfig, config_from_dict, machine_size

BROKER_CORES = 0.5
LEARNER_GPU_CORES = 0.5
"""A learner whose update runs on a GPU (its CPU work: the input path and the weights)."""
REPLAY_CORES = 0.5
LIGHT_ROLE_CORES = 0.25
"""params, the evaluator, the league."""
INFERENCE_GPU_CORES = 1.0
"""An inference role whose forwards run on a GPU."""
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_visible() -> bool:
    """Whether this host shows an NVIDIA GPU that ``CUDA_VISIBLE_DEVICES`` does not hide."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    try:
        return any(NVIDIA_GPUS.iterdir())
    except OSError:
        return False


@dataclass(frozen=True)
class ActorSizing:
    """How many actors ``roles.actors: auto`` gives, and why."""

    cores: int
    """The head host's cores."""
    reserved: int
    """Cores left to the broker and the other roles placed here."""
    actors_here: int
    actors_elsewhere: int
    """Actors that ``hosts`` place on other hosts."""
    learner_on_gpu: bool
    others: str
    """The roles that take the reserved cores, in words."""

    @property
    def actors(self) -> int:
        return self.actors_here + self.actors_elsewhere

    def describe(self) -> str:
        """The one line ``zrl run`` prints."""
        elsewhere = (
            f" + {self.actors_elsewhere} placed on other hosts" if self.actors_elsewhere else ""
        )
        return (
            f"roles.actors: auto -> {self.actors}: {self.actors_here} here{elsewhere} "
            f"({self.cores} cores less {self.reserved} for {self.others})"
        )


def size_actors(
    cfg: ExperimentConfig, cores: int | None = None, gpu: bool | None = None
) -> ActorSizing:
    """The actors ``roles.actors: auto`` gives ``cfg`` on a host of ``cores`` cores (default:
    this one's), ``gpu``: whether a learner with ``learner.device: auto`` is on a GPU
    (default: ``gpu_visible()``); see the module docstring."""
    cores = cores if cores is not None else machine_size()[0]

    def on_gpu_for(device: str) -> bool:
        return device.startswith("cuda") or (
            device == "auto" and (gpu if gpu is not None else gpu_visible())
        )

    on_gpu = on_gpu_for(cfg.learner.device)

    def here(key: str) -> int:
        return int(getattr(cfg.roles, key)) - sum(h.roles.get(key, 0) for h in cfg.hosts)

    learners, replay, inference = here("learners"), here("replay"), here("inference")
    light = here("params") + here("evaluator") + here("league")
    learner_cores = LEARNER_GPU_CORES if on_gpu else float(cfg.learner.torch_threads)
    inference_on_gpu = on_gpu_for(cfg.inference.device)
    inference_cores = (
        INFERENCE_GPU_CORES if inference_on_gpu else float(cfg.inference.torch_threads)
    )
    share = BROKER_CORES + learners * learner_cores + replay * REPLAY_CORES
    share += inference * inference_cores
    reserved = math.ceil(share + light * LIGHT_ROLE_CORES)
    parts = ["the broker"]
    if learners:
        where = "GPU" if on_gpu else "CPU"
        parts.append(f"{learners} learner{'s' * (learners > 1)} on the {where}")
    if replay:
        parts.append(f"{replay} replay shard{'s' * (replay > 1)}")
    if inference:
        where = "GPU" if inference_on_gpu else "CPU"
        parts.append(f"{inference} inference role{'s' * (inference > 1)} on the {where}")
    parts += [key for key in ("params", "evaluator", "league") if here(key)]
    return ActorSizing(
        cores=cores,
        reserved=reserved,
        actors_here=max(1, cores - reserved),
        actors_elsewhere=sum(h.roles.get("actors", 0) for h in cfg.hosts),
        learner_on_gpu=on_gpu,
        others=", ".join(parts),
    )


def resolve_auto_roles(
    cfg: ExperimentConfig, cores: int | None = None, gpu: bool | None = None
) -> tuple[ExperimentConfig, ActorSizing | None]:
    """``cfg`` with ``roles.actors: auto`` replaced by its number (``size_actors``), checked
    again as a whole (ConfigError if the number breaks a rule), and the sizing; ``cfg`` itself
    and None when it has no auto count."""
    if cfg.roles.actors != "auto":
        return cfg, None
    sizing = size_actors(cfg, cores, gpu)
    data = cfg.model_dump(mode="json")
    data["roles"]["actors"] = sizing.actors
    return config_from_dict(data), sizing
