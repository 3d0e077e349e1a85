"""What both ends of an experience path must agree on, below the replay and the algorithms.

- ``frames``: frame stacks out as single frames on the actor, back to stacks on the learner's
  device (and the episode-start rule the replay shard's frame table rebuilds them by).
- ``nstep``: the n-step transitions an actor and a replay shard cut from the same steps.
"""
