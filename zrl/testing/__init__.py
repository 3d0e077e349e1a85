"""Test harness for zrl and for code built on it (shipped with the package, like
``acme.testing``). Nothing here imports pytest; the fixtures that wrap it live in the tests'
``conftest.py``.

- :mod:`zrl.testing.probes`: ``wait_for`` and ``settle``; ``wait_subscribed`` and
  ``wait_for_subscriber``, which wait for a PUB/SUB subscription instead of sleeping.
- :mod:`zrl.testing.inproc`: ``InProc``, a broker and roles in threads of the test's process,
  with the test's own sockets; ``collect`` and ``collect_acking`` to receive on them.
- :mod:`zrl.testing.processes`: real ``zrl`` processes: ``start_zrl``, ``run_zrl``,
  ``zrl_processes`` (leak checks), ``kill_pids`` (cleanup by PID), ``run_broker_address``,
  ``zrl_status_json``, ``status_rows``, ``REPO``.
- :mod:`zrl.testing.fakes`: ``Rpc`` (a learner's rpc to the parameter server), ``FakeClock``
  (a clock the test moves), ``trajectory`` and ``as_message`` (an actor's experience).

Import from the submodules; this package imports none of them (``inproc`` pulls in the broker
and the roles).
"""
