"""``zrl run``: the local supervisor and its parts, one module per job; and ``zrl host``.

- ``supervisor``: ``Supervisor``, which wires the parts together and runs the monitor loop.
- ``monitor``: what the head hears (a SUB on the topic bus, STATUS polls of the broker) and
  the STOP_RUN that ends the run everywhere.
- ``pool``: the broker and the local roles (processes forked from the zygote, plain
  processes, or threads with ``--inproc``): started, restarted with back-off, stopped.
- ``children``: the pieces ``pool`` and ``host_agent`` share (a child, the zygote's client,
  launching, the restart policy, stopping in order).
- ``host_agent``: ``zrl host``, one host's roles started, restarted and stopped with the same
  pieces of ``children``, by an agent that is a role of the experiment itself.
- ``placement``: the broker's addresses, which roles run where, the ``zrl start`` lines for
  other hosts, and the security policy (no reachable broker without keys).
- ``rundir``: the run directory, summary.json and the final model.pt.
- ``aggregator``: the roles' metrics turned into the figures of the status and progress.csv.
- ``stop_rule``: the target on evaluations, confirmed by the evaluator's heartbeat, and the
  limits.
"""
