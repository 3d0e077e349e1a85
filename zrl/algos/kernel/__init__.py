"""The learning kernel: what several algorithm packages share, below them all.

An algorithm package (``zrl/algos/<name>/``) imports the kernel, the API (``zrl.algos.api``)
and the layers below ``zrl.algos``, never another algorithm package (the import-linter
contracts in ``pyproject.toml``); the kernel imports no algorithm package. Its modules:

- ``returns``: discounted returns and GAE (numpy); ``vtrace``: V-trace targets and the
  learner's forward pass over unrolls; ``policy_gradient``: the PPO and A2C losses and the
  gradient reduction; ``value_normalizer``: value-target normalization.
- ``optim``: Adam and the optimizer steps that refuse NaN/inf.
- ``batches``: batches on their way to the learner's device; ``batch_update``: the
  ``train`` of the updates that take one step per replay batch; ``unrolls``: the learner
  side of the updates that train on whole unrolls (IMPALA, APPO).
- ``policy_learners``: a learner update's place in its policy's learner group (the group
  itself is ``zrl.distributed``'s).
- ``sampling``: the actor policies of the actor-critics (categorical, recurrent, Gaussian).

Importing this package imports nothing: each module is imported by name.
"""
