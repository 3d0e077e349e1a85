"""Sample Factory 2.1.1 APPO on a VizDoom scenario (``doom_basic`` by default), for
``benchmarks/vizdoom_vs_sf.py``.

Runs in Sample Factory's own virtual environment (gymnasium 0.29), never in zrl's: build it
with ``python benchmarks/atari.py --build-sf-venv`` (vizdoom comes from the system site
packages the venv sees). Sample Factory's VizDoom defaults (``sf_examples.vizdoom``:
``doom_override_defaults``: 128x72 RGB frames, frameskip 4, its ``convnet_simple`` encoder,
its reward scaling of the scenario) with ``--async_rl=True`` and the settings given here.
Writes one JSON object a line to ``--out`` (``sf_runner.py`` says which); an episode's reward
is the scenario's own return (Sample Factory's ``reward`` stat with its scaling undone).
"""

from __future__ import annotations

import sys

from sf_runner import common_argv, common_parser, run_sample_factory


def main() -> int:
    parser = common_parser(__doc__.splitlines()[0], "doom_basic_appo")
    parser.add_argument("--env", default="doom_basic", help="a Sample Factory doom env name")
    args = parser.parse_args()
    from sf_examples.vizdoom.doom.doom_utils import doom_env_by_name
    from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_components

    register_vizdoom_components()
    argv = [*common_argv(args, args.env), *args.sf_args]
    # Its episodic "reward" is scaled by the scenario's reward_scaling (basic: 0.01).
    scale = doom_env_by_name(args.env).reward_scaling
    return run_sample_factory(args.out, argv, parse_vizdoom_cfg, reward_scale=scale)


if __name__ == "__main__":
    sys.exit(main())
