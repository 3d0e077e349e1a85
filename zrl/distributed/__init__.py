"""The learner group: several learners of one policy as a ``torch.distributed`` process
group, formed through the broker, and the collectives over it. It knows nothing of learning
(what a learner update does with its group is ``zrl.algos.kernel.policy_learners``).

- ``group_store``: rank 0's rendezvous store, authenticated and bounded.
- ``learner_group``: rendezvous, generations and re-forming, the gradient mean and the other
  collectives.
"""
