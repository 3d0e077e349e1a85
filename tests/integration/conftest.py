"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.integration.netns import Hosts, netns_available


@pytest.fixture
def make_hosts() -> Iterator[Callable[[int], Hosts]]:
    """Hosts(n), cleaned up (processes by PID, then namespaces) however the test ends."""
    ok, reason = netns_available()
    if not ok:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    made: list[Hosts] = []

    def make(n: int) -> Hosts:
        h = Hosts(n)
        made.append(h)
        h.__enter__()
        return h

    try:
        yield make
    finally:
        for h in made:
            h.close()
