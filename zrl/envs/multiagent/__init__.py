"""Multi-agent environments (PettingZoo) as the actor's vector env, and who plays the agents
that are not the learning policy's (``zrl.envs.multiagent.envs``,
``zrl.envs.multiagent.opponents``)."""
