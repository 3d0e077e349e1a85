"""Fixtures of the role tests: ``rpc``, a learner's connection to the ``params`` fixture's
parameter server (each module defines ``params`` with the config it tests), registered as
``learner-0`` so that params takes its weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zrl.roles.params import ParameterServer
from zrl.testing.fakes import Rpc


@pytest.fixture
def rpc(zmq_ctx, params: ParameterServer) -> Iterator[Rpc]:
    r = Rpc(zmq_ctx, params.rpc_endpoint, broker=params.broker)
    try:
        yield r
    finally:
        r.close()
