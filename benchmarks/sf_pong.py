"""Sample Factory 2.1.1 APPO on PongNoFrameskip-v4, for ``benchmarks/atari.py`` and gpu_host.py.

Runs in Sample Factory's own virtual environment (gymnasium 0.29), never in zrl's: build it
with ``python benchmarks/atari.py --build-sf-venv`` (``atari.py`` calls this file with that
venv's Python). Its Atari defaults (``sf_examples.atari``: Nature CNN ``convnet_atari``, the
SB3/CleanRL wrappers, PPO loss with GAE) with ``--async_rl=True``, learner and inference on
``--device`` (``cpu``, the default, or ``gpu``), plus the settings given here. Writes one JSON
object a line to ``--out`` (``sf_runner.py`` says which); ``env_frames`` counts the frameskip
(4): ``samples_trained * 4``.
"""

from __future__ import annotations

import sys

# ale-py 0.12 registers its envs through gymnasium >= 1.0's plugin hook only; Sample Factory
# needs gymnasium < 1.0. Register them here, at import: Sample Factory's processes are started
# with "spawn" and import this (main) module again, and its env-info probe makes an env in one.
from ale_py.registration import register_v0_v4_envs
from sf_runner import common_argv, common_parser, run_sample_factory

register_v0_v4_envs()


def main() -> int:
    args = common_parser(__doc__.splitlines()[0], "pong_appo").parse_args()
    from sf_examples.atari.train_atari import parse_atari_args, register_atari_components

    register_atari_components()
    argv = common_argv(args, "atari_pong")
    # the Nature CNN (also its Atari default)
    argv += ["--encoder_conv_architecture=convnet_atari", *args.sf_args]
    # The full-game score (RecordEpisodeStatistics sits outside the reward clipping).
    return run_sample_factory(
        args.out,
        argv,
        parse_atari_args,
        reward_keys=("RecordEpisodeStatistics_reward", "reward"),
        length_keys=("RecordEpisodeStatistics_len", "len"),
    )


if __name__ == "__main__":
    sys.exit(main())
