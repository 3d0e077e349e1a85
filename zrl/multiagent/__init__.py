"""Multi-agent environments (PettingZoo) as the actor's vector env, and who plays the agents
that are not the learning policy's (``zrl.multiagent.envs``, ``zrl.multiagent.opponents``)."""
