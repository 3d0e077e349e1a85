"""The broker: the one well-known address of a zrl experiment, one module per job.

- ``broker``: ``Broker``, which binds every socket (base address tcp://H:P; see
  ``broker_endpoints`` for the layout) and wires the parts; ``run()`` serves the registry.
- ``registry``: ROUTER ``registry`` (P): HELLO/WELCOME/REFUSED, HEARTBEAT, BYE, LOOKUP,
  STATUS; the role table, its caps and the liveness checks.
- ``topic_bus``: XSUB ``topics_in`` (P+1), XPUB ``topics_out`` (P+2) and XPUB
  ``topics_bulk_out``: the Python forwarder of the topic bus, with its two lanes.
- ``devices``: per stream S, PULL ``S_in`` / PUSH ``S_out``: ``zmq.proxy_steerable`` in C,
  one thread each, and the control sockets that stop them.
- ``limits``: the bounds on what peers send (ids, fields, heartbeat info, counters) and
  the rate-limited log of what the broker drops.
"""
