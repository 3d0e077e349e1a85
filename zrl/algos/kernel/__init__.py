"""The learning kernel: what several algorithm packages share, below them all.

An algorithm package (``zrl/algos/<name>/``) imports the kernel, the API (``zrl.algos.api``)
and the layers below ``zrl.algos``, never another algorithm package; the kernel imports no
algorithm package (the import-linter contracts in ``pyproject.toml``). Its modules:

- math: ``returns`` (discounted returns and GAE, numpy), ``vtrace`` (V-trace targets and the
  learner's forward pass over unrolls: IMPALA, APPO), ``policy_gradient`` (the PPO and A2C
  losses, the gradient reduction of A3C), ``value_normalizer``, ``q_learning`` (the Huber
  loss, Polyak averaging, n-step double-Q targets over sequences and the burn-in unroll:
  R2D2, QMIX), ``optim`` (Adam and the optimizer steps that refuse NaN/inf).
- the learner side: ``batches`` (batches on their way to the learner's device),
  ``batch_update`` (the ``train`` of the updates that take one step per replay batch),
  ``unrolls`` (the updates that train on whole unrolls: IMPALA, APPO), ``continuous`` (what
  Ape-X DDPG's and SAC's policies and updates share), ``policy_learners`` (an update's place
  in its policy's learner group; the group itself is ``zrl.distributed``'s).
- the actor side: ``sampling`` (the actor-critics' policies: categorical, recurrent,
  Gaussian), ``exploration`` (Ape-X's epsilons, the epsilon-greedy policy: Ape-X DQN, R2D2),
  ``sequences`` (cutting R2D2's and recurrent QMIX's sequences).
- ``records``: the records of the algorithm families that share a wiring (IMPALA and APPO;
  Ape-X DDPG and SAC) and their shared config checks; light, for the packages' ``__init__``.

Importing this package imports nothing: each module is imported by name.
"""
